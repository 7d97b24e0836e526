"""Starts the real quiver binary for the tests (`quiver_vectors.testing`): loopback only, a fresh data directory each.

The binary is `$QUIVER_BIN`, else the repository's debug build. Each test
that takes the `server` fixture gets a server of its own on a free port, so
tests share nothing. Every wait is bounded: a server that does not start in
time fails the test instead of hanging it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import httpx
import pytest

from quiver_vectors import Client, RetryPolicy, testing

KEY = "python-client-test-key-0123456789"
BINARY = testing.binary(Path(__file__).resolve().parents[3] / "target" / "debug" / "quiver")
#: Calls in tests fail within this, whatever goes wrong.
CLIENT_TIMEOUT_S = 20.0
#: Retries in tests: quick, and bounded well inside a test's time.
TEST_RETRY = RetryPolicy(retries_max=3, backoff_s=0.02, backoff_max_s=0.1, time_max_s=2.0)


class Server(testing.Server):
    """One quiver process on 127.0.0.1, whose clients have the tests' timeout and retries."""

    def __init__(self, data_dir: Path, args: Optional[List[str]] = None, port: int = 0) -> None:
        super().__init__(data_dir, binary=BINARY, args=args or [], key=KEY, port=port)

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("timeout_s", CLIENT_TIMEOUT_S)
        kwargs.setdefault("retry", TEST_RETRY)
        return super().client(**kwargs)


StartServer = Callable[..., "Server"]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Starts servers with extra flags; every one is stopped after the test."""
    started: List[Server] = []

    def start(args: Optional[List[str]] = None, port: int = 0, data_dir: Optional[Path] = None) -> Server:
        server = Server(data_dir or tmp_path / f"data{len(started)}", args, port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def server(start_server: StartServer) -> Iterator[Server]:
    running = start_server()
    yield running
    assert running.alive(), "quiver died during the test:\n" + "".join(running.log)


@pytest.fixture(params=["wire", "httpx"])
def client(request: pytest.FixtureRequest, server: Server) -> Iterator[Client]:
    """A sync client over each way of sending: the default wire path, and an httpx transport."""
    transport = httpx.HTTPTransport() if request.param == "httpx" else None
    with server.client(transport=transport) as c:
        yield c


@pytest.fixture
def wire_client(server: Server) -> Iterator[Client]:
    with server.client() as c:
        yield c


def counter(client: Client, labels: str, name: str = "quiver_requests_total") -> int:
    """A counter from the server's metrics, e.g. ``counter(c, 'route="upsert",status="200"')`` (0 when never counted)."""
    prefix = name + ("{" + labels + "}" if labels else "") + " "
    for line in client.metrics().splitlines():
        if line.startswith(prefix):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def free_port() -> int:
    """A port free a moment ago, for tests that must know it before a server takes it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
