"""String ids on integer row ids: where rows land, collisions forced by an injected hash, races, repairs."""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List

import numpy as np
import pytest
from conftest import MakeStore
from langchain_core.documents import Document
from quiver_vectors import Client

from langchain_quiver import NotStoredError, blake2b_slot
from quiver_vectors import string_ids as S

TABLE = {t: v for t, v in zip("abcdefgh", np.random.default_rng(5).standard_normal((8, 3)).tolist())}


def rows(client: Client, name: str) -> Dict[int, str]:
    """Row id -> the string id it holds, for every row of the index."""
    return {r.id: r.metadata["_lc_id"] for r in client.scroll(name)}


def linear(doc_id: str, probe: int) -> int:
    """Every id collides with every other: probe n of any id is row n."""
    return probe


def test_default_hash_is_blake2b_64_of_the_id_then_of_probe_nul_id() -> None:
    def oracle(data: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)

    assert blake2b_slot("doc-1", 0) == oracle(b"doc-1")
    assert blake2b_slot("doc-1", 3) == oracle(b"3\x00doc-1")
    assert blake2b_slot("ü", 0) == oracle("ü".encode("utf-8"))
    assert len({blake2b_slot(str(i), 0) for i in range(10_000)}) == 10_000


def test_a_new_document_lands_on_its_first_probe(make_store: MakeStore, index_name: str, client: Client) -> None:
    store = make_store(TABLE)
    store.add_texts(["a", "b"], ids=["id-a", "id-b"])
    assert rows(client, index_name) == {blake2b_slot("id-a", 0): "id-a", blake2b_slot("id-b", 0): "id-b"}


def test_colliding_documents_are_stored_fetched_overwritten_and_deleted_independently(
    make_store: MakeStore, index_name: str, client: Client
) -> None:
    store = make_store(TABLE, slot_hash=linear)
    store.add_texts(["a", "b", "c"], [{"n": 1}, {"n": 2}, {"n": 3}], ids=["A", "B", "C"])
    assert rows(client, index_name) == {0: "A", 1: "B", 2: "C"}
    assert [d.metadata["n"] for d in store.get_by_ids(["C", "A", "B"])] == [3, 1, 2]

    # Overwrite B in place: same row, new content; A and C untouched.
    store.add_texts(["d"], [{"n": 20}], ids=["B"])
    assert rows(client, index_name) == {0: "A", 1: "B", 2: "C"}
    assert store.get_by_ids(["A", "B", "C"]) == [
        Document(id="A", page_content="a", metadata={"n": 1}),
        Document(id="B", page_content="d", metadata={"n": 20}),
        Document(id="C", page_content="c", metadata={"n": 3}),
    ]

    # Delete A: row 0 is free, and C (whose probes pass through it) is still found.
    store.delete(["A"])
    assert rows(client, index_name) == {1: "B", 2: "C"}
    assert [d.id for d in store.get_by_ids(["A", "B", "C"])] == ["B", "C"]

    # A new document takes the freed row; overwriting C does not move it there.
    store.add_texts(["e", "f"], ids=["E", "C"])
    assert rows(client, index_name) == {0: "E", 1: "B", 2: "C"}
    assert store.get_by_ids(["C"])[0].page_content == "f"

    # Search sees each document once, with its own content.
    assert sorted(d.id for d in store.similarity_search("a", k=10)) == ["B", "C", "E"]  # type: ignore[type-var]
    store.delete(["B", "E"])
    assert rows(client, index_name) == {2: "C"}


def test_a_hash_into_four_values_fills_four_rows_then_reports_the_fifth(
    make_store: MakeStore, index_name: str, client: Client
) -> None:
    store = make_store(TABLE, slot_hash=lambda s, n: blake2b_slot(s, n) % 4, probes_max=64)
    store.add_texts(["a", "b", "c", "d"], ids=["1", "2", "3", "4"])
    assert sorted(rows(client, index_name)) == [0, 1, 2, 3]
    assert sorted(rows(client, index_name).values()) == ["1", "2", "3", "4"]

    with pytest.raises(NotStoredError) as raised:
        store.add_texts(["e", "a"], ids=["5", "1"])  # 5 has no room; 1 is an overwrite and goes through
    assert raised.value.failures == {"5": "no free row id in 64 probes"}
    assert store.get_by_ids(["1"])[0].page_content == "a"
    assert len(rows(client, index_name)) == 4


def test_the_same_id_twice_in_one_call_keeps_the_last(make_store: MakeStore, index_name: str, client: Client) -> None:
    store = make_store(TABLE, slot_hash=linear)
    assert store.add_texts(["a", "b", "c"], ids=["X", "Y", "X"]) == ["X", "Y", "X"]
    assert rows(client, index_name) == {0: "X", 1: "Y"}  # one row for X, holding the last
    assert store.get_by_ids(["X"])[0].page_content == "c"


def test_a_bad_slot_hash_is_refused(make_store: MakeStore) -> None:
    store = make_store(TABLE, slot_hash=lambda s, n: 2**63)
    with pytest.raises(ValueError, match="expected a signed 64-bit integer"):
        store.add_texts(["a"])


# -- Races, simulated by writing between a plan's calls --------------------------------------------


def run_with_interference(plan: "S.Plan[Any]", client: Client, before_insert: Any) -> Any:
    """`string_ids.run`, with `before_insert()` called once just before the plan's first insert."""
    value: Any = None
    fired = False
    while True:
        try:
            call = plan.send(value)
        except StopIteration as done:
            return done.value
        if call.method == "insert" and not fired:
            fired = True
            before_insert()
        value = getattr(client, call.method)(*call.args, **call.kwargs)
        if call.method == "scroll":
            value = list(value)


def write_plan(name: str, doc_ids: List[str], texts: List[str]) -> "S.Plan[None]":
    vectors = np.array([TABLE[t] for t in texts])
    metadata = [{"_lc_id": i, "_lc_text": t} for i, t in zip(doc_ids, texts)]
    return S.write(name, "_lc_id", doc_ids, vectors, metadata, linear, 8)


def test_a_writer_that_adds_the_same_new_id_first_is_overwritten_not_duplicated(
    make_store: MakeStore, index_name: str, client: Client
) -> None:
    store = make_store(TABLE, slot_hash=linear)
    store.add_texts(["a"], ids=["A"])  # row 0

    def other_writer() -> None:  # places X on row 1 after our lookup missed it
        make_store(TABLE, slot_hash=linear).add_texts(["b"], ids=["X"])

    run_with_interference(write_plan(index_name, ["X"], ["c"]), client, other_writer)
    assert rows(client, index_name) == {0: "A", 1: "X"}
    assert store.get_by_ids(["X"])[0].page_content == "c"  # the later write wins


def test_a_writer_that_takes_our_slot_for_another_id_makes_us_probe_on(
    make_store: MakeStore, index_name: str, client: Client
) -> None:
    def other_writer() -> None:
        make_store(TABLE, slot_hash=linear).add_texts(["b"], ids=["Y"])  # row 0

    make_store(TABLE, slot_hash=linear).add_texts(["h"], ids=["seed"])  # creates the index
    make_store(TABLE, slot_hash=linear).delete(["seed"])
    run_with_interference(write_plan(index_name, ["X"], ["c"]), client, other_writer)
    assert rows(client, index_name) == {0: "Y", 1: "X"}


def test_duplicate_rows_left_by_a_race_are_read_once_and_repaired(
    make_store: MakeStore, index_name: str, client: Client
) -> None:
    store = make_store(TABLE, slot_hash=linear)
    store.add_texts(["a"], ids=["A"])
    # What the unguarded race leaves: two rows for one id.
    client.upsert(
        index_name,
        [TABLE["b"], TABLE["c"]],
        ids=[5, 9],
        metadata=[{"_lc_id": "D", "_lc_text": "b"}, {"_lc_id": "D", "_lc_text": "c"}],
    )
    assert store.get_by_ids(["D"]) == [Document(id="D", page_content="b", metadata={})]

    store.add_texts(["d"], ids=["D"])  # overwrites the first, deletes the other
    assert rows(client, index_name) == {0: "A", 5: "D"}
    assert store.get_by_ids(["D"])[0].page_content == "d"

    client.upsert(index_name, [TABLE["e"]], ids=[7], metadata=[{"_lc_id": "D", "_lc_text": "e"}])
    store.delete(["D"])  # removes every row of the id
    assert rows(client, index_name) == {0: "A"}


async def test_async_paths_with_collisions(make_store: MakeStore, index_name: str, client: Client) -> None:
    store = make_store(TABLE, slot_hash=linear)
    await store.aadd_texts(["a", "b", "c"], ids=["A", "B", "C"])
    await store.adelete(["A"])
    await store.aadd_texts(["d", "e"], ids=["D", "B"])
    assert rows(client, index_name) == {0: "D", 1: "B", 2: "C"}
    assert [d.page_content for d in await store.aget_by_ids(["B", "C", "D"])] == ["e", "c", "d"]
    await store.aclose()
