"""Servers started with small limits: the client splits its requests to fit, and says so when it cannot."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import KEY, StartServer
from oracle import assert_hits_match, bits

from quiver_vectors import AsyncClient, Client, ReplyTooLargeError, RequestTooLargeError, WriteResult


def counter(client: Client, labels: str) -> int:
    """A request counter from the server's metrics (0 when it has not counted any)."""
    for line in client.metrics().splitlines():
        if line.startswith("quiver_requests_total{" + labels + "}"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_an_upload_past_the_body_limit_is_split_on_413_until_it_fits(start_server: StartServer) -> None:
    server = start_server(["--body-bytes-max", "65536"])
    data = np.random.default_rng(1).standard_normal((3000, 32), dtype=np.float32)  # ~1 MB of JSON
    with Client(server.url, api_key=KEY) as client:
        client.create_index("bulk", 32, "l2")
        # Insert too: a refused body stored nothing, so sending its rows again is safe.
        assert client.insert("bulk", data, ids=range(3000), parallel=3) == WriteResult(3000, 3000, [])
        assert client.stats("bulk").count == 3000
        assert bits(client.retrieve("bulk", range(3000)).vectors) == bits(data)
        # It did go through the 413s: the server counted them, and many inserts.
        assert counter(client, 'route="none",status="413"') >= 1
        assert counter(client, 'route="insert",status="200"') > 16


def test_a_single_row_past_the_body_limit_raises_413_with_what_was_stored(start_server: StartServer) -> None:
    server = start_server(["--body-bytes-max", "65536"])
    with Client(server.url, api_key=KEY) as client:
        client.create_index("wide", 8192, "l2")
        rows = np.random.default_rng(2).standard_normal((3, 8192), dtype=np.float32)  # ~90 KB a row
        with pytest.raises(RequestTooLargeError) as too_large:
            client.upsert("wide", rows, ids=[1, 2, 3], parallel=1)
        assert (too_large.value.status, too_large.value.code) == (413, "REQUEST_TOO_LARGE")
        assert too_large.value.result.stored == 0
        assert client.stats("wide").count == 0


def test_requests_follow_a_smaller_items_limit(start_server: StartServer) -> None:
    server = start_server(["--items-max", "100", "--search-batch-max", "3"])
    data = np.random.default_rng(3).standard_normal((1000, 8), dtype=np.float32)
    with Client(server.url, api_key=KEY) as client:
        client.create_index("vecs", 8, "l2")
        assert client.upsert("vecs", data, ids=range(1000)).stored == 1000
        got = client.retrieve("vecs", range(999, -1, -1))
        assert got.ids == list(range(999, -1, -1)) and bits(got.vectors) == bits(data[::-1])
        queries = data[:10] + 0.5
        results = client.search_batch("vecs", queries, k=4)
        assert len(results) == 10
        for query, hits in zip(queries, results):
            assert_hits_match(hits, "l2", data, np.arange(1000), query, 4)
        outcome = client.delete("vecs", range(0, 2000, 2))
        assert outcome.deleted == list(range(0, 1000, 2)) and len(outcome.skipped) == 500
        assert client.stats("vecs").count == 500


def test_a_retrieve_past_the_reply_limit_is_asked_for_in_parts(start_server: StartServer) -> None:
    server = start_server(["--reply-bytes-max", "65536"])
    data = np.random.default_rng(4).standard_normal((120, 512), dtype=np.float32)  # ~5.5 KB a row
    with Client(server.url, api_key=KEY) as client:
        client.create_index("wide", 512, "l2")
        client.upsert("wide", data, ids=range(120))
        got = client.retrieve("wide", range(120))
        assert got.ids == list(range(120)) and bits(got.vectors) == bits(data)
        scrolled = list(client.scroll("wide", with_vectors=True, page_size=10_000))
        assert [r.id for r in scrolled] == list(range(120))  # pages stop short by themselves
        with pytest.raises(ReplyTooLargeError) as too_many:
            client.search("wide", data[0], k=120, with_vectors=True)
        assert "fit" in str(too_many.value.description) or "at most" in str(too_many.value.description)


def test_the_async_client_splits_the_same_way(start_server: StartServer) -> None:
    server = start_server(["--body-bytes-max", "65536", "--items-max", "100"])
    data = np.random.default_rng(5).standard_normal((2000, 32), dtype=np.float32)

    async def run() -> None:
        async with AsyncClient(server.url, api_key=KEY) as client:
            await client.create_index("bulk", 32, "l2")
            assert (await client.insert("bulk", data, ids=range(2000), parallel=3)).stored == 2000
            got = await client.retrieve("bulk", range(2000))
            assert bits(got.vectors) == bits(data)
            assert len((await client.delete("bulk", range(300))).deleted) == 300

    asyncio.run(run())
