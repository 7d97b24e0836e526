"""Retries: idempotent calls come back after a broken connection or a 503; insert and index changes never do."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Iterator, List

import httpx
import numpy as np
import pytest
from conftest import KEY, StartServer, free_port
from fakeserver import FakeServer, Step

from quiver_vectors import (
    AsyncClient,
    Client,
    InvalidRequestError,
    QuiverConnectionError,
    QuiverError,
    RetryPolicy,
    UnavailableError,
)

QUICK = RetryPolicy(retries_max=3, backoff_s=0.01, backoff_max_s=0.05, time_max_s=5.0)
HEALTH = {"cpu_usage_percent": 1.0, "mem_usage_percent": 2.0, "uptime": "1s"}


@pytest.fixture
def fakes() -> Iterator[List[FakeServer]]:
    started: List[FakeServer] = []
    yield started
    for fake in started:
        fake.stop()


def fake(fakes: List[FakeServer], script: List[Step]) -> FakeServer:
    server = FakeServer(script, ok_data=HEALTH)
    fakes.append(server)
    return server


@pytest.mark.parametrize("transport", ["wire", "httpx"])
def test_a_broken_connection_is_retried_for_upsert_and_reads_but_never_for_insert(
    fakes: List[FakeServer], transport: str
) -> None:
    for name, call, attempts in [
        ("insert", lambda c: c.insert("docs", [1.0, 2.0], ids=[1]), 1),
        ("create_index", lambda c: c.create_index("docs", 2), 1),
        ("delete_index", lambda c: c.delete_index("docs"), 1),
        ("upsert", lambda c: c.upsert("docs", [1.0, 2.0], ids=[1]), 4),
        ("search", lambda c: c.search("docs", [1.0, 2.0]), 4),
        ("delete", lambda c: c.delete("docs", [1]), 4),
        ("retrieve", lambda c: c.retrieve("docs", [1]), 4),
    ]:
        server = fake(fakes, ["close"])
        with Client(server.url, api_key=KEY, retry=QUICK, transport=httpx.HTTPTransport() if transport == "httpx" else None) as client:
            with pytest.raises(QuiverConnectionError) as failed:
                call(client)
        assert failed.value.status is None and failed.value.code is None
        assert server.count == attempts, name


def test_503_is_retried_for_idempotent_calls_until_it_passes(fakes: List[FakeServer]) -> None:
    server = fake(fakes, [503, 503, "ok"])
    with Client(server.url, api_key=KEY, retry=QUICK) as client:
        assert client.health().uptime == "1s"
    assert server.count == 3


def test_503_is_raised_at_once_for_insert(fakes: List[FakeServer]) -> None:
    server = fake(fakes, [503, "ok"])
    with Client(server.url, api_key=KEY, retry=QUICK) as client:
        with pytest.raises(UnavailableError) as busy:
            client.insert("docs", [1.0], ids=[1])
    assert busy.value.status == 503 and busy.value.code == "TOO_MANY_CONNECTIONS"
    assert server.count == 1


def test_retries_stop_at_the_count_and_time_bounds(fakes: List[FakeServer]) -> None:
    server = fake(fakes, [503])
    with Client(server.url, api_key=KEY, retry=RetryPolicy(retries_max=2, backoff_s=0.01)) as client:
        with pytest.raises(UnavailableError):
            client.health()
    assert server.count == 3

    slow = fake(fakes, [503])
    policy = RetryPolicy(retries_max=1000, backoff_s=0.05, backoff_max_s=0.1, time_max_s=0.5)
    started = time.monotonic()
    with Client(slow.url, api_key=KEY, retry=policy) as client:
        with pytest.raises(UnavailableError):
            client.health()
    assert time.monotonic() - started < 2.0
    assert 2 <= slow.count < 100


def test_a_call_waits_for_a_server_that_is_starting(start_server: StartServer) -> None:
    port = free_port()
    threading.Timer(0.5, lambda: start_server(port=port)).start()
    policy = RetryPolicy(retries_max=100, backoff_s=0.05, backoff_max_s=0.2, time_max_s=20.0)
    started = time.monotonic()
    with Client(f"http://127.0.0.1:{port}", api_key=KEY, retry=policy) as client:
        assert client.list_indexes() == []
        client.create_index("docs", 2)
    assert time.monotonic() - started >= 0.4


def test_after_the_server_is_killed_insert_fails_at_once_and_upsert_gives_up_in_bounds(
    start_server: StartServer,
) -> None:
    server = start_server()
    policy = RetryPolicy(retries_max=3, backoff_s=0.1, backoff_max_s=0.2, time_max_s=3.0)
    with Client(server.url, api_key=KEY, retry=policy) as client:
        client.create_index("docs", 2, "l2")
        assert client.upsert("docs", [1.0, 2.0], ids=[1]).complete
        server.kill()

        started = time.monotonic()
        with pytest.raises(QuiverConnectionError):
            client.insert("docs", [1.0, 2.0], ids=[2])
        insert_s = time.monotonic() - started

        started = time.monotonic()
        with pytest.raises(QuiverConnectionError) as gave_up:
            client.upsert("docs", [1.0, 2.0], ids=[2])
        upsert_s = time.monotonic() - started
    assert insert_s < 0.1  # one refused connection, no backoff
    assert upsert_s < 3.5  # retried, within the policy's bounds
    assert isinstance(gave_up.value.__cause__, httpx.ConnectError)


def test_an_upload_that_fails_part_way_raises_with_what_was_stored(start_server: StartServer) -> None:
    # An upload in requests of 3 rows whose fourth request holds metadata the
    # server refuses whole (more entries than --metadata-entries-max).
    server = start_server(["--metadata-entries-max", "1"])
    with Client(server.url, api_key=KEY, retry=QUICK) as client:
        client.create_index("docs", 2, "l2")
        metadata = [None] * 9 + [{"a": "1", "b": "2"}] + [None] * 5
        with pytest.raises(InvalidRequestError) as failed:
            client.insert("docs", np.ones((15, 2)), ids=range(15), metadata=metadata, batch_rows=3, parallel=1)
        result = failed.value.result
        assert result.requested == 15 and result.stored == 9 and result.skipped == []
        assert result.stored_ranges == [(0, 9)]
        assert client.stats("docs").count == 9


def test_a_retrieve_that_fails_part_way_raises_with_the_rows_before_it(fakes: List[FakeServer]) -> None:
    # 1,500 ids are asked in two requests: the first answers a row, the second fails.
    row = {"embeddings": [{"id": 1, "data": [1.0, 2.0], "metadata": {"a": "b"}}]}
    server = FakeServer(["ok", 500], ok_data=row)
    fakes.append(server)
    with Client(server.url, api_key=KEY, retry=QUICK) as client:
        with pytest.raises(QuiverError) as failed:
            client.retrieve("docs", range(1500))
    got = failed.value.result
    assert (got.ids, got.vectors.tolist(), got.metadata, got.missing) == ([1], [[1.0, 2.0]], [{"a": "b"}], [])
    assert server.count == 2


def test_async_retries_follow_the_same_rules(fakes: List[FakeServer]) -> None:
    async def run() -> None:
        for call, attempts in [
            (lambda c: c.insert("docs", [1.0], ids=[1]), 1),
            (lambda c: c.upsert("docs", [1.0], ids=[1]), 4),
            (lambda c: c.stats("docs"), 4),
        ]:
            server = fake(fakes, ["close"])
            async with AsyncClient(server.url, api_key=KEY, retry=QUICK) as client:
                with pytest.raises(QuiverConnectionError):
                    await call(client)
            assert server.count == attempts
        busy = fake(fakes, [503, 503, "ok"])
        async with AsyncClient(busy.url, api_key=KEY, retry=QUICK) as client:
            assert (await client.health()).uptime == "1s"
        assert busy.count == 3

    asyncio.run(run())
