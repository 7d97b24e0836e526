"""The typed objects calls return.

Plain classes with `__slots__`: a search makes one `Hit` per neighbour on the
latency-critical path, and slotted objects are the cheapest Python objects to
make that still carry names and types. Vectors are `numpy.float32` arrays
holding exactly the server's stored bits; a result of many rows keeps them in
one 2-D array (`Retrieved.vectors`) and each row's vector is a view of it.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

#: A metadata value: strings today; numbers, booleans and lists of strings on
#: servers with typed metadata. The client passes values through as JSON.
MetadataValue = Union[str, int, float, bool, List[str]]
Metadata = Dict[str, MetadataValue]


class _Slotted:
    """`__eq__` and `__repr__` over `__slots__`, with arrays compared exactly."""

    __slots__ = ()

    def __repr__(self) -> str:
        slots: Tuple[str, ...] = self.__slots__
        fields = ", ".join(f"{name}={_short(getattr(self, name))}" for name in slots)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        slots: Tuple[str, ...] = self.__slots__
        return all(_same(getattr(self, n), getattr(other, n)) for n in slots)

    __hash__ = None  # type: ignore[assignment]  # mutable, holds arrays


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return bool(a == b)


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array(shape={value.shape}, dtype={value.dtype})"
    if isinstance(value, list) and len(value) > 4:
        return f"[{', '.join(map(repr, value[:4]))}, ... ({len(value)} items)]"
    return repr(value)


class Hit(_Slotted):
    """One neighbour of a search. `rank` 0 is the nearest.

    `score` is the value the server ranked by (cosine similarity, inner product,
    or the metric's distance, squared for l2), exactly the server's f32; None
    when not asked for, or for an infinite distance. `vector` is the stored
    vector when asked for (`with_vectors=True`), else None.
    """

    __slots__ = ("id", "rank", "score", "metadata", "vector")

    def __init__(
        self,
        id: int,
        rank: int,
        score: Optional[float],
        metadata: Metadata,
        vector: Optional[np.ndarray] = None,
    ) -> None:
        self.id = id
        self.rank = rank
        self.score = score
        self.metadata = metadata
        self.vector = vector


class Row(_Slotted):
    """One stored embedding: from retrieve, or scroll (`vector` None unless asked for)."""

    __slots__ = ("id", "vector", "metadata")

    def __init__(self, id: int, vector: Optional[np.ndarray], metadata: Metadata) -> None:
        self.id = id
        self.vector = vector
        self.metadata = metadata


class Skipped(_Slotted):
    """An item the server did not apply, and its reason in the server's words.

    `id` is None only if the server's description could not be read as naming
    an id (then `reason` is the whole description).
    """

    __slots__ = ("id", "reason")

    def __init__(self, id: Optional[int], reason: str) -> None:
        self.id = id
        self.reason = reason


class WriteResult(_Slotted):
    """What an insert or upsert did: `stored` of `requested` rows, the rest `skipped` or not sent.

    `stored_ranges` says which rows the server answered for, as positions in
    the input: sorted, merged ``(lo, hi)`` pairs, each meaning rows
    ``lo..hi-1``. Every row in them is stored unless listed in `skipped`, so
    `stored` is their total length less the skipped rows. Rows outside them
    were not stored: their request failed, or was never sent after another
    failed (the exception's `result` is then this object), so resending those
    rows alone finishes the upload.

    Constructed without `stored_ranges`, it is the whole input when every row
    was answered for (``stored + len(skipped) == requested``), else empty.
    """

    __slots__ = ("requested", "stored", "skipped", "stored_ranges")

    def __init__(
        self,
        requested: int,
        stored: int,
        skipped: List[Skipped],
        stored_ranges: Optional[List[Tuple[int, int]]] = None,
    ) -> None:
        if stored_ranges is None:
            stored_ranges = [(0, requested)] if requested and stored + len(skipped) == requested else []
        self.requested = requested
        self.stored = stored
        self.skipped = skipped
        self.stored_ranges = stored_ranges

    @property
    def complete(self) -> bool:
        """True when every row was stored."""
        return not self.skipped and self.stored == self.requested


class Retrieved(_Slotted):
    """The rows a retrieve found, in the order asked, and the ids it did not find.

    `vectors` is one ``(len(ids), dimensions)`` float32 array (``(0, 0)`` when
    nothing was found); `rows` gives the same data row by row.
    """

    __slots__ = ("ids", "vectors", "metadata", "missing")

    def __init__(self, ids: List[int], vectors: np.ndarray, metadata: List[Metadata], missing: List[int]) -> None:
        self.ids = ids
        self.vectors = vectors
        self.metadata = metadata
        self.missing = missing

    @property
    def rows(self) -> List[Row]:
        return [Row(i, v, m) for i, v, m in zip(self.ids, self.vectors, self.metadata)]

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)


class Deleted(_Slotted):
    """What a delete by ids did: the ids deleted, and those skipped with why."""

    __slots__ = ("deleted", "skipped")

    def __init__(self, deleted: List[int], skipped: List[Skipped]) -> None:
        self.deleted = deleted
        self.skipped = skipped


class Search(_Slotted):
    """One search of a `search_batch` with options of its own.

    An option left None takes the value `search_batch` was called with (its
    `k`, `filter`, `with_scores`, `with_vectors`); to search every row when
    the call has a filter, give ``filter={}``.
    """

    __slots__ = ("vector", "k", "filter", "with_scores", "with_vectors")

    def __init__(
        self,
        vector: Any,
        k: Optional[int] = None,
        *,
        filter: Optional[Mapping[str, Any]] = None,
        with_scores: Optional[bool] = None,
        with_vectors: Optional[bool] = None,
    ) -> None:
        self.vector = vector
        self.k = k
        self.filter = filter
        self.with_scores = with_scores
        self.with_vectors = with_vectors


class IndexStats(_Slotted):
    """An index's shape and size. `p` is set for the lp metric only."""

    __slots__ = ("name", "dimensions", "metric", "count", "p")

    def __init__(self, name: str, dimensions: int, metric: str, count: int, p: Optional[float] = None) -> None:
        self.name = name
        self.dimensions = dimensions
        self.metric = metric
        self.count = count
        self.p = p


class Health(_Slotted):
    """The server process's CPU (percent of one core), memory (percent of the machine) and uptime."""

    __slots__ = ("cpu_usage_percent", "mem_usage_percent", "uptime")

    def __init__(self, cpu_usage_percent: float, mem_usage_percent: float, uptime: str) -> None:
        self.cpu_usage_percent = cpu_usage_percent
        self.mem_usage_percent = mem_usage_percent
        self.uptime = uptime


class ClusterMember(_Slotted):
    """One member of a cluster as the asked node sees it (`match_index` on the leader only)."""

    __slots__ = ("id", "address", "voter", "reachable", "match_index")

    def __init__(
        self, id: int, address: Optional[str], voter: bool, reachable: bool, match_index: Optional[int]
    ) -> None:
        self.id = id
        self.address = address
        self.voter = voter
        self.reachable = reachable
        self.match_index = match_index


class ClusterStatus(_Slotted):
    """A node's view of its cluster; `role` is ``"single"`` for a server outside any cluster."""

    __slots__ = ("node_id", "role", "term", "leader_id", "commit_index", "applied_index", "members")

    def __init__(
        self,
        node_id: Optional[int],
        role: str,
        term: int,
        leader_id: Optional[int],
        commit_index: int,
        applied_index: int,
        members: List[ClusterMember],
    ) -> None:
        self.node_id = node_id
        self.role = role
        self.term = term
        self.leader_id = leader_id
        self.commit_index = commit_index
        self.applied_index = applied_index
        self.members = members
