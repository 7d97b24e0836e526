"""`quiver_vectors.string_ids`' checks for the stores built on it (the mapping itself is tested by the stores)."""

from __future__ import annotations

import pytest
from conftest import Server

from quiver_vectors import AsyncClient, Client
from quiver_vectors import string_ids as S


def test_a_store_that_could_never_work_is_refused_when_made() -> None:
    with pytest.raises(ValueError, match="3 to 32 characters"):
        S.check_store("ab", 8)
    with pytest.raises(ValueError, match="3 to 32 characters"):
        S.check_store("Docs", 8)
    with pytest.raises(ValueError, match="probes_max must be at least 1"):
        S.check_store("docs", 0)
    S.check_store("docs-1", 1)


def test_clients_are_made_only_when_none_is_given() -> None:
    sync, asynchronous = Client("http://127.0.0.1:9"), AsyncClient("http://127.0.0.1:9")
    assert S.clients(sync, None, None, None) == (sync, None, False)
    assert S.clients(asynchronous, None, None, None) == (None, asynchronous, False)
    assert S.clients(sync, asynchronous, None, None) == (sync, asynchronous, False)
    with pytest.raises(ValueError, match="one of each kind"):
        S.clients(asynchronous, asynchronous, None, None)
    made_sync, made_async, owned = S.clients(None, None, "http://127.0.0.1:9", "key")
    assert isinstance(made_sync, Client) and isinstance(made_async, AsyncClient) and owned
    assert made_sync.url == made_async.url == "http://127.0.0.1:9"


def test_index_ready_creates_only_when_told_the_dimensions(server: Server) -> None:
    with server.client() as client:
        assert S.run(S.index_ready("docs", None, None, None), client) is None
        assert client.list_indexes() == []
        assert S.run(S.index_ready("docs", 3, "l2", None), client) == "l2"
        assert S.run(S.index_ready("docs", None, None, None), client) == "l2"
        with pytest.raises(ValueError, match="exists with metric 'l2', not 'cosine'"):
            S.run(S.index_ready("docs", 3, "cosine", None), client)
        with pytest.raises(ValueError, match="has 3 dimensions; the embeddings have 4"):
            S.run(S.index_ready("docs", 4, None, None), client)
