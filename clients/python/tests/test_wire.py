"""The default transport's connections: an answer sent before the body was read, idle connections the server closed, the deadline."""

from __future__ import annotations

import asyncio
import os
import resource
import time
from typing import Iterator, List

import httpx
import numpy as np
import pytest
from conftest import KEY, StartServer, counter
from fakeserver import FakeServer, Step

from quiver_vectors import AsyncClient, Client, QuiverConnectionError, RetryPolicy, WriteResult

NO_RETRY = RetryPolicy(retries_max=0)


@pytest.fixture
def fakes() -> Iterator[List[FakeServer]]:
    started: List[FakeServer] = []
    yield started
    for fake in started:
        fake.stop()


def fake(fakes: List[FakeServer], script: List[Step], **kwargs: object) -> FakeServer:
    server = FakeServer(script, **kwargs)  # type: ignore[arg-type]
    fakes.append(server)
    return server


# -- an answer before the body: 413 and close ----------------------------------------------------

#: Rows whose body (~16 MB) is more than the sockets between client and fake
#: buffer, so the client is still sending when the fake resets the connection.
EARLY_ROWS, EARLY_DIMS = 2000, 768
EARLY_BODY_MAX = 1_000_000


@pytest.mark.parametrize("transport", ["wire", "httpx"])
def test_a_413_sent_before_the_body_was_read_splits_the_upload(fakes: List[FakeServer], transport: str) -> None:
    server = fake(fakes, ["ok"], body_bytes_max=EARLY_BODY_MAX)
    data = np.random.default_rng(0).standard_normal((EARLY_ROWS, EARLY_DIMS), dtype=np.float32)
    with Client(
        server.url, api_key=KEY, retry=NO_RETRY, transport=httpx.HTTPTransport() if transport == "httpx" else None
    ) as client:
        result = client.insert("docs", data, ids=range(EARLY_ROWS), parallel=1)
    assert result == WriteResult(EARLY_ROWS, EARLY_ROWS, [])
    assert server.refused >= 2  # the first body, then its first half, were refused
    assert server.count >= EARLY_ROWS * EARLY_DIMS * 9 // EARLY_BODY_MAX  # sent again in parts that fit


def test_a_413_sent_before_the_body_was_read_splits_an_async_upload(fakes: List[FakeServer]) -> None:
    server = fake(fakes, ["ok"], body_bytes_max=EARLY_BODY_MAX)
    data = np.random.default_rng(0).standard_normal((EARLY_ROWS, EARLY_DIMS), dtype=np.float32)

    async def run() -> WriteResult:
        async with AsyncClient(server.url, api_key=KEY, retry=NO_RETRY) as client:
            return await client.insert("docs", data, ids=range(EARLY_ROWS), parallel=1)

    assert asyncio.run(run()) == WriteResult(EARLY_ROWS, EARLY_ROWS, [])
    assert server.refused >= 2


# -- the deadline of an exchange ---------------------------------------------------------------


def test_timeout_s_bounds_a_whole_reply_not_each_read(fakes: List[FakeServer]) -> None:
    # The fake sends its ~100-byte answer a byte every 20 ms: each read is
    # quick, the whole answer takes two seconds.
    server = fake(fakes, ["trickle"], ok_data={"cpu_usage_percent": 1.0, "mem_usage_percent": 2.0, "uptime": "1s"})
    with Client(server.url, api_key=KEY, retry=NO_RETRY, timeout_s=0.3) as client:
        started = time.monotonic()
        with pytest.raises(QuiverConnectionError) as slow:
            client.health()
        took = time.monotonic() - started
    assert isinstance(slow.value.__cause__, httpx.ReadTimeout)
    assert 0.25 <= took < 1.0

    async def run() -> None:
        async with AsyncClient(server.url, api_key=KEY, retry=NO_RETRY, timeout_s=0.3) as client:
            with pytest.raises(QuiverConnectionError):
                await client.health()

    started = time.monotonic()
    asyncio.run(run())
    assert time.monotonic() - started < 1.0


# -- idle connections ------------------------------------------------------------------------------


def accepted(client: Client) -> int:
    return counter(client, "", name="quiver_connections_accepted_total")


def test_idle_connections_are_reused_when_descriptors_pass_1024(start_server: StartServer) -> None:
    server = start_server()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files ({hard}) is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the client's sockets come after
    try:
        with Client(server.url, api_key=KEY) as client:
            before = accepted(client)
            for _ in range(20):
                client.list_indexes()
            assert accepted(client) == before  # every call on the first connection
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_connection_the_server_closed_while_idle_is_not_reused(start_server: StartServer) -> None:
    # Insert and create_index are never retried: sent on a connection the
    # server has closed, they would fail.
    server = start_server(["--idle-timeout-ms", "200"])
    with Client(server.url, api_key=KEY, retry=NO_RETRY) as client:
        client.create_index("docs", 2, "l2")
        time.sleep(0.6)
        assert client.insert("docs", [1.0, 2.0], ids=[1]).complete

    async def run() -> None:
        async with AsyncClient(server.url, api_key=KEY, retry=NO_RETRY) as client:
            await client.stats("docs")
            await asyncio.sleep(0.6)  # the event loop is free while the server closes
            assert (await client.insert("docs", [1.0, 2.0], ids=[2])).complete
            await client.stats("docs")
            time.sleep(0.6)  # the event loop is busy while the server closes
            await client.create_index("other", 2, "l2")

    asyncio.run(run())
