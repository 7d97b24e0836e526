"""Starts the real quiver binary once for the tests; each test gets a fresh index.

The binary is `$QUIVER_BIN`, else the repository's debug build
(`../../../target/debug/quiver` from this folder). The server listens on
127.0.0.1 on a free port (`--port 0`; the address is read from the
"listening on" line of its log) with a temporary data directory. Every wait is
bounded: a server that does not start in time fails the run instead of
hanging it.
"""

from __future__ import annotations

import itertools
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest
from langchain_core.embeddings import Embeddings
from quiver_vectors import Client, RetryPolicy

from langchain_quiver import QuiverVectorStore

KEY = "langchain-quiver-test-key-0123456789"
BINARY = os.environ.get(
    "QUIVER_BIN", str(Path(__file__).resolve().parent / ".." / ".." / ".." / "target" / "debug" / "quiver")
)
START_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 20.0
TEST_RETRY = RetryPolicy(retries_max=2, backoff_s=0.02, backoff_max_s=0.1, time_max_s=1.0)


class Server:
    """One quiver process on 127.0.0.1."""

    def __init__(self, data_dir: Path) -> None:
        if not os.path.exists(BINARY):
            pytest.fail(f"no quiver binary at {BINARY}: build it, or set QUIVER_BIN")
        self.key = KEY
        self.log: List[str] = []
        self.process = subprocess.Popen(
            [BINARY, "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), "--api-key", KEY],
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
                self.stop()
                pytest.fail("quiver did not start listening in time:\n" + "".join(self.log))
            if line is None:
                pytest.fail("quiver exited before listening:\n" + "".join(self.log))
            if "listening on " in line:
                self.url = "http://" + line.split("listening on ")[1].split(",")[0].strip()
                break

    def client(self) -> Client:
        return Client(self.url, api_key=self.key, timeout_s=CLIENT_TIMEOUT_S, retry=TEST_RETRY)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("quiver") / "data")
    yield running
    alive = running.process.poll() is None
    running.stop()
    assert alive, "quiver died during the tests:\n" + "".join(running.log)


_names = itertools.count()


@pytest.fixture
def index_name(server: Server) -> Iterator[str]:
    """A name no other test uses; the index (if a test made it) is deleted after the test."""
    name = f"lc-{os.getpid()}-{next(_names)}"
    yield name
    with server.client() as client:
        client.delete_index(name, missing_ok=True)


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with server.client() as c:
        yield c


MakeStore = Callable[..., QuiverVectorStore]


@pytest.fixture
def make_store(server: Server, index_name: str) -> Iterator[MakeStore]:
    """Makes stores on the test's index (or `name=`) from a table of vectors; closes them after the test."""
    made: List[QuiverVectorStore] = []

    def make(table: Dict[str, Sequence[float]], name: Optional[str] = None, **kwargs: Any) -> QuiverVectorStore:
        store = QuiverVectorStore(
            TableEmbeddings(table), name or index_name, url=server.url, api_key=server.key, **kwargs
        )
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


class TableEmbeddings(Embeddings):
    """Embeddings read from a table: the tests choose every vector, so a NumPy oracle can score them."""

    def __init__(self, table: Dict[str, Sequence[float]]) -> None:
        self.table = {text: list(map(float, vector)) for text, vector in table.items()}

    def embed_documents(self, texts: List[str]) -> List[List[float]]:
        return [self.table[t] for t in texts]

    def embed_query(self, text: str) -> List[float]:
        return self.table[text]
