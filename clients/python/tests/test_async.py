"""Every endpoint through the async client, against the real server, over both ways of sending."""

from __future__ import annotations

import asyncio
import itertools
from typing import AsyncIterator

import httpx
import numpy as np
import pytest
from conftest import CLIENT_TIMEOUT_S, KEY, TEST_RETRY, Server
from oracle import assert_hits_match, bits, random_float32_bits

from quiver_vectors import (
    AsyncClient,
    AuthenticationError,
    ClusterError,
    Deleted,
    IndexExistsError,
    IndexNotFoundError,
    InvalidRequestError,
    SearchError,
    Skipped,
    WriteResult,
)

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["wire", "httpx"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def connect(server: Server, kind: str, **kwargs: object) -> AsyncClient:
    transport = httpx.AsyncHTTPTransport() if kind == "httpx" else None
    kwargs.setdefault("api_key", KEY)
    return AsyncClient(server.url, timeout_s=CLIENT_TIMEOUT_S, retry=TEST_RETRY, transport=transport, **kwargs)  # type: ignore[arg-type]


async def collect(rows: AsyncIterator) -> list:  # type: ignore[type-arg]
    return [row async for row in rows]


async def test_status_and_index_endpoints(server: Server, transport_kind: str) -> None:
    async with connect(server, transport_kind) as client:
        health = await client.health()
        assert health.cpu_usage_percent >= 0 and health.uptime
        await client.test_auth()
        assert (await client.cluster()).role == "single"
        with pytest.raises(ClusterError):
            await client.add_member(2, "127.0.0.1:7002")
        with pytest.raises(ClusterError):
            await client.remove_member(2)
        assert "quiver_" in await client.metrics()
        assert "paths" in await client.openapi()

        assert await client.list_indexes() == []
        await client.create_index("docs", 3, "cosine")
        await client.create_index("docs", 3, "cosine", exist_ok=True)
        with pytest.raises(IndexExistsError):
            await client.create_index("docs", 3, "cosine")
        stats = await client.stats("docs")
        assert (stats.name, stats.dimensions, stats.metric, stats.count) == ("docs", 3, "cosine", 0)
        assert await client.list_indexes() == ["docs"]
        await client.delete_index("docs")
        with pytest.raises(IndexNotFoundError):
            await client.delete_index("docs")
        await client.delete_index("docs", missing_ok=True)
        with pytest.raises(IndexNotFoundError) as missing:
            await client.stats("docs")
        assert missing.value.code == "INDEX_NOT_FETCHED"

    async with connect(server, transport_kind, api_key="wrong") as wrong:
        with pytest.raises(AuthenticationError) as refused:
            await wrong.list_indexes()
        assert (refused.value.status, refused.value.code) == (401, "INVALID_API_KEY")


async def test_writes_reads_and_partial_results(server: Server, transport_kind: str) -> None:
    async with connect(server, transport_kind) as client:
        await client.create_index("docs", 3, "cosine")
        assert await client.insert("docs", [[1, 0, 0], [0, 1, 0]], ids=[1, 2], metadata=[{"t": "a"}, None]) == (
            WriteResult(2, 2, [])
        )
        partial = await client.insert("docs", [[1, 1, 0], [0, 0, 0], [0, 0, 1]], ids=[2, 3, 4])
        assert partial.stored == 1 and [s.id for s in partial.skipped] == [2, 3]
        assert (await client.upsert("docs", [0, 0, 5], ids=2)).complete

        found = await client.retrieve("docs", [4, 9, 1])
        assert found.ids == [4, 1] and found.missing == [9]
        assert found.vectors.tolist() == [[0, 0, 1], [1, 0, 0]] and found.metadata == [{}, {"t": "a"}]

        deleted = await client.delete("docs", [4, 9])
        assert deleted == Deleted([4], [Skipped(9, "embedding with ID 9 does not exist")])
        assert await client.delete_by_filter("docs", {"t": "a"}) == 1
        assert [r.id for r in await collect(client.scroll("docs"))] == [2]

        with pytest.raises(InvalidRequestError) as bad:
            await client.search("docs", [1, 0, 0], k=0)
        assert bad.value.detail == "k: expected an integer from 1 to 10000"
        with pytest.raises(SearchError) as wrong_length:
            await client.search("docs", [1, 0])
        assert wrong_length.value.description == "queryVector: expected 3 dimensions, got 2"


@pytest.mark.parametrize("metric", ["cosine", "l2", "ip"])
async def test_search_and_search_batch_match_the_oracle(server: Server, transport_kind: str, metric: str) -> None:
    rng = np.random.default_rng(31)
    data = rng.standard_normal((1000, 20), dtype=np.float32)
    tags = rng.choice(["a", "b", "c"], 1000)
    queries = rng.standard_normal((5, 20), dtype=np.float32)
    async with connect(server, transport_kind) as client:
        await client.create_index("vecs", 20, metric)
        await client.upsert("vecs", data, ids=np.arange(1000), metadata=[{"tag": str(t)} for t in tags])
        for query in queries[:2]:
            assert_hits_match(await client.search("vecs", query, k=9), metric, data, np.arange(1000), query, 9)
        hits = await client.search("vecs", queries[2], k=12, filter={"tag": {"$ne": "a"}})
        assert_hits_match(hits, metric, data, np.arange(1000), queries[2], 12, mask=tags != "a")
        batch = await client.search_batch("vecs", queries, k=4)
        for query, result in zip(queries, batch):
            assert_hits_match(result, metric, data, np.arange(1000), query, 4)
        # Many searches at once on one client, each answered as alone.
        together = await asyncio.gather(*(client.search("vecs", q, k=4) for q in queries))
        assert together == batch


async def test_vectors_round_trip_bit_exactly(server: Server, transport_kind: str) -> None:
    data = random_float32_bits(np.random.default_rng(6), (200, 8), 1e17)
    data[0] = [1e-45, -0.0, 1.1754942e-38, 0.1, 1 / 3, 1.0000001, -2.5e17, 7.0]
    async with connect(server, transport_kind) as client:
        await client.create_index("exact", 8, "l2")
        assert (await client.upsert("exact", data, ids=range(200))).complete
        assert bits((await client.retrieve("exact", range(200))).vectors) == bits(data)
        rows = await collect(client.scroll("exact", with_vectors=True, page_size=33))
        assert [r.id for r in rows] == list(range(200))
        assert bits(np.stack([r.vector for r in rows])) == bits(data)
        hits = await client.search("exact", data[0], k=1, with_vectors=True)
        assert hits[0].id == 0 and bits(hits[0].vector) == bits(data[0])


async def test_a_parallel_upload_lands_every_row_and_scroll_lists_each_once(
    server: Server, transport_kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import tqdm  # noqa: F401  (the [test] extra installs it: the bar is tested, never skipped)
    rows, dims = 20_000, 64
    rng = np.random.default_rng(10)
    data = rng.standard_normal((rows, dims), dtype=np.float32)
    ids = rng.permutation(rows) - 5_000
    async with connect(server, transport_kind) as client:
        await client.create_index("bulk", dims, "l2")
        result = await client.upsert("bulk", data, ids=ids, batch_rows=400, parallel=4, progress=True)
        assert result == WriteResult(rows, rows, [])
        assert (await client.stats("bulk")).count == rows
        sample = rng.choice(rows, 250, replace=False)
        got = await client.retrieve("bulk", ids[sample])
        assert got.ids == ids[sample].tolist() and bits(got.vectors) == bits(data[sample])
        listed = [r.id for r in await collect(client.scroll("bulk", page_size=1500))]
        assert listed == sorted(ids.tolist())
    err = capsys.readouterr().err
    assert "100%" in err and "20.0k/20.0k" in err


async def test_nan_is_refused_before_sending(server: Server) -> None:
    async with connect(server, "wire") as client:
        await client.create_index("docs", 2, "l2")
        with pytest.raises(ValueError):
            await client.upsert("docs", [[np.nan, 1.0]], ids=[1])
        assert (await client.stats("docs")).count == 0


async def test_ids_repeated_across_batches_keep_their_last_row(server: Server, transport_kind: str) -> None:
    rows = 8000
    ids = np.arange(rows) % 500  # each id once in every batch of 500 rows
    vectors = np.stack([np.arange(rows), np.zeros(rows)], 1).astype(np.float32)  # [position, 0]
    async with connect(server, transport_kind) as client:
        await client.create_index("dups", 2, "l2")
        # Every other upsert waits 50 ms before it is sent: requests in flight
        # together would reach the server out of order.
        send, sent = client._exchange, itertools.count()

        async def exchange(method: str, path: str, body: object) -> object:
            if path.endswith("/upsert") and next(sent) % 2 == 0:
                await asyncio.sleep(0.05)
            return await send(method, path, body)  # type: ignore[arg-type]

        client._exchange = exchange  # type: ignore[method-assign,assignment]
        result = await client.upsert("dups", vectors, ids=ids, batch_rows=500, parallel=4)
        assert result == WriteResult(rows, rows, [])
        got = await client.retrieve("dups", range(500))
    assert got.vectors[:, 0].tolist() == (np.arange(500) + rows - 500).tolist()
