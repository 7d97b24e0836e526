"""The store's own contract: scores against a NumPy oracle, filters, MMR, metadata round trips, the index."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
from conftest import MakeStore, Server, TableEmbeddings
from langchain_core.documents import Document
from langchain_core.vectorstores.utils import maximal_marginal_relevance
from quiver_vectors import AsyncClient, Client

from langchain_quiver import NotStoredError, QuiverVectorStore, relevance

DIMS = 8


def random_table(n: int, seed: int = 7) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # float32 values, so the oracle scores the very numbers the server stores.
    vectors = rng.standard_normal((n + 1, DIMS)).astype(np.float32)
    table = {f"doc {i}": vectors[i] for i in range(n)}
    table["query"] = vectors[n]
    return table


# -- Scores ------------------------------------------------------------------------------------------

ORACLES: Dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "cosine": lambda x, q: (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q)),
    "ip": lambda x, q: x @ q,
    "l2": lambda x, q: ((x - q) ** 2).sum(axis=1),
    "l1": lambda x, q: np.abs(x - q).sum(axis=1),
}


@pytest.mark.parametrize("metric", list(ORACLES))
def test_scores_and_order_match_a_numpy_oracle(make_store: MakeStore, server: Server, metric: str) -> None:
    table = random_table(60)
    texts = [t for t in table if t != "query"]
    store = make_store(table, metric=metric)
    store.add_texts(texts, ids=texts)

    got = store.similarity_search_with_score("query", k=10)

    x = np.stack([table[t] for t in texts]).astype(np.float64)
    scores = ORACLES[metric](x, table["query"].astype(np.float64))
    nearest_first = np.argsort(-scores if metric in ("cosine", "ip") else scores, kind="stable")[:10]
    assert [doc.id for doc, _ in got] == [texts[i] for i in nearest_first]
    assert [doc.page_content for doc, _ in got] == [texts[i] for i in nearest_first]
    # The server computes in float32: equal to the float64 oracle within its rounding.
    np.testing.assert_allclose([s for _, s in got], scores[nearest_first], rtol=1e-5, atol=1e-5)

    rel = store.similarity_search_with_relevance_scores("query", k=10)
    assert [doc.id for doc, _ in rel] == [doc.id for doc, _ in got]
    assert [r for _, r in rel] == [relevance(metric)(s) for _, s in got]
    assert all(0.0 <= r <= 1.0 for _, r in rel)


async def test_async_scores_equal_sync_scores(make_store: MakeStore) -> None:
    table = random_table(30, seed=11)
    texts = [t for t in table if t != "query"]
    store = make_store(table)
    await store.aadd_texts(texts, ids=texts)
    got = await store.asimilarity_search_with_score("query", k=5)
    assert got == store.similarity_search_with_score("query", k=5)
    assert await store.asimilarity_search_by_vector(list(table["query"]), k=5) == [d for d, _ in got]
    await store.aclose()


def test_relevance_maps_each_metric_into_0_1() -> None:
    assert relevance("cosine")(1.0) == 1.0 and relevance("cosine")(-1.0) == 0.0 and relevance("cosine")(0.0) == 0.5
    assert relevance("ip")(3.0) == 1.0 and relevance("ip")(-3.0) == 0.0
    # For unit vectors, l2's squared distance is 2 - 2 cos: the same relevance as cosine.
    for cos in (-1.0, -0.3, 0.0, 0.6, 1.0):
        assert relevance("l2")(2 - 2 * cos) == pytest.approx(relevance("cosine")(cos))
    assert relevance("l1")(0.0) == 1.0 and relevance("l1")(3.0) == 0.25
    assert relevance("bc")(None) == 0.0 and relevance("lp")(math.inf) == 0.0


# -- Filters ----------------------------------------------------------------------------------------

ROWS: List[Dict[str, Any]] = [
    {"lang": "en", "year": 2001, "score": 0.5, "draft": True, "tags": ["x", "y"]},
    {"lang": "fr", "year": 2015, "score": 2.25, "draft": False, "tags": ["y"]},
    {"lang": "en", "year": 2023, "score": -1.0, "draft": False, "tags": []},
    {"lang": "de", "year": 1999, "draft": True, "tags": ["x"]},
    {"year": 2015, "score": 7.0},
    {"lang": "2015", "note": None},
]

# Each filter, and the rows it must match (a predicate over the metadata: the oracle).
FILTERS = [
    ({"lang": "en"}, lambda m: m.get("lang") == "en"),
    ({"lang": {"$eq": "fr"}}, lambda m: m.get("lang") == "fr"),
    ({"year": 2015}, lambda m: m.get("year") == 2015),  # the number, not the string "2015"
    ({"draft": False}, lambda m: m.get("draft") is False),
    ({"score": 2.25}, lambda m: m.get("score") == 2.25),
    ({"lang": {"$ne": "en"}}, lambda m: m.get("lang") != "en"),  # rows without lang too
    ({"lang": {"$in": ["fr", "de"]}}, lambda m: m.get("lang") in ("fr", "de")),
    ({"lang": {"$nin": ["en", "fr"]}}, lambda m: m.get("lang") not in ("en", "fr")),
    ({"year": {"$gt": 2001}}, lambda m: isinstance(m.get("year"), int) and m["year"] > 2001),
    ({"year": {"$gte": 2001}}, lambda m: isinstance(m.get("year"), int) and m["year"] >= 2001),
    ({"score": {"$lt": 0.5}}, lambda m: isinstance(m.get("score"), float) and m["score"] < 0.5),
    ({"score": {"$lte": 0.5}}, lambda m: isinstance(m.get("score"), float) and m["score"] <= 0.5),
    ({"year": {"$gte": 2000, "$lt": 2020}}, lambda m: isinstance(m.get("year"), int) and 2000 <= m["year"] < 2020),
    ({"tags": {"$contains": "x"}}, lambda m: "x" in m.get("tags", [])),
    ({"tags": {"$exists": True}}, lambda m: "tags" in m),
    ({"lang": {"$exists": False}}, lambda m: "lang" not in m),
    (
        {"$and": [{"draft": True}, {"tags": {"$contains": "x"}}]},
        lambda m: m.get("draft") is True and "x" in m.get("tags", []),
    ),
    ({"$or": [{"lang": "de"}, {"score": {"$gt": 2}}]}, lambda m: m.get("lang") == "de" or m.get("score", 0) > 2),
    ({"$not": {"lang": "en"}}, lambda m: m.get("lang") != "en"),
    ({"lang": "en", "draft": True}, lambda m: m.get("lang") == "en" and m.get("draft") is True),
]


@pytest.fixture
def filtered(make_store: MakeStore) -> QuiverVectorStore:
    rng = np.random.default_rng(3)
    table = {f"row {i}": rng.standard_normal(4) for i in range(len(ROWS))}
    table["query"] = rng.standard_normal(4)
    store = make_store(table)
    store.add_texts(list(table)[: len(ROWS)], metadatas=ROWS, ids=[str(i) for i in range(len(ROWS))])
    return store


@pytest.mark.parametrize("filter, oracle", FILTERS, ids=[str(f) for f, _ in FILTERS])
def test_each_filter_matches_exactly_the_oracle_rows(filtered: QuiverVectorStore, filter: Any, oracle: Any) -> None:
    want = {str(i) for i, m in enumerate(ROWS) if oracle(m)}
    got = filtered.similarity_search("query", k=len(ROWS), filter=filter)
    assert {d.id for d in got} == want
    assert all(d.metadata == ROWS[int(d.id)] for d in got)  # type: ignore[arg-type]


async def test_async_filter_and_delete_by_filter(filtered: QuiverVectorStore) -> None:
    got = await filtered.asimilarity_search("query", k=10, filter={"tags": {"$contains": "y"}})
    assert {d.id for d in got} == {"0", "1"}
    await filtered.adelete(filter={"tags": {"$contains": "y"}})
    assert {d.id for d in filtered.similarity_search("query", k=10)} == {"2", "3", "4", "5"}
    await filtered.aclose()


# -- MMR ----------------------------------------------------------------------------------------------


def mmr_table() -> Dict[str, List[float]]:
    # Three near-copies close to the query, and one further off in another direction.
    return {
        "query": [1.0, 0.0, 0.0],
        "a": [1.0, 0.05, 0.0],
        "a2": [1.0, 0.06, 0.001],
        "a3": [1.0, 0.04, -0.001],
        "b": [0.6, 0.0, 0.8],
        "c": [-1.0, 0.2, 0.0],
    }


def test_mmr_picks_diverse_documents_as_langchains_mmr_does(make_store: MakeStore) -> None:
    table = mmr_table()
    texts = [t for t in table if t != "query"]
    store = make_store(table)
    store.add_texts(texts, ids=texts)

    plain = [d.id for d in store.similarity_search("query", k=2)]
    assert plain == ["a3", "a"]

    got = [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=4, lambda_mult=0.5)]
    # Oracle: LangChain's own MMR over the 4 nearest, scored locally.
    nearest = ["a3", "a", "a2", "b"]
    chosen = maximal_marginal_relevance(np.array(table["query"]), [table[t] for t in nearest], 0.5, 2)
    assert got == [nearest[i] for i in chosen] == ["a3", "b"]

    # lambda_mult 1 is plain relevance; fetch_k bounds the candidates.
    assert [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=4, lambda_mult=1.0)] == plain
    assert [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=3, lambda_mult=0.0)][0] == "a3"
    assert store.max_marginal_relevance_search("query", k=2, filter={"nothing": "matches"}) == []


async def test_async_mmr(make_store: MakeStore) -> None:
    table = mmr_table()
    texts = [t for t in table if t != "query"]
    store = make_store(table)
    await store.aadd_texts(texts, ids=texts)
    got = await store.amax_marginal_relevance_search("query", k=2, fetch_k=4, lambda_mult=0.5)
    assert [d.id for d in got] == ["a3", "b"]
    assert got[1] == Document(id="b", page_content="b", metadata={})
    await store.aclose()


# -- Metadata round trip --------------------------------------------------------------------------

AWKWARD: Dict[str, Any] = {
    "none": None,
    "nested": {"a": {"b": [1, 2, {"c": None}]}, "empty": {}},
    "ints": [1, 2, 3],
    "mixed": ["a", 1, True, None],
    "empty_list": [],
    "strings": ["a", "", "ü"],
    "empty_dict": {},
    "huge": 2**70,
    "negative_huge": -(2**64),
    "int64_max": 2**63 - 1,
    "inf": math.inf,
    "minus_inf": -math.inf,
    "neg_zero": -0.0,
    "tiny": 5e-324,
    "big": 1e300,
    "float_int": 3.0,
    "bool": False,
    "empty": "",
    "unicode": "naïve ☃ \u0000 \n",
    "$dollar": "kept",
    "dot.key": 1,
}


def test_awkward_metadata_comes_back_equal(make_store: MakeStore, index_name: str, client: Client) -> None:
    store = make_store({"text": [1.0, 2.0], "q": [1.0, 2.0]})
    doc = Document(id="awkward", page_content="text", metadata=AWKWARD)
    store.add_documents([doc])

    (got,) = store.get_by_ids(["awkward"])
    assert got == doc
    assert math.copysign(1.0, got.metadata["neg_zero"]) == -1.0
    assert type(got.metadata["float_int"]) is float and type(got.metadata["int64_max"]) is int
    assert store.similarity_search("q", k=1) == [doc]

    # Native values are stored as they are (so filters see them); the rest is one JSON string.
    (row,) = client.scroll(index_name)
    assert row.metadata["strings"] == ["a", "", "ü"] and row.metadata["bool"] is False
    assert "none" not in row.metadata and "nested" not in row.metadata and "huge" not in row.metadata
    assert isinstance(row.metadata["_lc_json"], str)
    assert store.similarity_search("q", k=1, filter={"strings": {"$contains": "ü"}}) == [doc]
    assert store.similarity_search("q", k=1, filter={"int64_max": 2**63 - 1}) == [doc]


def test_nan_comes_back_nan(make_store: MakeStore) -> None:
    store = make_store({"t": [1.0, 0.0]})
    store.add_texts(["t"], [{"nan": math.nan}], ids=["n"])
    (got,) = store.get_by_ids(["n"])
    assert math.isnan(got.metadata["nan"])


def test_reserved_keys_and_bad_metadata_are_refused_before_sending(make_store: MakeStore) -> None:
    store = make_store({"t": [1.0, 0.0]})
    with pytest.raises(ValueError, match="'_lc_text' is reserved"):
        store.add_texts(["t"], [{"_lc_text": "x"}])
    with pytest.raises(TypeError, match="keys must be strings"):
        store.add_texts(["t"], [{1: "x"}])  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="not JSON serializable"):
        store.add_texts(["t"], [{"x": object()}])
    assert store.similarity_search("t", k=1) == []  # nothing was created or stored


# -- The index, errors, constructors ------------------------------------------------------------------


def test_index_is_created_on_first_write_with_its_dimensions_and_metric(
    make_store: MakeStore, index_name: str, client: Client
) -> None:
    store = make_store({"t": [1.0, 2.0, 3.0]}, metric="l1")
    assert store.similarity_search("t") == [] and store.get_by_ids(["x"]) == [] and store.delete(["x"])
    assert index_name not in client.list_indexes()  # reads do not create it
    store.add_texts(["t"])
    stats = client.stats(index_name)
    assert (stats.dimensions, stats.metric, stats.count) == (3, "l1", 1)

    # Another store on the same index takes its metric; a conflicting one is refused.
    assert make_store({"t": [1.0, 2.0, 3.0]}).similarity_search_with_score("t")[0][1] == 0.0
    with pytest.raises(ValueError, match="metric 'l1', not 'cosine'"):
        make_store({"t": [1.0, 2.0, 3.0]}, metric="cosine").similarity_search("t")
    with pytest.raises(ValueError, match="has 3 dimensions; the embeddings have 2"):
        make_store({"u": [1.0, 2.0]}).add_texts(["u"])


def test_bad_index_name_fails_at_construction(make_store: MakeStore) -> None:
    with pytest.raises(ValueError, match="index names are 3 to 32 characters"):
        make_store({}, name="Bad_Name")


def test_a_vector_the_server_refuses_is_reported_and_the_rest_stored(make_store: MakeStore) -> None:
    store = make_store({"zero": [0.0, 0.0], "ok": [1.0, 0.0], "ok2": [0.0, 1.0]})
    with pytest.raises(NotStoredError) as raised:
        store.add_texts(["ok", "zero", "ok2"], ids=["1", "2", "3"])
    assert raised.value.failures == {"2": "an all-zero vector has no direction in a cosine index"}
    assert sorted(d.id for d in store.get_by_ids(["1", "2", "3"])) == ["1", "3"]  # type: ignore[type-var]


def test_from_texts_and_delete_all_keeps_foreign_rows(server: Server, index_name: str, client: Client) -> None:
    table = {"a": [1.0, 0.0], "b": [0.0, 1.0]}
    store = QuiverVectorStore.from_texts(
        ["a", "b"],
        TableEmbeddings(table),
        [{"k": 1}, {"k": 2}],
        ids=["ida", "idb"],
        index_name=index_name,
        url=server.url,
        api_key=server.key,
    )
    assert [d.id for d in store.similarity_search("a", k=2)] == ["ida", "idb"]
    client.upsert(index_name, [[0.5, 0.5]], ids=[42], metadata=[{"other": "app"}])  # not the store's
    assert store.delete() is True
    assert [r.id for r in client.scroll(index_name)] == [42]
    store.close()


async def test_afrom_texts_and_an_async_only_store(server: Server, index_name: str) -> None:
    table = {"a": [1.0, 0.0], "b": [0.0, 1.0]}
    async with AsyncClient(server.url, api_key=server.key) as aclient:
        store = await QuiverVectorStore.afrom_texts(
            ["a", "b"], TableEmbeddings(table), ids=["1", "2"], index_name=index_name, client=aclient
        )
        assert [d.page_content for d in await store.asimilarity_search("b", k=2)] == ["b", "a"]
        assert [d.id for d in await store.aget_by_ids(["2", "9", "1"])] == ["2", "1"]
        await store.adelete(["1"])
        assert [d.id for d in await store.asimilarity_search("a", k=2)] == ["2"]
        with pytest.raises(RuntimeError, match="only an AsyncClient"):
            store.similarity_search("a")


async def test_a_sync_only_store_serves_async_calls_in_a_thread(index_name: str, client: Client) -> None:
    store = QuiverVectorStore(TableEmbeddings({"a": [1.0, 0.0]}), index_name, client=client)
    assert store.async_client is None
    assert await store.aadd_texts(["a"], ids=["x"]) == ["x"]
    assert [d.id for d in await store.asimilarity_search("a")] == ["x"]
