"""One `Call` per request: what to send, whether it may be retried, how to read the answer.

Each public method of the sync and async clients makes its calls here and
hands them to its own I/O loop (`Client._run`, `AsyncClient._run`), so the two
clients cannot drift apart in what they send or how they read it, and the
decision "may this be retried" is made once, next to the request it is about.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, List, Optional, Sequence, Tuple, TypeVar, Union

import orjson

import numpy as np

from . import _protocol as P
from ._errors import QuiverConnectionError
from ._types import ClusterMember, ClusterStatus, Health, Hit, IndexStats, Row, Skipped


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


def search_batch(
    name: str, queries: np.ndarray, k: int, include: Optional[List[str]], filter: Any, consistency: Optional[str]
) -> "Call[List[List[Hit]]]":
    path = P.with_consistency(P.embeddings_path(name, "search-batch"), consistency)
    body = P.search_batch_body(queries, k, include, filter)
    return Call("POST", path, body, True, lambda r: P.parse_search_batch(r.data))


def retrieve(name: str, ids: Sequence[int], consistency: Optional[str]) -> "Call[RetrievedPart]":
    path = P.with_consistency(P.embeddings_path(name, "retrieve"), consistency)
    return Call("POST", path, P.ids_body(ids), True, P.parse_retrieved, skipped_ok=True)


def delete_ids(name: str, ids: Sequence[int]) -> "Call[Tuple[List[int], List[Skipped]]]":
    # Idempotent: a second attempt deletes nothing more. If the first was
    # applied and its answer lost, the retry reports those ids as skipped
    # ("does not exist"): the rows are gone either way.
    return Call(
        "DELETE",
        P.embeddings_path(name, "delete"),
        P.ids_body(ids),
        True,
        lambda r: P.deleted_outcome(ids, r),
        skipped_ok=True,
    )


def delete_filter(name: str, filter: Any) -> "Call[int]":
    return Call("DELETE", P.embeddings_path(name, "delete"), P.filter_body(filter), True, lambda r: r.data["deleted"])


def scroll(
    name: str, limit: int, after: Optional[int], filter: Any, with_vectors: bool, consistency: Optional[str]
) -> "Call[Tuple[List[Row], Optional[int]]]":
    path = P.with_consistency(P.embeddings_path(name, "scroll"), consistency)
    body = P.scroll_body(limit, after, filter, with_vectors)
    return Call("POST", path, body, True, lambda r: P.parse_scroll(r.data))

