"""Typed metadata (numbers, booleans, lists of strings beside strings) and the `$contains` filter.

The client passes metadata through as JSON, as the server stores it: the
values come back with their types, and filters compare by type.
"""

from __future__ import annotations

import asyncio
from typing import Iterator

import numpy as np
import pytest
from conftest import KEY, Server

from quiver_vectors import AsyncClient, Client

ROWS = [
    {"title": "a", "year": 2001, "score": 0.5, "draft": True, "tags": ["x", "y"]},
    {"title": "b", "year": 2015, "score": 2.25, "draft": False, "tags": ["y"]},
    {"title": "c", "year": 2023, "score": -1.0, "draft": False, "tags": []},
    {"title": "d", "year": "1999", "draft": True, "tags": ["x"]},
]


@pytest.fixture
def typed(server: Server) -> Iterator[Client]:
    with server.client() as client:
        client.create_index("typed", 2, "l2")
        vectors = np.arange(len(ROWS) * 2, dtype=np.float32).reshape(-1, 2)
        assert client.upsert("typed", vectors, ids=range(len(ROWS)), metadata=ROWS).complete
        yield client


def test_typed_values_come_back_with_their_types(typed: Client) -> None:
    got = typed.retrieve("typed", range(len(ROWS)))
    assert got.metadata == ROWS
    assert type(got.metadata[0]["year"]) is int and type(got.metadata[0]["draft"]) is bool
    assert [r.metadata for r in typed.scroll("typed")] == ROWS
    hits = typed.search("typed", [0.0, 1.0], k=1)
    assert hits[0].metadata == ROWS[0]


def test_filters_on_typed_values(typed: Client) -> None:
    def ids(filter: dict) -> list:  # type: ignore[type-arg]
        return sorted(r.id for r in typed.scroll("typed", filter=filter))

    assert ids({"year": {"$gte": 2010}}) == [1, 2]
    assert ids({"year": {"$lt": 2000}}) == [3]  # a numeric string still reads as a number
    assert ids({"draft": True}) == [0, 3]
    assert ids({"score": {"$gt": 0}}) == [0, 1]
    assert ids({"tags": {"$contains": "x"}}) == [0, 3]
    assert ids({"tags": {"$contains": "y"}, "draft": False}) == [1]
    assert typed.delete_by_filter("typed", {"tags": {"$contains": "x"}}) == 2
    assert typed.stats("typed").count == 2


def test_async_client_passes_typed_values_through(typed: Client, server: Server) -> None:
    async def run() -> None:
        async with AsyncClient(server.url, api_key=KEY) as client:
            await client.upsert("typed", [9.0, 9.0], ids=[42], metadata=[{"n": 3.5, "ok": False, "l": ["q"]}])
            assert (await client.retrieve("typed", [42])).metadata == [{"n": 3.5, "ok": False, "l": ["q"]}]

    asyncio.run(run())
