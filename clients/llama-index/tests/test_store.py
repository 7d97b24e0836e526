"""The store against the real server: add and query against a NumPy oracle, nodes round trip, deletes, ids."""

from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import MakeStore, Server
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from llama_index.core.vector_stores.types import (
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)
from quiver_vectors import AsyncClient, Client

from llama_index.vector_stores.quiver import NotStoredError, QuiverVectorStore, blake2b_slot, similarity

DIMS = 8


def node(node_id: str, vector: Any, doc: str = "doc", text: str = "", **metadata: Any) -> TextNode:
    n = TextNode(id_=node_id, text=text or f"text of {node_id}", metadata=metadata, embedding=list(map(float, vector)))
    n.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=doc)
    return n


def random_nodes(n: int, seed: int = 1) -> List[TextNode]:
    vectors = np.random.default_rng(seed).standard_normal((n, DIMS)).astype(np.float32)
    return [node(f"n{i}", vectors[i], doc=f"doc{i % 3}") for i in range(n)]


def ids_of(result: Any) -> List[str]:
    return [n.node_id for n in result.nodes]


def rows(client: Client, name: str) -> Dict[int, str]:
    return {r.id: r.metadata["_li_id"] for r in client.scroll(name)}


ORACLES = {
    "cosine": (lambda x, q: (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q)), lambda s: s),
    "ip": (lambda x, q: x @ q, lambda s: s),
    "l2": (lambda x, q: ((x - q) ** 2).sum(axis=1), lambda d: 1 / (1 + d)),
}


@pytest.mark.parametrize("metric", list(ORACLES))
def test_add_and_query_match_a_numpy_oracle(make_store: MakeStore, metric: str) -> None:
    nodes = random_nodes(50)
    store = make_store(metric=metric)
    assert store.add(nodes) == [n.node_id for n in nodes]
    q = np.random.default_rng(99).standard_normal(DIMS).astype(np.float32)

    result = store.query(VectorStoreQuery(query_embedding=q.tolist(), similarity_top_k=7))

    score, to_similarity = ORACLES[metric]
    x = np.array([n.embedding for n in nodes])
    s = score(x, q.astype(np.float64))
    order = np.argsort(-s if metric != "l2" else s, kind="stable")[:7]
    assert ids_of(result) == result.ids == [nodes[i].node_id for i in order]
    np.testing.assert_allclose(result.similarities, [to_similarity(s[i]) for i in order], rtol=1e-5, atol=1e-6)
    assert [n.get_content() for n in result.nodes] == [nodes[i].get_content() for i in order]


def test_similarity_is_larger_for_nearer_nodes() -> None:
    assert similarity("cosine")(0.25) == 0.25 and similarity("ip")(-3.0) == -3.0
    assert similarity("l2")(0.0) == 1.0 and similarity("l1")(3.0) == 0.25 and similarity("bc")(None) == 0.0


def test_nodes_come_back_equal_with_unfilterable_metadata(
    make_store: MakeStore, client: Client, index_name: str
) -> None:
    metadata = {
        "title": "t",
        "year": 2024,
        "none": None,
        "nested": {"a": [1, {"b": None}]},
        "ints": [1, 2],
        "empty": [],
        "tags": ["x", "y"],
        "big": 2**70,
    }
    original = node("n1", [1.0, 2.0, 3.0], doc="d1", text="hello ☃", **metadata)
    original.excluded_llm_metadata_keys = ["year"]
    original.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id="n2")
    store = make_store()
    store.add([original])

    (got,) = store.query(VectorStoreQuery(query_embedding=[1.0, 2.0, 3.0], similarity_top_k=1)).nodes
    assert got.metadata == metadata
    assert (got.node_id, got.get_content(), got.ref_doc_id) == ("n1", "hello ☃", "d1")
    assert got.relationships == original.relationships and got.excluded_llm_metadata_keys == ["year"]
    assert store.get_nodes(["n1"])[0].embedding == [1.0, 2.0, 3.0]

    # Filterable values are top-level entries; the others live only in _node_content.
    (row,) = client.scroll(index_name)
    assert {k: row.metadata.get(k) for k in ("title", "year", "tags", "ref_doc_id")} == {
        "title": "t",
        "year": 2024,
        "tags": ["x", "y"],
        "ref_doc_id": "d1",
    }
    assert not {"none", "nested", "ints", "empty", "big"} & set(row.metadata)


def test_delete_by_ref_doc_id_removes_exactly_that_documents_nodes(make_store: MakeStore) -> None:
    nodes = random_nodes(9)  # doc0, doc1, doc2 three nodes each
    store = make_store()
    store.add(nodes)
    store.delete("doc1")
    left = store.get_nodes()
    assert sorted(n.node_id for n in left) == sorted(n.node_id for n in nodes if n.ref_doc_id != "doc1")
    store.delete("no-such-doc")
    assert len(store.get_nodes()) == 6


def test_node_ids_and_doc_ids_restrict_a_query(make_store: MakeStore) -> None:
    nodes = random_nodes(9)
    store = make_store()
    store.add(nodes)
    q = nodes[0].embedding
    by_node = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=9, node_ids=["n4", "n7", "zz"]))
    assert sorted(ids_of(by_node)) == ["n4", "n7"]
    by_doc = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=9, doc_ids=["doc2"]))
    assert sorted(ids_of(by_doc)) == ["n2", "n5", "n8"]
    both = store.query(
        VectorStoreQuery(
            query_embedding=q,
            similarity_top_k=9,
            doc_ids=["doc2"],
            filters=MetadataFilters(filters=[MetadataFilter(key="ref_doc_id", value="doc2", operator="!=")]),
        )
    )
    assert both.nodes == [] and both.ids == []
    # An empty list restricts nothing (LlamaIndex's retriever sends node_ids=[] when it has none).
    unrestricted = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=9, node_ids=[], doc_ids=[]))
    assert sorted(unrestricted.ids or []) == sorted(n.node_id for n in nodes)


def test_get_nodes_delete_nodes_and_clear(make_store: MakeStore, client: Client, index_name: str) -> None:
    nodes = [node(f"n{i}", [1.0, float(i)], kind="odd" if i % 2 else "even") for i in range(6)]
    store = make_store()
    store.add(nodes)
    assert [n.node_id for n in store.get_nodes(["n3", "n1", "nope"])] == ["n3", "n1"]
    odd = MetadataFilters(filters=[MetadataFilter(key="kind", value="odd")])
    assert sorted(n.node_id for n in store.get_nodes(filters=odd)) == ["n1", "n3", "n5"]
    assert [n.node_id for n in store.get_nodes(["n1", "n2"], filters=odd)] == ["n1"]

    store.delete_nodes(["n1", "n2"], filters=odd)  # only n1 is both
    assert sorted(n.node_id for n in store.get_nodes()) == ["n0", "n2", "n3", "n4", "n5"]
    store.delete_nodes(filters=odd)
    assert sorted(n.node_id for n in store.get_nodes()) == ["n0", "n2", "n4"]

    client.upsert(index_name, [[1.0, 1.0]], ids=[7], metadata=[{"other": "app"}])  # not the store's
    store.clear()
    assert store.get_nodes() == [] and [r.id for r in client.scroll(index_name)] == [7]


def test_mmr_query_prefers_diverse_nodes(make_store: MakeStore) -> None:
    vectors = {"a": [1.0, 0.05, 0.0], "a2": [1.0, 0.06, 0.0], "a3": [1.0, 0.04, 0.0], "b": [0.6, 0.0, 0.8]}
    store = make_store()
    store.add([node(k, v) for k, v in vectors.items()])
    plain = store.query(VectorStoreQuery(query_embedding=[1.0, 0.0, 0.0], similarity_top_k=2))
    assert ids_of(plain) == ["a3", "a"]
    mmr = store.query(
        VectorStoreQuery(
            query_embedding=[1.0, 0.0, 0.0], similarity_top_k=2, mode=VectorStoreQueryMode.MMR, mmr_threshold=0.5
        )
    )
    assert ids_of(mmr) == ["a3", "b"]
    with pytest.raises(NotImplementedError, match="query mode 'hybrid'"):
        store.query(VectorStoreQuery(query_embedding=[1.0, 0.0, 0.0], mode=VectorStoreQueryMode.HYBRID))


def test_reads_before_the_first_add_see_an_empty_store(make_store: MakeStore, client: Client, index_name: str) -> None:
    store = make_store(metric="l1")
    assert store.query(VectorStoreQuery(query_embedding=[1.0], similarity_top_k=3)).ids == []
    assert store.get_nodes() == []
    store.delete("x")
    assert index_name not in client.list_indexes()
    store.add([node("a", [1.0, 2.0])])
    assert (client.stats(index_name).dimensions, client.stats(index_name).metric) == (2, "l1")
    with pytest.raises(ValueError, match="has 2 dimensions; the embeddings have 3"):
        make_store().add([node("b", [1.0, 2.0, 3.0])])
    with pytest.raises(ValueError, match="metric 'l1', not 'cosine'"):
        make_store(metric="cosine").get_nodes()


def test_a_node_the_server_refuses_is_reported_and_the_rest_stored(make_store: MakeStore) -> None:
    store = make_store()
    with pytest.raises(NotStoredError) as raised:
        store.add([node("ok", [1.0, 0.0]), node("zero", [0.0, 0.0])])
    assert raised.value.failures == {"zero": "an all-zero vector has no direction in a cosine index"}
    assert [n.node_id for n in store.get_nodes()] == ["ok"]


def test_colliding_node_ids_are_kept_apart(make_store: MakeStore, client: Client, index_name: str) -> None:
    store = make_store(slot_hash=lambda s, n: n)  # every id's probe n is row n
    store.add([node("A", [1.0, 0.0]), node("B", [0.0, 1.0]), node("C", [1.0, 1.0])])
    assert rows(client, index_name) == {0: "A", 1: "B", 2: "C"}
    store.delete_nodes(["A"])
    store.add([node("D", [2.0, 1.0]), node("C", [1.0, 3.0], text="new C")])
    assert rows(client, index_name) == {0: "D", 1: "B", 2: "C"}
    assert [n.get_content() for n in store.get_nodes(["C"])] == ["new C"]
    assert blake2b_slot("A", 0) != blake2b_slot("A", 1)


async def test_async_paths(server: Server, index_name: str) -> None:
    async with AsyncClient(server.url, api_key=server.key) as aclient:
        store = QuiverVectorStore(index_name, client=aclient)
        nodes = random_nodes(9)
        assert await store.async_add(nodes) == [n.node_id for n in nodes]
        q = nodes[4].embedding
        result = await store.aquery(VectorStoreQuery(query_embedding=q, similarity_top_k=3))
        assert result.ids[0] == "n4" and result.similarities[0] == pytest.approx(1.0, abs=1e-6)
        await store.adelete("doc1")
        assert sorted(n.node_id for n in await store.aget_nodes()) == ["n0", "n2", "n3", "n5", "n6", "n8"]
        await store.adelete_nodes(["n0"])
        assert len(await store.aget_nodes()) == 5
        await store.aclear()
        assert await store.aget_nodes() == []
        with pytest.raises(RuntimeError, match="only an AsyncClient"):
            store.get_nodes()


def test_query_needs_an_embedding(make_store: MakeStore) -> None:
    with pytest.raises(ValueError, match="needs query_embedding"):
        make_store().query(VectorStoreQuery(query_str="hi"))


def test_a_bad_index_name_fails_at_construction(make_store: MakeStore) -> None:
    with pytest.raises(ValueError, match="index names are 3 to 32 characters"):
        make_store(name="No")


def test_filterable_values_are_what_quiver_stores() -> None:
    from llama_index.vector_stores.quiver.base import filterable

    assert all(filterable(v) for v in ("s", True, 3, 2**63 - 1, 0.5, ["a"]))
    assert not any(filterable(v) for v in (None, [], [1], {}, 2**63, math.nan, math.inf))


def test_filters_on_unsupported_operators_raise_before_sending(make_store: MakeStore) -> None:
    store = make_store()
    store.add([node("a", [1.0, 0.0], lang="en")])
    text = MetadataFilters(filters=[MetadataFilter(key="lang", value="e", operator=FilterOperator.TEXT_MATCH)])
    with pytest.raises(NotImplementedError, match="TEXT_MATCH"):
        store.query(VectorStoreQuery(query_embedding=[1.0, 0.0], filters=text))
