"""`QuiverVectorStore`: a LlamaIndex vector store on a quiver index.

Each operation is written once, as a plan of client calls (see `quiver_vectors.string_ids`), and
carried out by `string_ids.run` on the sync `Client` or by `string_ids.arun` on the
`AsyncClient`: the async methods are native asyncio, not threads (only a
store given no `AsyncClient` runs them in a thread, on its sync client).

A node's row holds its embedding, and in its metadata:

- what LlamaIndex's `node_to_metadata_dict` makes: the whole node as JSON
  (``_node_content``, text included, so `stores_text` is true), its class
  (``_node_type``), and its ``ref_doc_id`` (also as ``doc_id`` and
  ``document_id``), by which `delete` finds a document's nodes;
- ``_li_id``: the node id, by which rows are found (see `quiver_vectors.string_ids`);
- the node's metadata values that quiver stores and filters natively
  (strings, booleans, 64-bit integers, finite floats, non-empty lists of
  strings), so filters can use them. Other values (None, dicts, empty lists,
  lists of numbers) are not filterable; they come back all the same, from
  ``_node_content``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict
from quiver_vectors import AsyncClient, Client, Hit
from quiver_vectors import string_ids as S

from ._filters import QuiverFilter, all_of, to_quiver

ID_KEY = "_li_id"
REF_DOC_KEY = "ref_doc_id"

#: Candidates fetched per result for an MMR query, unless the query says
#: otherwise (``mmr_prefetch_factor=``): enough choice for diversity at a
#: few times a plain search's reply.
MMR_PREFETCH_FACTOR = 4

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1


def similarity(metric: str) -> Callable[[Optional[float]], float]:
    """A query result's similarity from the server's score: larger is nearer.

    cosine and ip: the score itself (the cosine similarity, the inner
    product), as LlamaIndex's own stores report them. Distances d (every other
    metric, l2 squared): 1 / (1 + d), in (0, 1]; an infinite distance is 0.
    """
    if metric in ("cosine", "ip"):
        return lambda s: -math.inf if s is None else s
    return lambda d: 0.0 if d is None or math.isinf(d) else 1.0 / (1.0 + d)


def filterable(value: Any) -> bool:
    """True for a metadata value quiver stores natively, worth a top-level entry for filters."""
    if isinstance(value, (str, bool)):
        return True
    if isinstance(value, int):
        return _INT_MIN <= value <= _INT_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        # [] is left out with None, so that IS_EMPTY is "missing or empty string".
        return bool(value) and all(isinstance(v, str) for v in value)
    return False


class QuiverVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store on a quiver index (exact k-nearest-neighbour search).

    Args:
        index_name: the quiver index (``[a-z0-9-]``, 3 to 32 characters),
            created on the first add if missing, with the embeddings'
            dimensions and `metric`.
        client: a `quiver_vectors.Client` or `AsyncClient` (a store given only
            an `AsyncClient` serves only the async methods).
        aclient: an `AsyncClient`, beside a sync `client`.
        url, api_key: used when no client is given (default ``$QUIVER_URL``,
            ``$QUIVER_API_KEY``); the store makes both clients, and `close` /
            `aclose` close them.
        metric: the metric of an index the store creates (default
            ``"cosine"``); for an existing index, None takes its metric and any
            other value must match it.
        slot_hash, probes_max: how node ids become row ids (see `quiver_vectors.string_ids`;
            tests inject a hash with few values to force collisions).

    `query` takes `similarity_top_k`, `query_embedding`, `filters` (see
    `_filters` for the mapping), `node_ids`, `doc_ids` (ref doc ids), and mode
    DEFAULT or MMR (`mmr_threshold`).
    """

    stores_text: bool = True
    flat_metadata: bool = False
    index_name: str
    metric: Optional[str] = None
    p: Optional[float] = None
    probes_max: int = S.PROBES_MAX

    _client: Optional[Client] = PrivateAttr(default=None)
    _aclient: Optional[AsyncClient] = PrivateAttr(default=None)
    _owns_clients: bool = PrivateAttr(default=False)
    _slot_hash: Optional[S.SlotHash] = PrivateAttr(default=None)
    _index_metric: Optional[str] = PrivateAttr(default=None)  # known once the index is

    def __init__(
        self,
        index_name: str = "llama-index",
        *,
        client: Union[Client, AsyncClient, None] = None,
        aclient: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        metric: Optional[str] = None,
        p: Optional[float] = None,
        slot_hash: S.SlotHash = S.blake2b_slot,
        probes_max: int = S.PROBES_MAX,
        **kwargs: Any,
    ) -> None:
        S.check_store(index_name, probes_max)
        super().__init__(index_name=index_name, metric=metric, p=p, probes_max=probes_max, **kwargs)
        self._slot_hash = slot_hash
        self._client, self._aclient, self._owns_clients = S.clients(client, aclient, url, api_key)

    @classmethod
    def class_name(cls) -> str:
        return "QuiverVectorStore"

    # -- Clients ---------------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The sync client (raises if the store was given only an `AsyncClient`)."""
        if self._client is None:
            raise RuntimeError(
                "this QuiverVectorStore has only an AsyncClient: use the async methods, or pass a Client too"
            )
        return self._client

    @property
    def aclient(self) -> Optional[AsyncClient]:
        return self._aclient

    def close(self) -> None:
        """Closes the sync client, if the store made it."""
        if self._owns_clients and self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Closes both clients, if the store made them."""
        if self._owns_clients:
            if self._aclient is not None:
                await self._aclient.close()
            self.close()

    def _run(self, plan: "S.Plan[Any]") -> Any:
        return S.run(plan, self.client)

    async def _arun(self, plan: "S.Plan[Any]") -> Any:
        if self._aclient is None:
            # Given only a sync Client: its calls block, so they run in a
            # thread rather than on the event loop.
            return await asyncio.get_running_loop().run_in_executor(None, S.run, plan, self.client)
        return await S.arun(plan, self._aclient)

    # -- The index ---------------------------------------------------------------------------------

    def _ready(self, dimensions: Optional[int]) -> "S.Plan[bool]":
        """Whether the index exists, creating it when `dimensions` is given."""
        if self._index_metric is None:
            self._index_metric = yield from S.index_ready(self.index_name, dimensions, self.metric, self.p)
        return self._index_metric is not None

    # -- Writes ------------------------------------------------------------------------------------

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> List[str]:
        """Stores nodes with their embeddings; a node whose id exists replaces it. Returns the node ids.

        Raises `NotStoredError` naming any node the server refused (after
        storing the rest).
        """
        if not nodes:
            return []
        self._run(self._add_plan(nodes))
        return [n.node_id for n in nodes]

    async def async_add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> List[str]:
        """Async `add`."""
        if not nodes:
            return []
        await self._arun(self._add_plan(nodes))
        return [n.node_id for n in nodes]

    def _add_plan(self, nodes: Sequence[BaseNode]) -> "S.Plan[None]":
        ids = [n.node_id for n in nodes]
        vectors = np.asarray([n.get_embedding() for n in nodes], dtype=np.float64)
        if vectors.ndim != 2:
            raise ValueError(f"the nodes' embeddings are not all of one length (shape {vectors.shape})")
        rows = [self._row(n) for n in nodes]
        yield from self._ready(vectors.shape[1])
        yield from S.write(self.index_name, ID_KEY, ids, vectors, rows, self._slot_hash, self.probes_max)

    def _row(self, node: BaseNode) -> Dict[str, Any]:
        stored = node_to_metadata_dict(node, remove_text=False, flat_metadata=self.flat_metadata)
        row = {k: v for k, v in stored.items() if filterable(v)}
        row[ID_KEY] = node.node_id
        return row

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Deletes every node of the document `ref_doc_id` (one durable write)."""
        self._run(self._delete_plan({REF_DOC_KEY: ref_doc_id}))

    async def adelete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Async `delete`."""
        await self._arun(self._delete_plan({REF_DOC_KEY: ref_doc_id}))

    def delete_nodes(
        self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None, **delete_kwargs: Any
    ) -> None:
        """Deletes the nodes with these ids that `filters` matches (no ids: every node it matches; neither: all)."""
        self._run(self._delete_plan(self._nodes_filter(node_ids, filters)))

    async def adelete_nodes(
        self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None, **delete_kwargs: Any
    ) -> None:
        await self._arun(self._delete_plan(self._nodes_filter(node_ids, filters)))

    def clear(self) -> None:
        """Deletes every node of the store (rows the store did not write stay)."""
        self._run(self._delete_plan({ID_KEY: {"$exists": True}}))

    async def aclear(self) -> None:
        await self._arun(self._delete_plan({ID_KEY: {"$exists": True}}))

    def _delete_plan(self, filter: QuiverFilter) -> "S.Plan[int]":
        if not (yield from self._ready(None)):
            return 0
        return (yield S.Call("delete_by_filter", self.index_name, filter))

    @staticmethod
    def _nodes_filter(node_ids: Optional[List[str]], filters: Optional[MetadataFilters]) -> QuiverFilter:
        by_id = None if node_ids is None else {ID_KEY: {"$in": list(node_ids)}}
        return all_of(by_id, to_quiver(filters)) or {ID_KEY: {"$exists": True}}

    # -- Reads -------------------------------------------------------------------------------------

    def get_nodes(
        self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None
    ) -> List[BaseNode]:
        """The nodes with these ids that `filters` matches, in the order of `node_ids` (else by row)."""
        return self._run(self._get_plan(node_ids, filters))

    async def aget_nodes(
        self, node_ids: Optional[List[str]] = None, filters: Optional[MetadataFilters] = None
    ) -> List[BaseNode]:
        return await self._arun(self._get_plan(node_ids, filters))

    def _get_plan(self, node_ids: Optional[List[str]], filters: Optional[MetadataFilters]) -> "S.Plan[List[BaseNode]]":
        if node_ids is not None and not node_ids:
            return []
        if not (yield from self._ready(None)):
            return []
        rows = yield S.Call("scroll", self.index_name, filter=self._nodes_filter(node_ids, filters), with_vectors=True)
        nodes = {}
        for row in rows:
            node = metadata_dict_to_node(row.metadata)
            node.embedding = row.vector.tolist()
            nodes.setdefault(node.node_id, node)  # one per id, should a race have left two rows
        if node_ids is None:
            return list(nodes.values())
        return [nodes[i] for i in dict.fromkeys(node_ids) if i in nodes]

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The `similarity_top_k` nodes nearest to `query_embedding` among those the restrictions match."""
        return self._run(self._query_plan(query, kwargs))

    async def aquery(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        return await self._arun(self._query_plan(query, kwargs))

    def _query_plan(self, query: VectorStoreQuery, kwargs: Dict[str, Any]) -> "S.Plan[VectorStoreQueryResult]":
        mode = query.mode
        if mode not in (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR):
            raise NotImplementedError(f"query mode {mode.value!r}: quiver serves dense search (default) and mmr")
        if query.query_embedding is None:
            raise ValueError("a quiver query needs query_embedding")
        k = query.similarity_top_k
        # An empty node_ids or doc_ids is no restriction: LlamaIndex's retriever
        # sends node_ids=[] when it has none to give.
        filter = all_of(
            to_quiver(query.filters),
            {ID_KEY: {"$in": list(query.node_ids)}} if query.node_ids else None,
            {REF_DOC_KEY: {"$in": list(query.doc_ids)}} if query.doc_ids else None,
        )
        if k < 1 or not (yield from self._ready(None)):
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        mmr = mode == VectorStoreQueryMode.MMR
        fetch = k * int(kwargs.get("mmr_prefetch_factor", MMR_PREFETCH_FACTOR)) if mmr else k
        hits: List[Hit] = yield S.Call(
            "search", self.index_name, query.query_embedding, fetch, filter=filter, with_vectors=mmr
        )
        if mmr:
            return _mmr(query, hits, k)
        score = similarity(self._index_metric or "cosine")
        nodes = [metadata_dict_to_node(h.metadata) for h in hits]
        return VectorStoreQueryResult(
            nodes=nodes, similarities=[score(h.score) for h in hits], ids=[n.node_id for n in nodes]
        )


def _mmr(query: VectorStoreQuery, hits: List[Hit], k: int) -> VectorStoreQueryResult:
    if not hits:
        return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
    scores, order = get_top_k_mmr_embeddings(
        list(query.query_embedding or []),
        [h.vector.tolist() for h in hits],  # type: ignore[union-attr]
        similarity_top_k=k,
        embedding_ids=list(range(len(hits))),
        mmr_threshold=query.mmr_threshold,
    )
    nodes = [metadata_dict_to_node(hits[i].metadata) for i in order]
    return VectorStoreQueryResult(nodes=nodes, similarities=list(scores), ids=[n.node_id for n in nodes])
