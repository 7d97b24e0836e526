"""LlamaIndex filters mapped to quiver's: each operator and condition against the real server.

The oracle is LlamaIndex's own in-memory filter (`build_metadata_filter_fn`,
which its SimpleVectorStore uses) for flat filters, and a written predicate for
nested ones, which it does not take.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import pytest
from conftest import MakeStore
from llama_index.core.schema import TextNode
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn

from llama_index.vector_stores.quiver import QuiverVectorStore
from llama_index.vector_stores.quiver._filters import to_quiver

ROWS: List[Dict[str, Any]] = [
    {"lang": "en", "year": 2001, "score": 0.5, "tags": ["x", "y"]},
    {"lang": "fr", "year": 2015, "score": 2.25, "tags": ["y"]},
    {"lang": "en", "year": 2023, "score": -1.0, "tags": []},
    {"lang": "de", "year": 1999, "tags": ["x"]},
    {"year": 2015, "score": 7.0, "lang": ""},
    {"lang": "it", "note": None},
]


def f(key: str, op: str, value: Any) -> MetadataFilter:
    return MetadataFilter(key=key, operator=FilterOperator(op), value=value)


FLAT = [
    [f("lang", "==", "en")],
    [f("year", "==", 2015)],
    [f("score", "==", 2.25)],
    [f("lang", "!=", "en")],
    [f("year", ">", 2001)],
    [f("year", ">=", 2001)],
    [f("score", "<", 0.5)],
    [f("score", "<=", 0.5)],
    [f("lang", "in", ["fr", "de"])],
    [f("year", "in", [1999, 2023])],
    [f("lang", "nin", ["en", "fr"])],
    [f("tags", "contains", "x")],
    [f("tags", "any", ["x", "q"])],
    [f("tags", "all", ["x", "y"])],
    [f("tags", "is_empty", None)],
    [f("lang", "is_empty", None)],
    [f("lang", "==", "en"), f("year", ">", 2010)],
]
CONDITIONS = [FilterCondition.AND, FilterCondition.OR, FilterCondition.NOT]


@pytest.fixture
def store(make_store: MakeStore) -> QuiverVectorStore:
    s = make_store()
    s.add([TextNode(id_=str(i), text=f"row {i}", metadata=m, embedding=[1.0, float(i)]) for i, m in enumerate(ROWS)])
    return s


def matched(store: QuiverVectorStore, filters: MetadataFilters) -> List[str]:
    result = store.query(VectorStoreQuery(query_embedding=[1.0, 0.0], similarity_top_k=len(ROWS), filters=filters))
    return sorted(result.ids or [])


def oracle(filters: MetadataFilters) -> List[str]:
    keep = build_metadata_filter_fn(lambda i: ROWS[int(i)], filters)
    return sorted(str(i) for i in range(len(ROWS)) if keep(str(i)))


@pytest.mark.parametrize("condition", CONDITIONS, ids=[c.value for c in CONDITIONS])
@pytest.mark.parametrize(
    "flat", FLAT, ids=[" & ".join(f"{x.key}{x.operator.value}{x.value}" for x in fl) for fl in FLAT]
)
def test_each_operator_and_condition_matches_llama_indexs_own_filter(
    store: QuiverVectorStore, flat: List[MetadataFilter], condition: FilterCondition
) -> None:
    filters = MetadataFilters(filters=flat, condition=condition)
    assert matched(store, filters) == oracle(filters)


def test_the_oracle_rows_are_not_trivial(store: QuiverVectorStore) -> None:
    # Every flat filter matches some rows and misses others, so equality above means something.
    for flat in FLAT:
        got = oracle(MetadataFilters(filters=flat))
        assert 0 < len(got) < len(ROWS), flat


NESTED: List[tuple] = [
    (
        MetadataFilters(
            filters=[
                f("lang", "==", "en"),
                MetadataFilters(filters=[f("year", "<", 2010), f("score", "<", 0)], condition=FilterCondition.OR),
            ]
        ),
        lambda m: m.get("lang") == "en" and (m.get("year", 9999) < 2010 or m.get("score", 9) < 0),
    ),
    (
        MetadataFilters(
            filters=[
                MetadataFilters(filters=[f("tags", "contains", "y")], condition=FilterCondition.NOT),
                f("year", ">=", 1999),
            ]
        ),
        lambda m: "y" not in m.get("tags", []) and m.get("year", 0) >= 1999,
    ),
    (
        MetadataFilters(
            filters=[MetadataFilters(filters=[f("lang", "in", ["en", "de"]), f("year", ">", 2000)])],
            condition=FilterCondition.NOT,
        ),
        lambda m: not (m.get("lang") in ("en", "de") and m.get("year", 0) > 2000),
    ),
]


@pytest.mark.parametrize("filters, predicate", NESTED, ids=["and-or", "not-inside-and", "not-of-and"])
def test_nested_filters(store: QuiverVectorStore, filters: MetadataFilters, predicate: Callable[..., bool]) -> None:
    assert matched(store, filters) == sorted(str(i) for i, m in enumerate(ROWS) if predicate(m))


def test_the_mapping_is_the_documented_json() -> None:
    filters = MetadataFilters(
        filters=[
            f("a", "==", "x"),
            f("b", "any", ["p", "q"]),
            MetadataFilters(filters=[f("c", ">", 1), f("d", "is_empty", None)], condition=FilterCondition.NOT),
        ],
        condition=FilterCondition.OR,
    )
    assert to_quiver(filters) == {
        "$or": [
            {"a": {"$eq": "x"}},
            {"$or": [{"b": {"$contains": "p"}}, {"b": {"$contains": "q"}}]},
            {"$not": {"$or": [{"c": {"$gt": 1}}, {"$or": [{"d": {"$exists": False}}, {"d": {"$eq": ""}}]}]}},
        ]
    }
    assert to_quiver(None) is None and to_quiver(MetadataFilters(filters=[])) is None
    assert to_quiver(MetadataFilters(filters=[f("t", "any", [])])) == {"t": {"$in": []}}
    assert to_quiver(MetadataFilters(filters=[f("t", "all", [])])) == {"t": {"$exists": True}}


@pytest.mark.parametrize(
    "bad, error, message",
    [
        (f("lang", "text_match", "e"), NotImplementedError, "no text search, so TEXT_MATCH"),
        (f("lang", "text_match_insensitive", "e"), NotImplementedError, "TEXT_MATCH_INSENSITIVE"),
        (f("year", ">", "2000"), ValueError, "compares GT with a number, not '2000'"),
        (f("tags", "contains", 3), ValueError, r"\$contains looks for a string"),
        (f("tags", "any", [1, 2]), ValueError, r"\$contains looks for a string"),
        (f("lang", "==", None), ValueError, r"not None \(use IS_EMPTY\)"),
        (f("lang", "==", ["a", "b"]), ValueError, "compares with a string, number or boolean"),
        (f("lang", "in", "en"), ValueError, "IN takes a list of values"),
        (f("$weird", "==", "x"), ValueError, "starts with '\\$'"),
    ],
)
def test_what_quiver_cannot_express_raises_a_clear_error(bad: MetadataFilter, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        to_quiver(MetadataFilters(filters=[bad]))
