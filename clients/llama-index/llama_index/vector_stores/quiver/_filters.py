"""LlamaIndex `MetadataFilters` as a quiver filter (the JSON of the API reference's "Filters").

| LlamaIndex | quiver |
|---|---|
| EQ, NE | ``{k: {"$eq": v}}``, ``{k: {"$ne": v}}`` (NE also matches nodes without k) |
| GT, GTE, LT, LTE | ``$gt``, ``$gte``, ``$lt``, ``$lte``, with a number |
| IN, NIN | ``$in``, ``$nin``, with a list of strings, numbers or booleans |
| CONTAINS | ``{k: {"$contains": v}}``, v a string: k is a list holding v, or is v |
| ANY, ALL | ``$or`` / ``$and`` of one ``$contains`` per value |
| IS_EMPTY | k missing, or the empty string (None and [] are not stored at the top level, see `base`) |
| AND, OR | ``$and``, ``$or`` of the filters; nested `MetadataFilters` nest |
| NOT | ``{"$not": {"$or": [...]}}``: none of the filters match, as LlamaIndex's own stores read it |

What quiver cannot express raises before anything is sent: TEXT_MATCH and
TEXT_MATCH_INSENSITIVE (no substring search) with `NotImplementedError`; a
value of the wrong kind for its operator (a string for GT, a number for
CONTAINS, None anywhere, a key starting with ``$``) with `ValueError`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

QuiverFilter = Dict[str, Any]

_COMPARE = {
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
}
_LISTS = {FilterOperator.IN: "$in", FilterOperator.NIN: "$nin"}
_UNSUPPORTED = (FilterOperator.TEXT_MATCH, FilterOperator.TEXT_MATCH_INSENSITIVE)


def to_quiver(filters: Optional[MetadataFilters]) -> Optional[QuiverFilter]:
    """The quiver filter for `filters`; None when there is nothing to filter on."""
    if filters is None or not filters.filters:
        return None
    return _group(filters)


def all_of(*parts: Optional[QuiverFilter]) -> Optional[QuiverFilter]:
    """The filter matching what every given filter matches (None parts left out)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else {"$and": present}


def _group(filters: MetadataFilters) -> QuiverFilter:
    parts: List[QuiverFilter] = [_group(f) if isinstance(f, MetadataFilters) else _one(f) for f in filters.filters]
    condition = filters.condition or FilterCondition.AND
    if not parts:
        return {}  # an empty group matches every node, as in LlamaIndex's own stores
    if condition == FilterCondition.AND:
        return parts[0] if len(parts) == 1 else {"$and": parts}
    if condition == FilterCondition.OR:
        return parts[0] if len(parts) == 1 else {"$or": parts}
    if condition.value == "not":  # FilterCondition.NOT, which llama-index-core 0.12.0 lacks
        return {"$not": parts[0] if len(parts) == 1 else {"$or": parts}}
    raise ValueError(f"filter condition {condition!r} is not one quiver supports (and, or, not)")


def _one(f: MetadataFilter) -> QuiverFilter:
    key, op, value = f.key, f.operator, f.value
    if key.startswith("$"):
        raise ValueError(f"filter key {key!r}: quiver cannot filter on a key that starts with '$'")
    if op in _UNSUPPORTED:
        raise NotImplementedError(f"filter on {key!r}: quiver has no text search, so {op.name} cannot be expressed")
    if op == FilterOperator.IS_EMPTY:
        return {"$or": [{key: {"$exists": False}}, {key: {"$eq": ""}}]}
    if op in (FilterOperator.EQ, FilterOperator.NE):
        return {key: {"$eq" if op == FilterOperator.EQ else "$ne": _scalar(key, op, value)}}
    if op in _COMPARE:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"filter on {key!r}: quiver compares {op.name} with a number, not {value!r}")
        return {key: {_COMPARE[op]: value}}
    if op in _LISTS:
        if not isinstance(value, list):
            raise ValueError(f"filter on {key!r}: {op.name} takes a list of values, not {value!r}")
        return {key: {_LISTS[op]: [_scalar(key, op, v) for v in value]}}
    if op == FilterOperator.CONTAINS:
        return {key: {"$contains": _string(key, op, value)}}
    if op in (FilterOperator.ANY, FilterOperator.ALL):
        if not isinstance(value, list):
            raise ValueError(f"filter on {key!r}: {op.name} takes a list of strings, not {value!r}")
        terms = [{key: {"$contains": _string(key, op, v)}} for v in value]
        if op == FilterOperator.ANY:
            return {"$or": terms} if terms else {key: {"$in": []}}  # any of none: no node
        return {"$and": terms} if terms else {key: {"$exists": True}}  # all of none: every node that has key
    raise ValueError(f"filter on {key!r}: operator {op!r} is not one quiver supports")


def _scalar(key: str, op: FilterOperator, value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    what = "None (use IS_EMPTY)" if value is None else repr(value)
    raise ValueError(f"filter on {key!r}: {op.name} compares with a string, number or boolean, not {what}")


def _string(key: str, op: FilterOperator, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(
            f"filter on {key!r}: quiver's $contains looks for a string in a list of strings; {op.name} got {value!r}"
        )
    return value
