"""Every endpoint through the sync client, against the real server, over both ways of sending."""

from __future__ import annotations

import itertools
import sys
import threading
import time

import numpy as np
import pytest
from conftest import KEY, Server, counter
from oracle import assert_hits_match, bits, expected_ids, random_float32_bits

from quiver_vectors import _protocol as P

from quiver_vectors import (
    AuthenticationError,
    Client,
    ClusterError,
    Deleted,
    IndexExistsError,
    IndexNotCreatedError,
    IndexNotFoundError,
    InvalidRequestError,
    QuiverError,
    Search,
    SearchError,
    Skipped,
    WriteResult,
)


def make_index(client: Client, name: str, dims: int, metric: str, rows: int, seed: int = 0) -> np.ndarray:
    data = np.random.default_rng(seed).standard_normal((rows, dims), dtype=np.float32)
    client.create_index(name, dims, metric)
    assert client.upsert(name, data, ids=np.arange(rows)) == WriteResult(rows, rows, [])
    return data


# -- status and indexes -------------------------------------------------------------------


def test_health_needs_no_key_and_test_auth_checks_it(client: Client, server: Server) -> None:
    health = client.health()
    assert health.cpu_usage_percent >= 0 and 0 <= health.mem_usage_percent <= 100
    assert isinstance(health.uptime, str) and health.uptime[-1] == "s"
    client.test_auth()

    with Client(server.url, api_key=None) as keyless:
        assert keyless.health().uptime
        with pytest.raises(AuthenticationError) as missing:
            keyless.list_indexes()
    assert (missing.value.status, missing.value.code) == (401, "NO_API_KEY_PROVIDED")

    with Client(server.url, api_key="not-the-key") as wrong:
        with pytest.raises(AuthenticationError) as refused:
            wrong.test_auth()
    assert (refused.value.status, refused.value.code) == (401, "INVALID_API_KEY")
    assert refused.value.message == "Invalid API key."
    assert "X-Service-API-Key" in str(refused.value.description)


def test_url_and_key_come_from_the_environment(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_URL", server.url)
    monkeypatch.setenv("QUIVER_API_KEY", KEY)
    with Client() as client:
        client.test_auth()
        assert client.url == server.url


def test_index_lifecycle(client: Client) -> None:
    assert client.list_indexes() == []
    client.create_index("docs", 3, "cosine")
    client.create_index("alpha", 5, "l2")
    client.create_index("powers", 4, "lp", p=3)
    assert client.list_indexes() == ["alpha", "docs", "powers"]
    stats = client.stats("docs")
    assert (stats.name, stats.dimensions, stats.metric, stats.count, stats.p) == ("docs", 3, "cosine", 0, None)
    assert client.stats("powers").p == 3.0
    assert client.list_indexes(consistency="local") == ["alpha", "docs", "powers"]

    with pytest.raises(IndexExistsError) as exists:
        client.create_index("docs", 3, "cosine")
    assert exists.value.code == "INDEX_NOT_CREATED" and exists.value.description == "index 'docs' already exists"
    client.create_index("docs", 3, "cosine", exist_ok=True)

    with pytest.raises(IndexNotCreatedError) as metric:
        client.create_index("other", 3, "hamming")
    assert metric.value.code == "INVALID_SIMILARITY_METRIC" and "allowed values" in str(metric.value.description)
    assert not isinstance(metric.value, IndexExistsError)
    with pytest.raises(IndexNotCreatedError) as name:
        client.create_index("Bad_Name", 3, "cosine")
    assert "a-z" in str(name.value.description)
    with pytest.raises(InvalidRequestError) as no_p:
        client.create_index("lp-without-p", 3, "lp")
    assert no_p.value.detail == "p: the lp metric needs a number above 0 and finite"

    client.delete_index("alpha")
    assert client.list_indexes() == ["docs", "powers"]
    with pytest.raises(IndexNotFoundError) as gone:
        client.delete_index("alpha")
    assert gone.value.code == "INDEX_NOT_DELETED"
    client.delete_index("alpha", missing_ok=True)


def test_an_unknown_index_raises_index_not_found_on_every_endpoint(client: Client) -> None:
    calls = [
        lambda: client.stats("nope"),
        lambda: client.search("nope", [1.0, 2.0], k=1),
        lambda: client.search_batch("nope", [[1.0, 2.0]], k=1),
        lambda: client.retrieve("nope", [1]),
        lambda: client.delete("nope", [1]),
        lambda: client.delete_by_filter("nope", {}),
        lambda: list(client.scroll("nope")),
        lambda: client.upsert("nope", [1.0, 2.0], ids=[1]),
        lambda: client.insert("nope", [1.0, 2.0], ids=[1]),
    ]
    for call in calls:
        with pytest.raises(IndexNotFoundError) as missing:
            call()
        assert (missing.value.status, missing.value.code) == (500, "INDEX_NOT_FETCHED")
        assert missing.value.description == "index 'nope' does not exist"
    # A name that is no index name names no index, and cannot reach another path.
    with pytest.raises(IndexNotFoundError):
        client.stats("../indexes/list")


def test_cluster_status_of_a_single_node_and_membership_refused(client: Client) -> None:
    status = client.cluster()
    assert (status.role, status.node_id, status.leader_id, status.members) == ("single", None, None, [])
    assert status.term == 0 and status.commit_index == 0 and status.applied_index == 0
    with pytest.raises(ClusterError) as add:
        client.add_member(4, "127.0.0.1:7004")
    assert (add.value.status, add.value.code) == (400, "NOT_A_CLUSTER")
    with pytest.raises(ClusterError) as remove:
        client.remove_member(4)
    assert remove.value.code == "NOT_A_CLUSTER"


def test_metrics_and_openapi(client: Client) -> None:
    client.health()
    metrics = client.metrics()
    assert "# TYPE" in metrics and "quiver_" in metrics
    document = client.openapi()
    assert document["openapi"].startswith("3.")
    assert "/api/v1/embeddings/{indexName}/search" in document["paths"]


# -- writes ---------------------------------------------------------------------------------


def test_insert_and_upsert_report_skipped_items_instead_of_raising(client: Client) -> None:
    client.create_index("docs", 3, "cosine")
    first = client.insert("docs", [[1, 0, 0], [0, 1, 0]], ids=[1, 2], metadata=[{"title": "first"}, None])
    assert first == WriteResult(2, 2, [])
    assert first.complete

    again = client.insert("docs", [[1, 1, 0], [0, 0, 0], [0, 0, 1]], ids=[2, 3, 4])
    assert again.requested == 3 and again.stored == 1 and not again.complete
    assert again.skipped == [
        Skipped(2, "embedding with ID 2 already exists"),
        Skipped(3, "an all-zero vector has no direction in a cosine index"),
    ]

    upserted = client.upsert("docs", [[0, 0, 2], [1e30, 0, 0]], ids=[2, 5])
    assert upserted.stored == 1
    assert upserted.skipped[0].id == 5 and "norm is above 2^62" in upserted.skipped[0].reason
    assert client.stats("docs").count == 3
    assert client.retrieve("docs", [2]).vectors.tolist() == [[0.0, 0.0, 2.0]]  # replaced


def test_an_insert_with_a_body_the_server_refuses_raises_with_its_detail(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    with pytest.raises(InvalidRequestError) as refused:
        client.insert("docs", [[1, 2]], ids=[1], metadata=[{"text": "x" * 20_000}])  # past --metadata-bytes-max
    assert refused.value.detail is not None and refused.value.detail.startswith("embeddings[0].metadata"), refused.value.detail
    assert refused.value.result == WriteResult(1, 0, [])
    assert client.stats("docs").count == 0


def test_nan_and_infinity_are_refused_before_anything_is_sent(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"vectors\[1\]\[0\]"):
            client.upsert("docs", [[1.0, 2.0], [bad, 1.0]], ids=[1, 2])
        with pytest.raises(ValueError):
            client.search("docs", [bad, 1.0])
    assert client.stats("docs").count == 0


def test_empty_inputs_send_nothing_and_return_empty_results(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    assert client.upsert("docs", np.zeros((0, 2)), ids=[]) == WriteResult(0, 0, [])
    empty = client.retrieve("docs", [])
    assert len(empty) == 0 and empty.vectors.shape == (0, 0) and empty.missing == []
    assert client.delete("docs", []) == Deleted([], [])
    assert client.search_batch("docs", np.zeros((0, 2))) == []
    assert client.search("docs", [1.0, 2.0]) == []  # an empty index has no neighbours
    assert list(client.scroll("docs")) == []


# -- retrieve and delete: partial results -------------------------------------------------------


def test_retrieve_returns_found_rows_in_order_and_lists_missing_ids(client: Client) -> None:
    data = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    client.create_index("docs", 3, "l2")
    client.upsert("docs", data, ids=[10, 20, 30, 40], metadata=[{"n": "10"}, None, {"n": "30"}, None])

    found = client.retrieve("docs", [30, 99, 10, 30, -5])
    assert found.ids == [30, 10, 30]
    assert found.missing == [99, -5]
    assert found.vectors.dtype == np.float32 and found.vectors.shape == (3, 3)
    assert found.vectors.tolist() == [data[2].tolist(), data[0].tolist(), data[2].tolist()]
    assert found.metadata == [{"n": "30"}, {"n": "10"}, {"n": "30"}]
    rows = found.rows
    assert [r.id for r in rows] == [30, 10, 30] and rows[1].vector.tolist() == data[0].tolist()

    nothing = client.retrieve("docs", [1, 2])
    assert nothing.ids == [] and nothing.missing == [1, 2]


def test_delete_by_ids_returns_deleted_and_skipped_with_reasons(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    client.upsert("docs", np.ones((5, 2)), ids=range(5))
    outcome = client.delete("docs", [1, 7, 1, 3])
    assert outcome.deleted == [1, 3]
    assert outcome.skipped == [
        Skipped(7, "embedding with ID 7 does not exist"),
        Skipped(1, "embedding with ID 1 does not exist"),
    ]
    assert client.stats("docs").count == 3
    assert client.delete("docs", [0, 2]) == Deleted([0, 2], [])
    assert client.retrieve("docs", [0, 1, 2, 3, 4]).ids == [4]


def test_delete_by_filter_returns_the_count(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    years = [str(1990 + i) for i in range(30)]
    client.upsert("docs", np.ones((30, 2)), ids=range(30), metadata=[{"year": y} for y in years])
    assert client.delete_by_filter("docs", {"year": {"$gte": 2010}}) == 10
    assert client.stats("docs").count == 20
    assert client.delete_by_filter("docs", {"year": "1990"}) == 1
    assert client.delete_by_filter("docs", {"year": "1990"}) == 0
    assert client.delete_by_filter("docs", {}) == 19
    assert client.stats("docs").count == 0
    with pytest.raises(InvalidRequestError) as bad:
        client.delete_by_filter("docs", {"year": {"$gtt": 1}})
    assert bad.value.detail == "filter.year: unknown operator '$gtt'"


# -- exactness ------------------------------------------------------------------------------------


def test_vectors_round_trip_bit_exactly_through_the_server(client: Client) -> None:
    rng = np.random.default_rng(5)
    awkward = np.array(
        [
            [1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, -0.0, 0.0, 0.1, 1 / 3],
            [1.0000001, 16777217.0, 123456.79, -9.8765434e-20, 3e-45, 1e17, -2.5e17, 7.0],
        ],
        dtype=np.float32,
    )
    # Random bit patterns of every exponent, bounded so each vector's norm
    # stays inside the server's numeric domain (at most 2^62).
    patterns = random_float32_bits(rng, (300, 8), 1e17)
    data = np.vstack([awkward, patterns])
    ids = np.arange(len(data)) - 150
    client.create_index("exact", 8, "l2")
    assert client.upsert("exact", data, ids=ids).complete

    got = client.retrieve("exact", ids)
    assert got.ids == ids.tolist()
    assert bits(got.vectors) == bits(data)
    assert bits(got.vectors[0]) == bits(awkward[0])  # -0.0 and subnormals kept

    scrolled = list(client.scroll("exact", with_vectors=True, page_size=64))
    assert [r.id for r in scrolled] == ids.tolist()
    assert bits(np.stack([r.vector for r in scrolled])) == bits(data)

    hits = client.search("exact", data[1], k=3, with_vectors=True)
    assert hits[0].id == ids[1] and hits[0].score == 0.0
    for hit in hits:
        assert bits(hit.vector) == bits(data[ids.tolist().index(hit.id)])


def test_a_bad_metadata_value_fails_an_upload_before_any_request(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    metadata = [{"n": i} for i in range(4000)]
    metadata[3000] = {"n": {1, 2}}
    with pytest.raises(ValueError, match=r"metadata\[3000\]\['n'\]: set is not a metadata value"):
        client.upsert("docs", np.ones((4000, 2)), ids=range(4000), metadata=metadata, batch_rows=500, parallel=4)
    assert client.stats("docs").count == 0
    assert counter(client, 'route="upsert",status="200"') == 0
    # NumPy scalars are sent as the values they hold.
    given = {"i": np.int64(7), "f": np.float32(0.5), "b": np.bool_(True), "s": np.str_("x"), "l": ["a"]}
    client.upsert("docs", [1.0, 2.0], ids=[1], metadata=[given])
    assert client.retrieve("docs", [1]).metadata == [{"i": 7, "f": 0.5, "b": True, "s": "x", "l": ["a"]}]


def test_a_value_past_the_numeric_domain_is_skipped_with_its_reason(client: Client) -> None:
    client.create_index("docs", 2, "l2")
    outcome = client.upsert("docs", np.array([[1e38, 0.0], [1.0, 2.0]], dtype=np.float32), ids=[1, 2])
    assert outcome.stored == 1 and [s.id for s in outcome.skipped] == [1]
    assert "2^62" in outcome.skipped[0].reason


# -- search --------------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["cosine", "l2", "ip"])
def test_search_and_search_batch_match_a_brute_force_oracle(client: Client, metric: str) -> None:
    rows, dims = 1500, 24
    data = make_index(client, "vecs", dims, metric, rows, seed=11)
    ids = np.arange(rows)
    queries = np.random.default_rng(12).standard_normal((6, dims), dtype=np.float32)
    for query in queries[:3]:
        assert_hits_match(client.search("vecs", query, k=10), metric, data, ids, query, 10)
    assert_hits_match(client.search("vecs", queries[0], k=25, with_scores=False), metric, data, ids, queries[0], 25, with_scores=False)

    batch = client.search_batch("vecs", queries, k=7)
    assert len(batch) == len(queries)
    for query, hits in zip(queries, batch):
        assert_hits_match(hits, metric, data, ids, query, 7)
        assert hits == client.search("vecs", query, k=7)  # a batch answers as lone searches do


@pytest.mark.parametrize("metric", ["cosine", "l2", "ip"])
def test_filtered_search_matches_the_oracle_over_the_matching_rows(client: Client, metric: str) -> None:
    rows, dims = 1200, 16
    rng = np.random.default_rng(21)
    data = rng.standard_normal((rows, dims), dtype=np.float32)
    langs = rng.choice(["en", "fr", "de"], rows)
    years = rng.integers(1990, 2030, rows)
    metadata = [{"lang": str(lang), "year": str(year)} for lang, year in zip(langs, years)]
    client.create_index("vecs", dims, metric)
    client.upsert("vecs", data, ids=np.arange(rows), metadata=metadata)
    query = rng.standard_normal(dims, dtype=np.float32)

    where = {"lang": {"$in": ["en", "de"]}, "year": {"$gte": 2000, "$lt": 2020}}
    mask = np.isin(langs, ["en", "de"]) & (years >= 2000) & (years < 2020)
    hits = client.search("vecs", query, k=15, filter=where)
    assert_hits_match(hits, metric, data, np.arange(rows), query, 15, mask=mask)
    assert all(h.metadata["lang"] in ("en", "de") for h in hits)

    either = {"$or": [{"lang": "fr"}, {"$not": {"year": {"$lt": 2025}}}]}
    mask2 = (langs == "fr") | (years >= 2025)
    batch = client.search_batch("vecs", np.stack([query, -query]), k=5, filter=either)
    for q, hits2 in zip([query, -query], batch):
        assert_hits_match(hits2, metric, data, np.arange(rows), q, 5, mask=mask2)

    # k larger than the rows that match: all of them.
    few = client.search("vecs", query, k=10_000, filter={"year": "1990"})
    assert sorted(h.id for h in few) == np.flatnonzero(years == 1990).tolist()


def test_equal_scores_are_ordered_by_id(client: Client) -> None:
    client.create_index("ties", 3, "l2")
    client.upsert("ties", [[1, 2, 3]] * 4 + [[9, 9, 9]], ids=[50, -7, 12, 3, 1])
    hits = client.search("ties", [1, 2, 3], k=5)
    assert [h.id for h in hits] == [-7, 3, 12, 50, 1]
    assert [h.score for h in hits[:4]] == [0.0] * 4


def test_search_errors_carry_the_servers_reason(client: Client) -> None:
    client.create_index("docs", 4, "cosine")
    client.upsert("docs", np.eye(4), ids=range(4))
    with pytest.raises(SearchError) as wrong_length:
        client.search("docs", [1.0, 2.0, 3.0])
    assert wrong_length.value.status == 400
    assert wrong_length.value.description == "queryVector: expected 4 dimensions, got 3"
    with pytest.raises(SearchError) as zero:
        client.search("docs", [0.0, 0.0, 0.0, 0.0])
    assert "all-zero" in str(zero.value.description)
    with pytest.raises(InvalidRequestError) as bad_k:
        client.search("docs", [1.0, 0, 0, 0], k=0)
    assert bad_k.value.detail == "k: expected an integer from 1 to 10000"
    with pytest.raises(InvalidRequestError) as bad_filter:
        client.search("docs", [1.0, 0, 0, 0], filter={"year": {}})
    assert bad_filter.value.detail == "filter.year: expected at least one operator"
    with pytest.raises(SearchError) as batch:
        client.search_batch("docs", [[1.0, 0, 0, 0], [0.0, 0, 0, 0]])
    assert str(batch.value.description).startswith("searches[1].queryVector")


def test_search_batch_longer_than_the_server_takes_is_sent_in_parts(client: Client) -> None:
    data = make_index(client, "vecs", 4, "l2", 40)
    queries = np.random.default_rng(3).standard_normal((1100, 4), dtype=np.float32)
    results = client.search_batch("vecs", queries, k=2)
    assert len(results) == 1100
    for i in (0, 1023, 1024, 1099):
        assert_hits_match(results[i], "l2", data, np.arange(40), queries[i], 2)


def test_an_infinite_distance_scores_none(client: Client) -> None:
    # bc scores sum|x - q| / sum|x + q|: for [-1, -1] and the query [1, 1], x + q is 0.
    client.create_index("bray", 2, "bc")
    client.upsert("bray", [[1.0, 2.0], [-1.0, -1.0]], ids=[1, 2])
    expected = [(1, float(np.float32(0.2))), (2, None)]
    assert [(h.id, h.score) for h in client.search("bray", [1.0, 1.0], k=2)] == expected
    assert [(h.id, h.score) for h in client.search_batch("bray", [[1.0, 1.0]], k=2)[0]] == expected


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_search_batch_takes_searches_with_options_of_their_own(client: Client, metric: str) -> None:
    rows, dims = 1000, 12
    rng = np.random.default_rng(17)
    data = rng.standard_normal((rows, dims), dtype=np.float32)
    langs = rng.choice(["en", "fr", "de"], rows)
    client.create_index("vecs", dims, metric)
    client.upsert("vecs", data, ids=np.arange(rows), metadata=[{"lang": str(lang)} for lang in langs])
    ids, en, fr = np.arange(rows), langs == "en", langs == "fr"
    q = rng.standard_normal((5, dims), dtype=np.float32)
    searches = [
        Search(q[0]),  # the call's k and filter
        Search(q[1], 9),  # a k of its own
        Search(q[2], 3, filter={"lang": "fr"}),  # a filter of its own
        Search(q[3], filter={}, with_scores=False),  # every row, without scores
        Search(q[4], 2, with_vectors=True),
    ]
    results = client.search_batch("vecs", searches, k=4, filter={"lang": "en"})
    assert len(results) == 5
    assert_hits_match(results[0], metric, data, ids, q[0], 4, mask=en)
    assert_hits_match(results[1], metric, data, ids, q[1], 9, mask=en)
    assert_hits_match(results[2], metric, data, ids, q[2], 3, mask=fr)
    assert_hits_match(results[3], metric, data, ids, q[3], 4, with_scores=False)
    assert_hits_match(results[4], metric, data, ids, q[4], 2, mask=en)
    assert all(h.vector is not None and bits(h.vector) == bits(data[h.id]) for h in results[4])
    assert all(h.vector is None for h in results[0])
    assert results[2] == client.search("vecs", q[2], k=3, filter={"lang": "fr"})  # as each alone


# -- scroll -----------------------------------------------------------------------------------------


def test_scroll_visits_every_row_exactly_once_in_id_order(client: Client) -> None:
    rows = 2500
    rng = np.random.default_rng(8)
    ids = rng.permutation(np.unique(rng.integers(-(2**62), 2**62, rows * 2))[:rows])
    assert len(ids) == rows
    colors = rng.choice(["red", "blue"], rows)
    client.create_index("many", 4, "l2")
    client.upsert("many", rng.standard_normal((rows, 4)), ids=ids, metadata=[{"c": str(c)} for c in colors])

    listed = [row.id for row in client.scroll("many", page_size=300)]
    assert listed == sorted(ids.tolist())
    assert all(row.vector is None for row in client.scroll("many", page_size=1000))

    red = [row.id for row in client.scroll("many", filter={"c": "red"}, page_size=77)]
    assert red == sorted(ids[colors == "red"].tolist())

    middle = sorted(ids.tolist())[1000]
    after = [row.id for row in client.scroll("many", after=middle, page_size=500)]
    assert after == sorted(ids.tolist())[1001:]


# -- uploads ----------------------------------------------------------------------------------------


def test_a_parallel_upload_in_small_batches_lands_every_row(client: Client) -> None:
    rows, dims = 20_000, 64
    rng = np.random.default_rng(9)
    data = rng.standard_normal((rows, dims), dtype=np.float32)
    ids = rng.permutation(rows) * 3 + 1
    client.create_index("bulk", dims, "cosine")
    result = client.upsert("bulk", data, ids=ids, batch_rows=500, parallel=4)
    assert result == WriteResult(rows, rows, [])
    assert client.stats("bulk").count == rows
    sample = rng.choice(rows, 300, replace=False)
    got = client.retrieve("bulk", ids[sample])
    assert got.ids == ids[sample].tolist() and bits(got.vectors) == bits(data[sample])

    # The same rows again through insert: every one skipped as existing, and listed.
    again = client.insert("bulk", data[:1500], ids=ids[:1500], batch_rows=200, parallel=3)
    assert again.stored == 0 and len(again.skipped) == 1500
    assert sorted(s.id for s in again.skipped) == sorted(ids[:1500].tolist())


def test_a_byte_bound_splits_an_upload_into_many_requests(client: Client) -> None:
    data = np.random.default_rng(2).standard_normal((3000, 32), dtype=np.float32)
    client.create_index("bulk", 32, "l2")
    result = client.upsert("bulk", data.reshape(3, 1000, 32), ids=range(3000), batch_bytes=20_000, parallel=2)
    assert result.stored == 3000
    assert bits(client.retrieve("bulk", [0, 1999, 2999]).vectors) == bits(data[[0, 1999, 2999]])
    # One request per body of at most 20,000 bytes: ~1 MB of JSON in all.
    bodies = len(P.Upload(data, range(3000), None).body(0, 3000)) // 20_000
    assert bodies >= 40
    assert bodies <= counter(client, 'route="upsert",status="200"') < 2 * bodies


def stall_every_other_upsert(client: Client) -> None:
    """Makes requests sent together reach the server out of order: every other upsert waits 50 ms first."""
    send = client._exchange
    sent = itertools.count()

    def exchange(method: str, path: str, body: object) -> object:
        if path.endswith("/upsert") and next(sent) % 2 == 0:
            time.sleep(0.05)
        return send(method, path, body)  # type: ignore[arg-type]

    client._exchange = exchange  # type: ignore[method-assign,assignment]


def test_ids_repeated_across_batches_keep_their_last_row(client: Client) -> None:
    rows = 8000
    ids = np.arange(rows) % 500  # each id once in every batch of 500 rows
    vectors = np.stack([np.arange(rows), np.zeros(rows)], 1).astype(np.float32)  # [position, 0]
    client.create_index("dups", 2, "l2")
    stall_every_other_upsert(client)
    assert client.upsert("dups", vectors, ids=ids, batch_rows=500, parallel=4) == WriteResult(rows, rows, [])
    last = np.arange(500) + rows - 500
    assert client.retrieve("dups", range(500)).vectors[:, 0].tolist() == last.tolist()


def test_one_client_shared_by_eight_threads_searching_and_writing_at_once(client: Client) -> None:
    threads, rounds, rows, dims = 8, 3, 2000, 16
    rng = np.random.default_rng(13)
    base = rng.standard_normal((rows, dims), dtype=np.float32)
    client.create_index("shared", dims, "l2")
    client.upsert("shared", base, ids=range(rows), metadata=[{"part": "base"}] * rows)
    queries = rng.standard_normal((threads, rounds, dims), dtype=np.float32)
    # Each thread writes rows of its own; searches see the base rows alone,
    # so their answers do not depend on how the writes interleave.
    added = rng.standard_normal((threads, rounds * 100, dims), dtype=np.float32)
    start = threading.Barrier(threads)
    failures: list = []  # type: ignore[type-arg]

    def work(t: int) -> None:
        try:
            start.wait(timeout=10)
            for r in range(rounds):
                hits = client.search("shared", queries[t, r], k=5, filter={"part": "base"})
                assert [h.id for h in hits] == expected_ids("l2", base, range(rows), queries[t, r], 5)
                first = 10_000 + t * 1_000 + r * 100
                part = added[t, r * 100 : (r + 1) * 100]
                assert client.upsert("shared", part, ids=range(first, first + 100), batch_rows=30, parallel=2).complete
        except BaseException as exc:  # noqa: BLE001  (reported below, from the test's thread)
            failures.append(exc)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not any(worker.is_alive() for worker in workers)
    assert failures == []
    assert client.stats("shared").count == rows + threads * rounds * 100
    for t in range(threads):
        got = client.retrieve("shared", range(10_000 + t * 1_000, 10_000 + t * 1_000 + rounds * 100))
        assert bits(got.vectors) == bits(added[t])


def test_progress_bar_counts_rows(client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    import tqdm  # noqa: F401  (the [test] extra installs it: the bar is tested, never skipped)
    client.create_index("bulk", 8, "l2")
    client.upsert("bulk", np.ones((5000, 8)), ids=range(5000), batch_rows=1000, progress=True)
    err = capsys.readouterr().err
    assert "upsert" in err and "100%" in err and "rows" in err and "5.00k/5.00k" in err


def test_progress_without_tqdm_is_a_clear_error_before_sending(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    client.create_index("bulk", 2, "l2")
    with pytest.raises(ImportError, match=r"quiver-vectors\[progress\]"):
        client.upsert("bulk", np.ones((10, 2)), ids=range(10), progress=True)
    assert client.stats("bulk").count == 0


def test_errors_read_well(client: Client) -> None:
    with pytest.raises(QuiverError) as missing:
        client.stats("nope")
    assert str(missing.value) == (
        "500 INDEX_NOT_FETCHED: An error occurred while fetching the index. (index 'nope' does not exist)"
    )
