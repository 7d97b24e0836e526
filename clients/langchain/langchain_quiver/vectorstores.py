"""`QuiverVectorStore`: a LangChain vector store on a quiver index.

Each operation is written once, as a plan of client calls (see `quiver_vectors.string_ids`), and
carried out by `string_ids.run` on the sync `Client` or by `string_ids.arun` on the
`AsyncClient`: the async methods are native asyncio, not threads (only a
store given no `AsyncClient` runs them in a thread, on its sync client).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance
from quiver_vectors import AsyncClient, Client, Hit
from quiver_vectors import string_ids as S

from . import _metadata as M

Filter = Dict[str, Any]

#: Metrics whose score is a similarity (larger is nearer); the others are distances.
_SIMILARITIES = ("cosine", "ip")


def relevance(metric: str) -> Callable[[Optional[float]], float]:
    """Maps a score of `metric` (as `similarity_search_with_score` returns it) to [0, 1], 1 nearest.

    - cosine: (1 + s) / 2.
    - ip: (1 + s) / 2, clipped to [0, 1]: exact for unit vectors, where the
      inner product is the cosine.
    - l2 (squared distance d): 1 - d / 4, clipped: for unit vectors d = 2 - 2
      cos, so this equals the cosine's relevance.
    - every other distance d: 1 / (1 + d).

    So for unit-length embeddings (most models') cosine, ip and l2 give the
    same relevance. An infinite distance (score None) is 0.
    """
    if metric in _SIMILARITIES:
        return lambda s: 0.0 if s is None else min(1.0, max(0.0, (1.0 + s) / 2.0))
    if metric == "l2":
        return lambda d: 0.0 if d is None else min(1.0, max(0.0, 1.0 - d / 4.0))
    return lambda d: 0.0 if d is None or math.isinf(d) else 1.0 / (1.0 + d)


class QuiverVectorStore(VectorStore):
    """A LangChain vector store on a quiver index (exact k-nearest-neighbour search).

    Args:
        embedding: the embeddings model.
        index_name: the quiver index (``[a-z0-9-]``, 3 to 32 characters). It is
            created on the first write if missing, with the dimensions of
            the vectors written and `metric`.
        client: a `quiver_vectors.Client` or `AsyncClient`. A store given
            only an `AsyncClient` serves only the async methods.
        async_client: an `AsyncClient`, beside a sync `client`.
        url, api_key: used when no client is given (default ``$QUIVER_URL``,
            ``$QUIVER_API_KEY``); the store then makes both clients and
            `close` / `aclose` close them.
        metric: the metric of an index the store creates (default
            ``"cosine"``); for an existing index, None takes its metric and any
            other value must match it.
        p: the exponent of the ``lp`` metric.
        slot_hash: ``(string id, probe) -> row id`` (see below); tests inject
            one with few values to force collisions.
        probes_max: row ids tried for a new document before giving up.

    Documents. Page content, the string id and the metadata are stored in the
    row's metadata: values quiver stores natively (strings, booleans, 64-bit
    integers, finite floats, lists of strings) as they are, so ``filter=``
    can use them; anything else as JSON under ``_lc_json``, restored on read.
    Documents come back equal to what went in.

    Ids. A document's string id is stored under ``_lc_id``; gets, deletes and
    overwrites find rows by a filter on it. A new document's integer row id is
    the first free probe of a 64-bit BLAKE2b hash of its id, written with
    ``insert`` so that a collision (or a concurrent writer) is refused by the
    server and the next probe tried. Two documents whose hashes collide are
    stored, found, overwritten and deleted independently. The package README
    and `quiver_vectors.string_ids` say what concurrent writers can and cannot
    do to this.

    Scores. `similarity_search_with_score` returns the server's score: the
    cosine similarity, the inner product, or the metric's distance (squared
    for l2). `similarity_search_with_relevance_scores` maps it to [0, 1] (see
    `relevance`).

    Filters are quiver filter dicts over the metadata, e.g.
    ``{"year": {"$gte": 2020}, "tags": {"$contains": "a"}}``.
    """

    def __init__(
        self,
        embedding: Embeddings,
        index_name: str = "langchain",
        *,
        client: Union[Client, AsyncClient, None] = None,
        async_client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        metric: Optional[str] = None,
        p: Optional[float] = None,
        slot_hash: S.SlotHash = S.blake2b_slot,
        probes_max: int = S.PROBES_MAX,
    ) -> None:
        S.check_store(index_name, probes_max)
        self.embedding = embedding
        self.index_name = index_name
        self.slot_hash = slot_hash
        self.probes_max = probes_max
        self._requested_metric = metric
        self._p = p
        self._metric: Optional[str] = None  # known once the index is
        self._client, self._async_client, self._owns_clients = S.clients(client, async_client, url, api_key)

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
    def async_client(self) -> Optional[AsyncClient]:
        return self._async_client

    @property
    def embeddings(self) -> Embeddings:
        return self.embedding

    @property
    def metric(self) -> str:
        """The index's metric: as found on the server once it was asked, else the one it will be created with."""
        return self._metric or self._requested_metric or "cosine"

    def close(self) -> None:
        """Closes the sync client, if the store made it."""
        if self._owns_clients and self._client is not None:
            self._client.close()

    async def aclose(self) -> None:
        """Closes both clients, if the store made them."""
        if self._owns_clients:
            if self._async_client is not None:
                await self._async_client.close()
            self.close()

    def _run(self, plan: "S.Plan[Any]") -> Any:
        return S.run(plan, self.client)

    async def _arun(self, plan: "S.Plan[Any]") -> Any:
        if self._async_client is None:
            # Given only a sync Client: its calls block, so they run in a
            # thread rather than on the event loop.
            return await _in_thread(S.run, plan, self.client)
        return await S.arun(plan, self._async_client)

    # -- The index ---------------------------------------------------------------------------------

    def _ready(self, dimensions: Optional[int]) -> "S.Plan[bool]":
        """Whether the index exists, creating it when `dimensions` is given.

        Asks the server until the index is seen once; then remembers it.
        """
        if self._metric is None:
            self._metric = yield from S.index_ready(self.index_name, dimensions, self._requested_metric, self._p)
        return self._metric is not None

    # -- Writes --------------------------------------------------------------------------------------

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: Optional[List[Dict[str, Any]]] = None,
        *,
        ids: Optional[List[Optional[str]]] = None,
        **kwargs: Any,
    ) -> List[str]:
        """Embeds and stores texts; a text whose id exists replaces that document.

        Returns the ids, made (uuid4) for texts given none. Raises
        `NotStoredError` naming any text the server refused (after storing
        the rest).
        """
        texts, metadatas, ids = _prepare(texts, metadatas, ids)
        if not texts:
            return []
        vectors = self.embedding.embed_documents(texts)
        self._run(self._add_plan(texts, metadatas, ids, vectors))
        return ids

    async def aadd_texts(
        self,
        texts: Iterable[str],
        metadatas: Optional[List[Dict[str, Any]]] = None,
        *,
        ids: Optional[List[Optional[str]]] = None,
        **kwargs: Any,
    ) -> List[str]:
        """Async `add_texts`."""
        texts, metadatas, ids = _prepare(texts, metadatas, ids)
        if not texts:
            return []
        vectors = await self.embedding.aembed_documents(texts)
        await self._arun(self._add_plan(texts, metadatas, ids, vectors))
        return ids

    def _add_plan(
        self, texts: List[str], metadatas: List[Dict[str, Any]], ids: List[str], vectors: List[List[float]]
    ) -> "S.Plan[None]":
        matrix = np.asarray(vectors, dtype=np.float64)
        if matrix.ndim != 2 or len(matrix) != len(texts):
            raise ValueError(f"the embeddings gave {matrix.shape} for {len(texts)} texts")
        rows = [M.encode(t, i, m) for t, i, m in zip(texts, ids, metadatas)]
        yield from self._ready(matrix.shape[1])
        yield from S.write(self.index_name, M.ID_KEY, ids, matrix, rows, self.slot_hash, self.probes_max)

    def delete(self, ids: Optional[List[str]] = None, **kwargs: Any) -> Optional[bool]:
        """Deletes the documents with these ids (missing ones are fine).

        ``ids=None`` deletes every document of the store, as LangChain's
        interface says; ``filter=`` instead deletes the documents a quiver
        filter matches. Each is one durable write per 1,000 ids.
        """
        self._run(self._delete_plan(ids, kwargs.get("filter")))
        return True

    async def adelete(self, ids: Optional[List[str]] = None, **kwargs: Any) -> Optional[bool]:
        """Async `delete`."""
        await self._arun(self._delete_plan(ids, kwargs.get("filter")))
        return True

    def _delete_plan(self, ids: Optional[Sequence[str]], filter: Optional[Filter]) -> "S.Plan[int]":
        if ids is not None and filter is not None:
            raise ValueError("delete takes ids or filter=, not both")
        if not (yield from self._ready(None)):
            return 0
        if ids is not None:
            return (yield from S.delete(self.index_name, M.ID_KEY, [str(i) for i in ids]))
        # Every row this store wrote (rows without an id key are not its own).
        everything = {M.ID_KEY: {"$exists": True}}
        return (yield S.Call("delete_by_filter", self.index_name, filter if filter is not None else everything))

    # -- Reads -----------------------------------------------------------------------------------------

    def get_by_ids(self, ids: Sequence[str], /) -> List[Document]:
        """The documents with these ids, in the order asked; missing ids are left out."""
        return self._run(self._get_plan(ids))

    async def aget_by_ids(self, ids: Sequence[str], /) -> List[Document]:
        """Async `get_by_ids`."""
        return await self._arun(self._get_plan(ids))

    def _get_plan(self, ids: Sequence[str]) -> "S.Plan[List[Document]]":
        if not ids or not (yield from self._ready(None)):
            return []
        found = yield from S.lookup(self.index_name, M.ID_KEY, ids)
        asked = dict.fromkeys(str(i) for i in ids)
        return [_document(found[i][0].metadata) for i in asked if i in found]

    def similarity_search(
        self, query: str, k: int = 4, filter: Optional[Filter] = None, **kwargs: Any
    ) -> List[Document]:
        """The k documents nearest to the query (among those `filter` matches), nearest first."""
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter)]

    async def asimilarity_search(
        self, query: str, k: int = 4, filter: Optional[Filter] = None, **kwargs: Any
    ) -> List[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score(query, k, filter=filter)]

    def similarity_search_with_score(
        self, query: str, k: int = 4, filter: Optional[Filter] = None, **kwargs: Any
    ) -> List[Tuple[Document, float]]:
        """Documents and the server's scores: similarity for cosine and ip, distance for the other metrics."""
        return self.similarity_search_with_score_by_vector(self.embedding.embed_query(query), k, filter=filter)

    async def asimilarity_search_with_score(
        self, query: str, k: int = 4, filter: Optional[Filter] = None, **kwargs: Any
    ) -> List[Tuple[Document, float]]:
        vector = await self.embedding.aembed_query(query)
        return await self.asimilarity_search_with_score_by_vector(vector, k, filter=filter)

    def similarity_search_by_vector(
        self, embedding: List[float], k: int = 4, filter: Optional[Filter] = None, **kwargs: Any
    ) -> List[Document]:
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter=filter)]

    async def asimilarity_search_by_vector(
        self, embedding: List[float], k: int = 4, filter: Optional[Filter] = None, **kwargs: Any
    ) -> List[Document]:
        return [doc for doc, _ in await self.asimilarity_search_with_score_by_vector(embedding, k, filter=filter)]

    def similarity_search_with_score_by_vector(
        self, embedding: List[float], k: int = 4, filter: Optional[Filter] = None
    ) -> List[Tuple[Document, float]]:
        hits = self._run(self._search_plan(embedding, k, filter, with_vectors=False))
        return [(_document(h.metadata), _score(h)) for h in hits]

    async def asimilarity_search_with_score_by_vector(
        self, embedding: List[float], k: int = 4, filter: Optional[Filter] = None
    ) -> List[Tuple[Document, float]]:
        hits = await self._arun(self._search_plan(embedding, k, filter, with_vectors=False))
        return [(_document(h.metadata), _score(h)) for h in hits]

    def _search_plan(
        self, embedding: Sequence[float], k: int, filter: Optional[Filter], with_vectors: bool
    ) -> "S.Plan[List[Hit]]":
        if k < 1 or not (yield from self._ready(None)):
            return []
        hits = yield S.Call(
            "search", self.index_name, embedding, k, filter=filter, with_scores=True, with_vectors=with_vectors
        )
        return hits

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return relevance(self.metric)

    # -- Maximal marginal relevance --------------------------------------------------------------

    def max_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[Filter] = None,
        **kwargs: Any,
    ) -> List[Document]:
        """k documents chosen among the fetch_k nearest for relevance and diversity (LangChain's MMR)."""
        return self.max_marginal_relevance_search_by_vector(
            self.embedding.embed_query(query), k, fetch_k, lambda_mult, filter=filter
        )

    async def amax_marginal_relevance_search(
        self,
        query: str,
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[Filter] = None,
        **kwargs: Any,
    ) -> List[Document]:
        vector = await self.embedding.aembed_query(query)
        return await self.amax_marginal_relevance_search_by_vector(vector, k, fetch_k, lambda_mult, filter=filter)

    def max_marginal_relevance_search_by_vector(
        self,
        embedding: List[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[Filter] = None,
        **kwargs: Any,
    ) -> List[Document]:
        hits = self._run(self._search_plan(embedding, max(k, fetch_k), filter, with_vectors=True))
        return _mmr(embedding, hits, k, lambda_mult)

    async def amax_marginal_relevance_search_by_vector(
        self,
        embedding: List[float],
        k: int = 4,
        fetch_k: int = 20,
        lambda_mult: float = 0.5,
        filter: Optional[Filter] = None,
        **kwargs: Any,
    ) -> List[Document]:
        hits = await self._arun(self._search_plan(embedding, max(k, fetch_k), filter, with_vectors=True))
        return _mmr(embedding, hits, k, lambda_mult)

    # -- Constructors ------------------------------------------------------------------------------

    @classmethod
    def from_texts(
        cls,
        texts: List[str],
        embedding: Embeddings,
        metadatas: Optional[List[Dict[str, Any]]] = None,
        *,
        ids: Optional[List[str]] = None,
        **kwargs: Any,
    ) -> "QuiverVectorStore":
        """A store (arguments as the constructor's) holding these texts."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    @classmethod
    async def afrom_texts(
        cls,
        texts: List[str],
        embedding: Embeddings,
        metadatas: Optional[List[Dict[str, Any]]] = None,
        *,
        ids: Optional[List[str]] = None,
        **kwargs: Any,
    ) -> "QuiverVectorStore":
        store = cls(embedding, **kwargs)
        await store.aadd_texts(texts, metadatas, ids=ids)
        return store


# -- Pure helpers ------------------------------------------------------------------------------------


def _prepare(
    texts: Iterable[str], metadatas: Optional[List[Dict[str, Any]]], ids: Optional[Sequence[Optional[str]]]
) -> Tuple[List[str], List[Dict[str, Any]], List[str]]:
    """Texts, one metadata dict each, and one id each (uuid4 where none was given)."""
    texts = list(texts)
    if metadatas is not None and len(metadatas) != len(texts):
        raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
    if ids is not None and len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
    given = ids if ids is not None else [None] * len(texts)
    return (
        texts,
        [m or {} for m in (metadatas or [{}] * len(texts))],
        [str(uuid.uuid4()) if i is None else str(i) for i in given],
    )


def _document(row: Dict[str, Any]) -> Document:
    text, doc_id, metadata = M.decode(row)
    return Document(page_content=text, metadata=metadata, id=doc_id)


def _score(hit: Hit) -> float:
    # None is an infinite distance (bc, lp with p < 1), the farthest possible.
    return math.inf if hit.score is None else hit.score


def _mmr(query: Sequence[float], hits: List[Hit], k: int, lambda_mult: float) -> List[Document]:
    if not hits or k < 1:
        return []
    vectors = np.stack([h.vector for h in hits])
    chosen = maximal_marginal_relevance(np.asarray(query, dtype=np.float32), vectors, lambda_mult, k)
    return [_document(hits[i].metadata) for i in chosen]


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
