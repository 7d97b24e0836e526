"""Servers started with small limits: the client splits its requests to fit, and says so when it cannot."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from conftest import KEY, StartServer, counter
from oracle import assert_hits_match, bits

from quiver_vectors import (
    AsyncClient,
    Client,
    InvalidRequestError,
    ReplyTooLargeError,
    RequestTooLargeError,
    Search,
    WriteResult,
)


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


def test_a_parallel_upload_that_fails_part_way_says_which_rows_are_stored(start_server: StartServer) -> None:
    # Rows 0..3999 in requests of 500, 4 at a time; the request holding row
    # 2100 has metadata the server refuses whole (more entries than allowed).
    server = start_server(["--metadata-entries-max", "1"])
    rows = 4000
    data = np.random.default_rng(6).standard_normal((rows, 4), dtype=np.float32)
    metadata = [None] * rows
    metadata[2100] = {"a": "1", "b": "2"}
    with Client(server.url, api_key=KEY) as client:
        client.create_index("docs", 4, "l2")
        with pytest.raises(InvalidRequestError) as failed:
            client.upsert("docs", data, ids=range(rows), metadata=metadata, batch_rows=500, parallel=4)
        result = failed.value.result
        stored = np.zeros(rows, dtype=bool)
        for lo, hi in result.stored_ranges:
            stored[lo:hi] = True
        assert not stored[2000:2500].any()
        assert result.stored == stored.sum() and result.skipped == []
        # Exactly the rows the ranges name are on the server.
        on_server = [row.id for row in client.scroll("docs", page_size=10_000)]
        assert on_server == np.flatnonzero(stored).tolist()
        # Resuming: the other rows, the bad one mended.
        metadata[2100] = {"a": "1"}
        rest = np.flatnonzero(~stored)
        again = client.upsert("docs", data[rest], ids=rest, metadata=[metadata[i] for i in rest], parallel=4)
        assert again.complete and client.stats("docs").count == rows
        assert bits(client.retrieve("docs", range(rows)).vectors) == bits(data)


def refused_batches(client: Client) -> int:
    return counter(client, 'route="search_batch",status="400"')


def test_a_search_batch_past_the_reply_limit_is_cut_by_the_hits_that_fit(start_server: StartServer) -> None:
    server = start_server(["--reply-bytes-max", "65536"])
    rng = np.random.default_rng(8)
    data = rng.standard_normal((500, 4), dtype=np.float32)
    with Client(server.url, api_key=KEY) as client:
        client.create_index("vecs", 4, "l2")
        client.upsert("vecs", data, ids=range(500), metadata=[{"t": "x" * 40}] * 500)
        # ~150 bytes a hit: about 10 searches of k=40 fit a reply, not 200.
        queries = rng.standard_normal((200, 4), dtype=np.float32)
        results = client.search_batch("vecs", queries, k=40)
        for query, hits in zip(queries, results):
            assert_hits_match(hits, "l2", data, np.arange(500), query, 40)
        # The server's quick check, then its exact one (hits read as searches took 5).
        assert refused_batches(client) <= 2
        # Each search its own k: cut where the k's add up to what fits.
        searches = [Search(q, k) for q, k in zip(queries[:60], itertools.cycle([5, 60, 20]))]
        before = refused_batches(client)
        own = client.search_batch("vecs", searches)
        for search, hits in zip(searches, own):
            assert_hits_match(hits, "l2", data, np.arange(500), search.vector, search.k)
        assert refused_batches(client) - before <= 2

        # k=500 of 500 rows: one search's hits are more than fit. Once a
        # refusal names fewer hits than one k, that search is tried alone, once.
        before = refused_batches(client)
        with pytest.raises(ReplyTooLargeError):
            client.search_batch("vecs", queries[:50], k=500)
        assert refused_batches(client) - before <= 3  # not halving 50 searches down to 1

    server = start_server(["--reply-bytes-max", "65536"])
    with Client(server.url, api_key=KEY) as client:
        # One hit with its 8,192 values is more than a reply holds: "not even
        # one of the hits fits", raised at the first refusal.
        client.create_index("wide", 8192, "l2")
        client.upsert("wide", rng.standard_normal((3, 8192), dtype=np.float32), ids=range(3))
        with pytest.raises(ReplyTooLargeError) as none_fit:
            client.search_batch("wide", rng.standard_normal((50, 8192), dtype=np.float32), k=1, with_vectors=True)
        assert "not even one" in str(none_fit.value.description)
        assert refused_batches(client) == 1
