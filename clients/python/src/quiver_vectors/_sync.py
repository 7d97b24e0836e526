"""The synchronous client: each method makes its calls (`_calls`) and does their I/O.

Uploads run in a small thread pool: the calling thread encodes the next
request's body while the pool's threads send earlier ones, each on its own
kept-alive connection. Sending releases the GIL while the socket is busy, and
bodies are encoded in pieces (see `_protocol.iter_batches`) so the senders get
the GIL back often.
"""

from __future__ import annotations

import concurrent.futures as futures
import itertools
import time
from typing import Any, Callable, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar, Union

import httpx

from . import _calls as C
from . import _limits
from . import _protocol as P
from ._base import IDLE_CONNECTIONS_MAX, SOCKET_OPTIONS, _Core, transport_limits
from ._errors import IndexExistsError, IndexNotFoundError, QuiverError
from ._retry import RETRYABLE_STATUS, RETRYABLE_TRANSPORT_ERRORS, RetryPolicy
from ._types import ClusterMember, ClusterStatus, Deleted, Health, Hit, IndexStats, Retrieved, Row, Search, WriteResult
from ._wire import Content, SyncWire


T = TypeVar("T")


class Client(_Core):
    """A quiver server, called synchronously.

    Args:
        url: the server, e.g. ``"http://127.0.0.1:8080"``; default ``$QUIVER_URL``,
            else ``http://127.0.0.1:8080``.
        api_key: the key sent in ``X-Service-API-Key``; default ``$QUIVER_API_KEY``.
        timeout_s: the longest one request may take, from sending it to the
            last byte of its answer (connecting takes at most 10 s more). A
            call of several requests (an upload, a long retrieve) gives each
            its own; a retried request gets a new one for each attempt, the
            backoffs between them bounded by `retry`.
        retry: how idempotent calls are retried (`RetryPolicy`).
        consistency: in a cluster, ``"local"`` reads from the asked node
            without confirming with the leader; default: linearizable.
        transport: an httpx transport to use instead of the default one (for
            TLS settings, proxies, or tests).

    Use it as a context manager, or call `close()`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout_s: float = _limits.TIMEOUT_S,
        retry: Optional[RetryPolicy] = None,
        consistency: Optional[str] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        super().__init__(url, api_key, timeout_s, retry, consistency)
        self._wire: Optional[SyncWire] = None
        self._transport: Optional[httpx.BaseTransport] = None
        if self._uses_wire(transport):
            self._wire = SyncWire(
                self._host,
                self._port,
                self.timeout_s,
                self.connect_timeout_s,
                _limits.KEEPALIVE_EXPIRY_S,
                IDLE_CONNECTIONS_MAX,
            )
        else:
            self._transport = transport or httpx.HTTPTransport(
                limits=transport_limits(), retries=0, socket_options=SOCKET_OPTIONS
            )

    # -- I/O -------------------------------------------------------------------------------

    def _exchange(self, method: str, path: str, body: Optional[bytes]) -> Tuple[int, Content]:
        if self._wire is not None:
            return self._wire.exchange(self._head(method, path, body), body)
        assert self._transport is not None
        response = self._transport.handle_request(self._request(method, path, body))
        try:
            return response.status_code, response.read()
        finally:
            response.close()

    def _run(self, call: C.Call[T]) -> T:
        started = time.monotonic()
        retry = 0
        while True:
            failure: Optional[BaseException] = None
            try:
                status, content = self._exchange(call.method, call.path, call.body)
            except RETRYABLE_TRANSPORT_ERRORS as exc:
                failure = exc
            except httpx.TransportError as exc:
                raise C.connection_error(exc) from exc
            else:
                if status != RETRYABLE_STATUS:
                    return C.finish(call, status, content)
            delay = self.retry.delay_s(retry, time.monotonic() - started) if call.idempotent else None
            if delay is None:
                if failure is not None:
                    raise C.connection_error(failure) from failure
                return C.finish(call, status, content)  # raises the 503's error
            time.sleep(delay)
            retry += 1

    def _drive(self, plan: "C.Plan[T]") -> T:
        """Carries out a plan (see `_calls`): runs each call it yields and sends it the result."""
        send: Callable[[Any], C.Call[Any]] = plan.send
        value: Any = None
        while True:
            try:
                call = send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                value, send = self._run(call), plan.send
            except QuiverError as exc:
                value, send = exc, plan.throw  # the plan may handle it; if not, it comes back out

    def close(self) -> None:
        """Closes the kept-alive connections."""
        if self._wire is not None:
            self._wire.close()
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- Status ------------------------------------------------------------------------------

    def health(self) -> Health:
        """The server's CPU and memory use and uptime (needs no key)."""
        return self._run(C.health())

    def test_auth(self) -> None:
        """Returns if the API key is good; raises `AuthenticationError` if not."""
        self._run(C.test_auth())

    def cluster(self) -> ClusterStatus:
        """This node's view of its cluster (role ``"single"`` outside one)."""
        return self._run(C.cluster())

    def add_member(self, id: int, address: str) -> ClusterMember:
        """Adds a waiting node to the cluster; returns once it votes (not retried)."""
        return self._run(C.add_member(id, address))

    def remove_member(self, id: int) -> None:
        """Removes a member from the cluster (not retried)."""
        self._run(C.remove_member(id))

    def metrics(self) -> str:
        """The Prometheus metrics, as text."""
        return self._run(C.metrics())

    def openapi(self) -> Any:
        """The server's OpenAPI document, as a dict."""
        return self._run(C.openapi())

    # -- Indexes --------------------------------------------------------------------------------

    def list_indexes(self, *, consistency: Optional[str] = None) -> List[str]:
        """Every index name, sorted."""
        return self._run(C.list_indexes(consistency or self.consistency))

    def create_index(
        self, name: str, dimensions: int, metric: str = "cosine", *, p: Optional[float] = None, exist_ok: bool = False
    ) -> None:
        """Creates an index; with `exist_ok`, an index of that name is left as it is.

        Raises `IndexExistsError` if the name exists (unless `exist_ok`), and
        `IndexNotCreatedError` for a bad name or metric. Not retried.
        """
        try:
            self._run(C.create_index(name, dimensions, metric, p))
        except IndexExistsError:
            if not exist_ok:
                raise

    def stats(self, name: str, *, consistency: Optional[str] = None) -> IndexStats:
        """An index's dimensions, metric and number of embeddings."""
        return self._run(C.stats(name, consistency or self.consistency))

    def delete_index(self, name: str, *, missing_ok: bool = False) -> None:
        """Deletes an index and its data; with `missing_ok`, no index of that name is fine."""
        try:
            self._run(C.delete_index(name))
        except IndexNotFoundError:
            if not missing_ok:
                raise

    # -- Writes -----------------------------------------------------------------------------------

    def insert(
        self,
        name: str,
        vectors: P.VectorsLike,
        ids: P.IdsLike,
        metadata: Any = None,
        *,
        progress: bool = False,
        batch_rows: int = _limits.UPLOAD_BATCH_ROWS_MAX,
        batch_bytes: int = _limits.UPLOAD_BATCH_BYTES_MAX,
        parallel: int = _limits.UPLOAD_PARALLEL,
    ) -> WriteResult:
        """Stores new rows; an id that exists is skipped (see `WriteResult.skipped`).

        Not retried (a retry of an insert that was applied would report its
        rows as existing). Otherwise as `upsert`.
        """
        return self._upload("insert", name, vectors, ids, metadata, progress, batch_rows, batch_bytes, parallel)

    def upsert(
        self,
        name: str,
        vectors: P.VectorsLike,
        ids: P.IdsLike,
        metadata: Any = None,
        *,
        progress: bool = False,
        batch_rows: int = _limits.UPLOAD_BATCH_ROWS_MAX,
        batch_bytes: int = _limits.UPLOAD_BATCH_BYTES_MAX,
        parallel: int = _limits.UPLOAD_PARALLEL,
    ) -> WriteResult:
        """Stores rows, replacing those whose id exists.

        `vectors`: one vector (1-D) or a batch (any shape whose last axis is
        the dimensions), of any real dtype (sent as float32); `ids`: one int
        per vector; `metadata`: None, or one mapping (or None) per vector.
        Metadata values are checked before anything is sent (`ValueError`).
        Sent as requests of at most `batch_rows` rows and about `batch_bytes`
        bytes, `parallel` at a time (one at a time, in order, when an id
        repeats, so that its last row wins as within one request); a request
        past a server limit (413, `--items-max`) is sent again in smaller
        parts. Rows the server skips (wrong length, outside the numeric
        domain) are listed in the result, not raised. A failed request
        raises; nothing more is sent, the requests in flight finish, and the
        exception's `result` is the `WriteResult` of every request answered,
        whose `stored_ranges` say which rows are stored (the others can be
        sent again).
        """
        return self._upload("upsert", name, vectors, ids, metadata, progress, batch_rows, batch_bytes, parallel)

    def _upload(
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
    ) -> WriteResult:
        upload = C.Uploader(op, name, vectors, ids, metadata, progress, batch_rows, batch_bytes, parallel)
        error: Optional[QuiverError] = None
        try:
            first, second = next(upload.batches, None), next(upload.batches, None)
            if second is None:
                # One request (the common small write): sent from this
                # thread, without starting a pool.
                if first is not None:
                    try:
                        self._drive(upload.send(first))
                    except QuiverError as exc:
                        error = exc
            else:
                assert first is not None
                lanes = upload.lanes()
                with futures.ThreadPoolExecutor(lanes, thread_name_prefix="quiver-upload") as pool:
                    pending: Set["futures.Future[None]"] = set()
                    # Each batch is encoded (by this loop taking it) while the
                    # ones before it are sent.
                    for batch in itertools.chain((first, second), upload.batches):
                        while len(pending) >= lanes and error is None:
                            done, pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
                            error = P.first_error(done, error)
                        if error is not None:
                            break  # send nothing more; let what is in flight finish
                        pending.add(pool.submit(self._drive, upload.send(batch)))
                    error = P.first_error(futures.wait(pending)[0], error)
        finally:
            upload.close()
        return upload.result(error)

    def delete(self, name: str, ids: P.IdsLike) -> Deleted:
        """Deletes rows by id: the ids deleted, and those skipped (missing) with why.

        Missing ids are not an error. Sent in requests of at most 10,000 ids;
        a failed request raises, with what was deleted before it in the
        exception's `result` (a `Deleted`).
        """
        return self._drive(C.delete_plan(name, P.as_ids(ids)))

    def delete_by_filter(self, name: str, filter: P.Filter) -> int:
        """Deletes every row the filter matches (``{}``: every row), as one write; returns how many."""
        return self._run(C.delete_filter(name, filter))

    # -- Reads ------------------------------------------------------------------------------------

    def search(
        self,
        name: str,
        vector: P.VectorsLike,
        k: int = 10,
        *,
        filter: Optional[P.Filter] = None,
        with_scores: bool = True,
        with_vectors: bool = False,
        consistency: Optional[str] = None,
    ) -> List[Hit]:
        """The exact k nearest rows to `vector` (among those `filter` matches), nearest first."""
        call = C.search(
            name, P.as_query(vector), k, P.include_list(with_scores, with_vectors), filter, consistency or self.consistency
        )
        return self._run(call)

    def search_batch(
        self,
        name: str,
        vectors: Union[P.VectorsLike, Sequence[Search]],
        k: int = 10,
        *,
        filter: Optional[P.Filter] = None,
        with_scores: bool = True,
        with_vectors: bool = False,
        consistency: Optional[str] = None,
    ) -> List[List[Hit]]:
        """Many searches, run together by the server; results in the order asked.

        `vectors`: one search per vector, each with `k`, `filter` and what to
        include as given here; or a list of `Search`, each with options of its
        own (an option it leaves None is taken from here). Sent as requests
        of at most 1,024 searches, fewer when the server's limits say so; a
        failed request raises, with the results before it in the exception's
        `result`.
        """
        searches = P.batch_searches(vectors, k, filter, with_scores, with_vectors)
        return self._drive(C.search_batch_plan(name, searches, consistency or self.consistency))

    def retrieve(self, name: str, ids: P.IdsLike, *, consistency: Optional[str] = None) -> Retrieved:
        """Rows by id, in the order asked, vectors exactly as stored; missing ids listed, not raised.

        Sent as requests of at most 1,000 ids, fewer when a reply would pass
        the server's limit; a failed request raises, with the rows fetched
        before it in the exception's `result` (a `Retrieved`).
        """
        return self._drive(C.retrieve_plan(name, P.as_ids(ids), consistency or self.consistency))

    def scroll(
        self,
        name: str,
        *,
        filter: Optional[P.Filter] = None,
        with_vectors: bool = False,
        page_size: int = _limits.SCROLL_PAGE_ROWS,
        after: Optional[int] = None,
        consistency: Optional[str] = None,
    ) -> Iterator[Row]:
        """Every row (that `filter` matches) in order of id, fetched a page at a time.

        Each row is listed once when nothing changes meanwhile; `after` starts
        past an id (resume from the last row seen).
        """
        while True:
            call = C.scroll(name, page_size, after, filter, with_vectors, consistency or self.consistency)
            rows, after = self._run(call)
            yield from rows
            if after is None:
                return

