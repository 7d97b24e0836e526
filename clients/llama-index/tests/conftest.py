"""Starts the real quiver binary once for the tests (`quiver_vectors.testing`); each test gets a fresh index.

The binary is `$QUIVER_BIN`, else the repository's debug build. The server
listens on 127.0.0.1 on a free port, with a temporary data directory; a
server that does not start in time fails the run instead of hanging it.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import pytest
from quiver_vectors import Client, RetryPolicy, testing

from llama_index.vector_stores.quiver import QuiverVectorStore

KEY = "llama-index-quiver-test-key-0123456789"
BINARY = testing.binary(Path(__file__).resolve().parents[3] / "target" / "debug" / "quiver")
CLIENT_TIMEOUT_S = 20.0
TEST_RETRY = RetryPolicy(retries_max=2, backoff_s=0.02, backoff_max_s=0.1, time_max_s=1.0)


class Server(testing.Server):
    """One quiver process on 127.0.0.1, whose clients have the tests' timeout and retries."""

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("timeout_s", CLIENT_TIMEOUT_S)
        kwargs.setdefault("retry", TEST_RETRY)
        return super().client(**kwargs)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("quiver") / "data", binary=BINARY, key=KEY)
    yield running
    alive = running.alive()
    running.kill()
    assert alive, "quiver died during the tests:\n" + "".join(running.log)


_names = itertools.count()


@pytest.fixture
def index_name(server: Server) -> Iterator[str]:
    """A name no other test uses; the index (if a test made it) is deleted after the test."""
    name = f"li-{os.getpid()}-{next(_names)}"
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
    """Makes stores on the test's index (or `name=`); closes them after the test."""
    made: List[QuiverVectorStore] = []

    def make(name: Optional[str] = None, **kwargs: Any) -> QuiverVectorStore:
        store = QuiverVectorStore(name or index_name, url=server.url, api_key=server.key, **kwargs)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
