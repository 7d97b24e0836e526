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
from typing import Any, Iterator, List, Optional, Set, Tuple, TypeVar

import httpx

from . import _calls as C
from . import _limits
from . import _protocol as P
from ._base import IDLE_CONNECTIONS_MAX, SOCKET_OPTIONS, _Core, transport_limits
from ._errors import IndexExistsError, IndexNotFoundError, QuiverError
from ._progress import Progress, open_progress
from ._retry import RETRYABLE_STATUS, RETRYABLE_TRANSPORT_ERRORS, RetryPolicy
from ._types import ClusterMember, ClusterStatus, Deleted, Health, Hit, IndexStats, Retrieved, Row, Skipped, WriteResult
from ._wire import Content, SyncWire


T = TypeVar("T")


class Client(_Core):
    """A quiver server, called synchronously.

    Args:
        url: the server, e.g. ``"http://127.0.0.1:8080"``; default ``$QUIVER_URL``,
            else ``http://127.0.0.1:8080``.
        api_key: the key sent in ``X-Service-API-Key``; default ``$QUIVER_API_KEY``.
        timeout_s: the longest a request may take (connecting: at most 10 s).
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
        Sent as requests of at most `batch_rows` rows and about `batch_bytes`
        bytes, `parallel` at a time; a request the server finds too large
        (413) is split in half and sent again. Rows the server skips (wrong
        length, outside the numeric domain) are listed in the result, not
        raised. A failed request raises, with what was stored before it in
        the exception's `result`.
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
        upload = P.Upload(vectors, ids, metadata)
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        bar = open_progress(progress, len(upload), op)
        outcomes: List[P.Outcome] = []
        error: Optional[QuiverError] = None
        batches = P.iter_batches(upload, batch_rows, batch_bytes, _limits.UPLOAD_PIECE_ROWS_MAX)
        first, second = next(batches, None), next(batches, None)
        try:
            if second is None:
                # One request (the common small write): sent from this
                # thread, without starting a pool.
                if first is not None:
                    try:
                        self._send_batch(op, name, upload, first, outcomes, bar)
                    except QuiverError as exc:
                        error = exc
                return P.tally_writes(outcomes, len(upload), error)
            assert first is not None
            with futures.ThreadPoolExecutor(parallel, thread_name_prefix="quiver-upload") as pool:
                pending: Set["futures.Future[None]"] = set()
                for batch in itertools.chain((first, second), batches):
                    while len(pending) >= parallel and error is None:
                        done, pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
                        error = P.first_error(done, error)
                    if error is not None:
                        break  # send nothing more; let what is in flight finish
                    pending.add(pool.submit(self._send_batch, op, name, upload, batch, outcomes, bar))
                error = P.first_error(futures.wait(pending)[0], error)
        finally:
            bar.close()
        return P.tally_writes(outcomes, len(upload), error)

    def _send_batch(
        self, op: str, name: str, upload: P.Upload, batch: P.Batch, outcomes: List[P.Outcome], bar: Progress
    ) -> None:
        try:
            stored, skipped = self._run(C.write(op, name, batch.body, len(batch)))
        except QuiverError as exc:
            # Past a server limit (413, or fewer items per request): the
            # same rows again, in smaller requests. Nothing of a refused
            # request was stored, so this is safe for insert too.
            size = P.smaller_chunk(exc, len(batch))
            if size is None:
                raise
            for lo in range(batch.lo, batch.hi, size):
                hi = min(lo + size, batch.hi)
                self._send_batch(op, name, upload, P.Batch(lo, hi, upload.body(lo, hi)), outcomes, bar)
            return
        outcomes.append((batch.lo, stored, skipped))  # list.append is atomic
        bar.advance(len(batch))

    def delete(self, name: str, ids: P.IdsLike) -> Deleted:
        """Deletes rows by id: the ids deleted, and those skipped (missing) with why.

        Missing ids are not an error. Sent in requests of at most 10,000 ids;
        a failed request raises, with what was deleted before it in the
        exception's `result`.
        """
        id_list = P.as_ids(ids)
        deleted: List[int] = []
        skipped: List[Skipped] = []
        size, pos = _limits.DELETE_BATCH_IDS_MAX, 0
        while pos < len(id_list):
            chunk = id_list[pos : pos + size]
            try:
                part_deleted, part_skipped = self._run(C.delete_ids(name, chunk))
            except QuiverError as exc:
                smaller = P.smaller_chunk(exc, len(chunk))
                if smaller is None:
                    exc.result = Deleted(deleted, skipped)
                    raise
                size = smaller
                continue
            deleted += part_deleted
            skipped += part_skipped
            pos += len(chunk)
        return Deleted(deleted, skipped)

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
        vectors: P.VectorsLike,
        k: int = 10,
        *,
        filter: Optional[P.Filter] = None,
        with_scores: bool = True,
        with_vectors: bool = False,
        consistency: Optional[str] = None,
    ) -> List[List[Hit]]:
        """One search per vector, run together by the server; results in the order of `vectors`."""
        queries = P.as_matrix(vectors)
        include = P.include_list(with_scores, with_vectors)
        results: List[List[Hit]] = []
        size, pos = _limits.SEARCH_BATCH_MAX, 0
        while pos < len(queries):
            part = queries[pos : pos + size]
            call = C.search_batch(name, part, k, include, filter, consistency or self.consistency)
            try:
                answered = self._run(call)
            except QuiverError as exc:
                smaller = P.smaller_chunk(exc, len(part))
                if smaller is None:
                    raise
                size = smaller
                continue
            results += answered
            pos += len(part)
        return results

    def retrieve(self, name: str, ids: P.IdsLike, *, consistency: Optional[str] = None) -> Retrieved:
        """Rows by id, in the order asked, vectors exactly as stored; missing ids listed, not raised."""
        id_list = P.as_ids(ids)
        parts: List[C.RetrievedPart] = []
        size, pos = _limits.RETRIEVE_BATCH_IDS_MAX, 0
        while pos < len(id_list):
            chunk = id_list[pos : pos + size]
            try:
                parts.append(self._run(C.retrieve(name, chunk, consistency or self.consistency)))
            except QuiverError as exc:
                # Rows too long for the reply limit, or more ids than the
                # server takes: ask for fewer.
                smaller = P.smaller_chunk(exc, len(chunk))
                if smaller is None:
                    raise
                size = smaller
                continue
            pos += len(chunk)
        return P.join_retrieved(parts)

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

