"""One `Call` per request: what to send, whether it may be retried, how to read the answer.

Each public method of the sync and async clients makes its calls here and
hands them to its own I/O loop (`Client._run`, `AsyncClient._run`), so the two
clients cannot drift apart in what they send or how they read it, and the
decision "may this be retried" is made once, next to the request it is about.

A method that needs several requests (an upload, a long delete, retrieve or
search batch) is written once here as a *plan*: a generator that yields
`Call`s and is sent each one's result (or has its `QuiverError` thrown in).
`Client._drive` carries a plan out with blocking calls, `AsyncClient._drive`
with awaited ones; neither client wraps the other.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Generator, Generic, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

import orjson

import numpy as np

from . import _limits
from . import _protocol as P
from ._errors import QuiverConnectionError, QuiverError
from ._progress import open_progress
from ._types import ClusterMember, ClusterStatus, Deleted, Health, Hit, IndexStats, Retrieved, Row, Skipped, WriteResult


T = TypeVar("T")

#: One retrieve answer: found ids, their vectors (2-D), metadata, missing ids.
RetrievedPart = Tuple[List[int], np.ndarray, List[Any], List[int]]


class Call(Generic[T]):
    """One request and the reading of its answer.

    `idempotent`: sending it twice leaves the same state as once (see
    `_retry`), so it may be retried. `skipped_ok`: 500 EMBEDDINGS_SKIPPED is a
    partial success to read, not an error. `raw`: the answer is not an
    envelope (metrics, the OpenAPI document); `parse` gets its bytes.
    """

    __slots__ = ("method", "path", "body", "idempotent", "skipped_ok", "raw", "parse")

    def __init__(
        self,
        method: str,
        path: str,
        body: Optional[bytes],
        idempotent: bool,
        parse: Callable[[Any], T],
        skipped_ok: bool = False,
        raw: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.idempotent = idempotent
        self.parse = parse
        self.skipped_ok = skipped_ok
        self.raw = raw


def finish(call: "Call[T]", status: int, content: Union[bytes, bytearray]) -> T:
    """The result of a call from its answer, or the exception the answer means."""
    if call.raw and status == 200:
        return call.parse(content)
    reply = P.decode_reply(status, content)
    P.check(reply, skipped_ok=call.skipped_ok)
    return call.parse(reply)


def connection_error(exc: BaseException) -> QuiverConnectionError:
    """The error for a call that got no answer (the httpx error is its `__cause__`)."""
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return QuiverConnectionError(None, None, f"no answer from the server ({reason})")


def _nothing(reply: P.Reply) -> None:
    return None


# -- Operations and status ---------------------------------------------------------------


def health() -> "Call[Health]":
    return Call("GET", P.api_path("health"), None, True, lambda r: P.parse_health(r.data))


def test_auth() -> "Call[None]":
    return Call("GET", P.api_path("test-auth"), None, True, _nothing)


def cluster() -> "Call[ClusterStatus]":
    return Call("GET", P.api_path("cluster"), None, True, lambda r: P.parse_cluster(r.data))


def add_member(id: int, address: str) -> "Call[ClusterMember]":
    # Not retried: adding waits up to a minute for the node to catch up, and a
    # 503 means "still under way", not "not done" (see _retry).
    return Call("POST", P.api_path("cluster/members"), P.member_body(id, address), False, lambda r: P.parse_member(r.data))


def remove_member(id: int) -> "Call[None]":
    return Call("DELETE", P.api_path(f"cluster/members/{int(id)}"), None, False, _nothing)


def metrics() -> "Call[str]":
    return Call("GET", P.METRICS_PATH, None, True, lambda content: content.decode("utf-8"), raw=True)


def openapi() -> "Call[Any]":
    return Call("GET", P.api_path("openapi.json"), None, True, orjson.loads, raw=True)


# -- Indexes ---------------------------------------------------------------------------------


def list_indexes(consistency: Optional[str]) -> "Call[List[str]]":
    path = P.with_consistency(P.api_path("indexes/list"), consistency)
    return Call("GET", path, None, True, lambda r: list(r.data["indexes"]))


def create_index(name: str, dimensions: int, metric: str, p: Optional[float]) -> "Call[None]":
    body = P.create_body(dimensions, metric, p)
    return Call("PUT", P.index_path(name, "create"), body, False, _nothing)


def stats(name: str, consistency: Optional[str]) -> "Call[IndexStats]":
    path = P.with_consistency(P.index_path(name, "stats"), consistency)
    return Call("GET", path, None, True, lambda r: P.parse_stats(r.data))


def delete_index(name: str) -> "Call[None]":
    return Call("DELETE", P.index_path(name, "delete"), None, False, _nothing)


# -- Embeddings ------------------------------------------------------------------------------


def write(op: str, name: str, body: bytes, rows: int) -> "Call[Tuple[int, List[Skipped]]]":
    """An insert or upsert of `rows` rows: (stored, skipped)."""
    # Upsert is idempotent (the same rows again leave the same rows); insert
    # is not (a second attempt reports them as existing), so only upsert is
    # retried.
    return Call(
        "PUT",
        P.embeddings_path(name, op),
        body,
        op == "upsert",
        lambda r: P.write_outcome(r, rows),
        skipped_ok=True,
    )


def search(
    name: str, query: np.ndarray, k: int, include: Optional[List[str]], filter: Any, consistency: Optional[str]
) -> "Call[List[Hit]]":
    path = P.with_consistency(P.embeddings_path(name, "search"), consistency)
    return Call("POST", path, P.search_body(query, k, include, filter), True, _hits)


def _hits(reply: P.Reply) -> List[Hit]:
    return P.parse_hits(reply.data)


def search_batch(name: str, searches: List[Dict[str, Any]], consistency: Optional[str]) -> "Call[List[List[Hit]]]":
    path = P.with_consistency(P.embeddings_path(name, "search-batch"), consistency)
    return Call("POST", path, P.search_batch_body(searches), True, lambda r: P.parse_search_batch(r.data))


def retrieve(name: str, ids: Sequence[int], consistency: Optional[str]) -> "Call[RetrievedPart]":
    path = P.with_consistency(P.embeddings_path(name, "retrieve"), consistency)
    return Call("POST", path, P.ids_body(ids), True, P.parse_retrieved, skipped_ok=True)


def delete_ids(name: str, ids: Sequence[int]) -> "Call[Tuple[List[int], List[Skipped]]]":
    # Retried (see _retry): a second attempt deletes nothing more. If the
    # first was applied and its answer lost, the retry reports those ids as
    # skipped ("does not exist"): the rows are gone either way.
    return Call(
        "DELETE",
        P.embeddings_path(name, "delete"),
        P.ids_body(ids),
        True,
        lambda r: P.deleted_outcome(ids, r),
        skipped_ok=True,
    )


def delete_filter(name: str, filter: Any) -> "Call[int]":
    # Retried (see _retry): if the first attempt was applied and its answer
    # lost, the count is of the retry alone (0, or rows written in between).
    return Call("DELETE", P.embeddings_path(name, "delete"), P.filter_body(filter), True, lambda r: r.data["deleted"])


def scroll(
    name: str, limit: int, after: Optional[int], filter: Any, with_vectors: bool, consistency: Optional[str]
) -> "Call[Tuple[List[Row], Optional[int]]]":
    path = P.with_consistency(P.embeddings_path(name, "scroll"), consistency)
    body = P.scroll_body(limit, after, filter, with_vectors)
    return Call("POST", path, body, True, lambda r: P.parse_scroll(r.data))


# -- Plans: methods of several requests -------------------------------------------------------

Plan = Generator["Call[Any]", Any, T]


def in_parts(
    lo: int,
    hi: int,
    size: int,
    call_for: Callable[[int, int], "Call[Any]"],
    answered: Callable[[int, int, Any], None],
    fewer: Callable[[QuiverError, int, int], Optional[int]],
) -> "Plan[None]":
    """Items lo..hi sent in order, as calls of at most `size` items; `answered(lo, hi, result)` for each.

    A call the server refuses for a limit of its own is sent again with
    fewer items, `fewer(error, lo, hi)` of them, and later calls keep the
    smaller size; when `fewer` gives None the error is raised.
    """
    pos = lo
    while pos < hi:
        end = min(pos + size, hi)
        try:
            result = yield call_for(pos, end)
        except QuiverError as exc:
            smaller = fewer(exc, pos, end)
            if smaller is None:
                raise
            size = smaller
            continue
        answered(pos, end, result)
        pos = end


def _by_count(error: QuiverError, lo: int, hi: int) -> Optional[int]:
    return P.smaller_chunk(error, hi - lo)


def _gather(
    total: int,
    size: int,
    call_for: Callable[[int, int], "Call[Any]"],
    join: Callable[[List[Any]], T],
    fewer: Callable[[QuiverError, int, int], Optional[int]] = _by_count,
) -> "Plan[T]":
    """The results of items 0..total asked in parts, joined; a failure carries those before it as `result`."""
    parts: List[Any] = []
    try:
        yield from in_parts(0, total, size, call_for, lambda lo, hi, part: parts.append(part), fewer)
    except QuiverError as exc:
        exc.result = join(parts)
        raise
    return join(parts)


def _join_deleted(parts: List[Tuple[List[int], List[Skipped]]]) -> Deleted:
    return Deleted([i for part in parts for i in part[0]], [s for part in parts for s in part[1]])


def _join_lists(parts: List[List[Any]]) -> List[Any]:
    return [item for part in parts for item in part]


def delete_plan(name: str, ids: List[int]) -> "Plan[Deleted]":
    return _gather(len(ids), _limits.DELETE_BATCH_IDS_MAX, lambda lo, hi: delete_ids(name, ids[lo:hi]), _join_deleted)


def retrieve_plan(name: str, ids: List[int], consistency: Optional[str]) -> "Plan[Retrieved]":
    return _gather(
        len(ids),
        _limits.RETRIEVE_BATCH_IDS_MAX,
        lambda lo, hi: retrieve(name, ids[lo:hi], consistency),
        P.join_retrieved,
    )


def search_batch_plan(name: str, searches: List[Dict[str, Any]], consistency: Optional[str]) -> "Plan[List[List[Hit]]]":
    ks = [search["k"] for search in searches]
    return _gather(
        len(searches),
        _limits.SEARCH_BATCH_MAX,
        lambda lo, hi: search_batch(name, searches[lo:hi], consistency),
        _join_lists,
        lambda error, lo, hi: P.fewer_searches(error, ks[lo:hi]),
    )


class Uploader:
    """One insert or upsert: its rows, checked; the plans that send them; what the server answered.

    The client takes its `batches` (bodies encoded as they are asked for),
    carries out `send(batch)` for each, at most `lanes()` at once, then
    `close()`s it and returns `result(error)`. Several threads may carry out
    its plans at once.
    """

    def __init__(
        self,
        op: str,
        name: str,
        vectors: Any,
        ids: Any,
        metadata: Any,
        progress: bool,
        batch_rows: int,
        batch_bytes: int,
        parallel: int,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        self.op = op
        self.name = name
        self.rows = P.Upload(vectors, ids, metadata)
        self.parallel = parallel
        self.batches: Iterator[P.Batch] = P.iter_batches(self.rows, batch_rows, batch_bytes, _limits.UPLOAD_PIECE_ROWS_MAX)
        self.outcomes: List[P.Outcome] = []  # appended from several threads: list.append is atomic
        self.bar = open_progress(progress, len(self.rows), op)  # last: nothing above may fail with a bar open

    def lanes(self) -> int:
        """Requests that may be in flight at once, for an upload of more than one.

        One when an id repeats: requests in flight together are applied in any
        order, and the row sent last must be the one kept, as it is within
        one request.
        """
        return 1 if self.parallel == 1 or self.rows.has_repeats() else self.parallel

    def send(self, batch: P.Batch) -> "Plan[None]":
        """Sends one batch; past a server limit (413, `--items-max`), in smaller parts.

        Nothing of a refused request was stored, so sending its rows again is
        safe for insert too.
        """

        def call_for(lo: int, hi: int) -> "Call[Tuple[int, List[Skipped]]]":
            body = batch.body if (lo, hi) == (batch.lo, batch.hi) else self.rows.body(lo, hi)
            return write(self.op, self.name, body, hi - lo)

        return in_parts(batch.lo, batch.hi, len(batch), call_for, self._answered, _by_count)

    def _answered(self, lo: int, hi: int, outcome: Tuple[int, List[Skipped]]) -> None:
        self.outcomes.append((lo, hi, outcome[0], outcome[1]))
        self.bar.advance(hi - lo)

    def close(self) -> None:
        self.bar.close()

    def result(self, error: Optional[QuiverError]) -> WriteResult:
        """What was stored; with `error`, raises it carrying that as `result`."""
        return P.tally_writes(self.outcomes, len(self.rows), error)
