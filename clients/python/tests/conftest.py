"""Starts the real quiver binary for the tests: loopback only, a fresh data directory each.

The binary is `$QUIVER_BIN`, else the repository's debug build
(`../../target/debug/quiver` from this folder). Each test that takes the
`server` fixture gets a server of its own on a free port (`--port 0`; the
address is read from the "listening on" line of its log), so tests share
nothing. Every wait here is bounded: a server that does not start in time
fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import httpx
import pytest

from quiver_vectors import Client, RetryPolicy

KEY = "python-client-test-key-0123456789"
BINARY = os.environ.get(
    "QUIVER_BIN", str(Path(__file__).resolve().parent.parent.parent.parent / "target" / "debug" / "quiver")
)
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: Calls in tests fail within this, whatever goes wrong.
CLIENT_TIMEOUT_S = 20.0
#: Retries in tests: quick, and bounded well inside a test's time.
TEST_RETRY = RetryPolicy(retries_max=3, backoff_s=0.02, backoff_max_s=0.1, time_max_s=2.0)


class Server:
    """One quiver process on 127.0.0.1."""

    def __init__(self, data_dir: Path, args: Optional[List[str]] = None, port: int = 0) -> None:
        if not os.path.exists(BINARY):
            pytest.fail(f"no quiver binary at {BINARY}: build it, or set QUIVER_BIN")
        self.data_dir = data_dir
        self.key = KEY
        self.log: List[str] = []
        self.process = subprocess.Popen(
            [BINARY, "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir), "--api-key", KEY]
            + (args or []),
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump() -> None:
            # Keeps reading the log so the server never blocks on a full pipe.
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                pytest.fail("quiver did not start listening in time:\n" + "".join(self.log))
            if line is None:
                pytest.fail("quiver exited before listening:\n" + "".join(self.log))
            if "listening on " in line:
                self.address = line.split("listening on ")[1].split(",")[0]
                break
        self.url = f"http://{self.address}"
        self.port = int(self.address.rsplit(":", 1)[1])

    def client(self, **kwargs: object) -> Client:
        kwargs.setdefault("timeout_s", CLIENT_TIMEOUT_S)
        kwargs.setdefault("retry", TEST_RETRY)
        return Client(self.url, api_key=self.key, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def alive(self) -> bool:
        return self.process.poll() is None


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
