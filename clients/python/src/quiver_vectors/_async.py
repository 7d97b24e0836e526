"""The asynchronous client (asyncio): the same calls as `Client`, awaited.

Every method makes the same `Call`s as the sync client (`_calls`); only the
I/O differs. Uploads run as tasks, at most `parallel` in flight, each on its
own kept-alive connection. Bodies are encoded in a worker thread, a piece at a
time (see `_protocol.iter_batches`), so the event loop keeps moving earlier
bodies to the server while the next one is built.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, List, Optional, Set, Tuple, TypeVar

import httpx

from . import _calls as C
from . import _limits
from . import _protocol as P
from ._base import IDLE_CONNECTIONS_MAX, SOCKET_OPTIONS, _Core, transport_limits
from ._errors import IndexExistsError, IndexNotFoundError, QuiverError
from ._progress import Progress, open_progress
from ._retry import RETRYABLE_STATUS, RETRYABLE_TRANSPORT_ERRORS, RetryPolicy
from ._types import ClusterMember, ClusterStatus, Deleted, Health, Hit, IndexStats, Retrieved, Row, Skipped, WriteResult
from ._wire import AsyncWire, Content


T = TypeVar("T")


class AsyncClient(_Core):
    """A quiver server, called from asyncio. Arguments as for `Client`.

    Use it as an async context manager, or await `close()`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout_s: float = _limits.TIMEOUT_S,
        retry: Optional[RetryPolicy] = None,
        consistency: Optional[str] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        super().__init__(url, api_key, timeout_s, retry, consistency)
        self._wire: Optional[AsyncWire] = None
        self._transport: Optional[httpx.AsyncBaseTransport] = None
        if self._uses_wire(transport):
            self._wire = AsyncWire(
                self._host,
                self._port,
                self.timeout_s,
                self.connect_timeout_s,
                _limits.KEEPALIVE_EXPIRY_S,
                IDLE_CONNECTIONS_MAX,
            )
        else:
            self._transport = transport or httpx.AsyncHTTPTransport(
                limits=transport_limits(), retries=0, socket_options=SOCKET_OPTIONS
            )

    # -- I/O -------------------------------------------------------------------------------

    async def _exchange(self, method: str, path: str, body: Optional[bytes]) -> Tuple[int, Content]:
        if self._wire is not None:
            return await self._wire.exchange(self._head(method, path, body), body)
        assert self._transport is not None
        response = await self._transport.handle_async_request(self._request(method, path, body))
        try:
            return response.status_code, await response.aread()
        finally:
            await response.aclose()

    async def _run(self, call: C.Call[T]) -> T:
        started = time.monotonic()
        retry = 0
        while True:
            failure: Optional[BaseException] = None
            try:
                status, content = await self._exchange(call.method, call.path, call.body)
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
            await asyncio.sleep(delay)
            retry += 1

    async def close(self) -> None:
        """Closes the kept-alive connections."""
        if self._wire is not None:
            await self._wire.close()
        if self._transport is not None:
            await self._transport.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- Status ------------------------------------------------------------------------------

    async def health(self) -> Health:
        """The server's CPU and memory use and uptime (needs no key)."""
        return await self._run(C.health())

    async def test_auth(self) -> None:
        """Returns if the API key is good; raises `AuthenticationError` if not."""
        await self._run(C.test_auth())

    async def cluster(self) -> ClusterStatus:
        """This node's view of its cluster (role ``"single"`` outside one)."""
        return await self._run(C.cluster())

    async def add_member(self, id: int, address: str) -> ClusterMember:
        """Adds a waiting node to the cluster; returns once it votes (not retried)."""
        return await self._run(C.add_member(id, address))

    async def remove_member(self, id: int) -> None:
        """Removes a member from the cluster (not retried)."""
        await self._run(C.remove_member(id))

    async def metrics(self) -> str:
        """The Prometheus metrics, as text."""
        return await self._run(C.metrics())

    async def openapi(self) -> Any:
        """The server's OpenAPI document, as a dict."""
        return await self._run(C.openapi())

    # -- Indexes --------------------------------------------------------------------------------

    async def list_indexes(self, *, consistency: Optional[str] = None) -> List[str]:
        """Every index name, sorted."""
        return await self._run(C.list_indexes(consistency or self.consistency))

    async def create_index(
        self, name: str, dimensions: int, metric: str = "cosine", *, p: Optional[float] = None, exist_ok: bool = False
    ) -> None:
        """Creates an index; with `exist_ok`, an index of that name is left as it is (not retried)."""
        try:
            await self._run(C.create_index(name, dimensions, metric, p))
        except IndexExistsError:
            if not exist_ok:
                raise

    async def stats(self, name: str, *, consistency: Optional[str] = None) -> IndexStats:
        """An index's dimensions, metric and number of embeddings."""
        return await self._run(C.stats(name, consistency or self.consistency))

    async def delete_index(self, name: str, *, missing_ok: bool = False) -> None:
        """Deletes an index and its data; with `missing_ok`, no index of that name is fine."""
        try:
            await self._run(C.delete_index(name))
        except IndexNotFoundError:
            if not missing_ok:
                raise

    # -- Writes -----------------------------------------------------------------------------------

    async def insert(
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
        """Stores new rows; an id that exists is skipped. Not retried. See `Client.upsert`."""
        return await self._upload("insert", name, vectors, ids, metadata, progress, batch_rows, batch_bytes, parallel)

    async def upsert(
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
        """Stores rows, replacing those whose id exists. See `Client.upsert`."""
        return await self._upload("upsert", name, vectors, ids, metadata, progress, batch_rows, batch_bytes, parallel)

    async def _upload(
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
        loop = asyncio.get_running_loop()
        pending: Set["asyncio.Future[None]"] = set()
        try:
            first = await loop.run_in_executor(None, next, batches, None)
            second = await loop.run_in_executor(None, next, batches, None) if first is not None else None
            if second is None:
                # One request (the common small write): awaited here, as no
                # other request of this upload can run beside it.
                if first is not None:
                    try:
                        await self._send_batch(op, name, upload, first, outcomes, bar)
                    except QuiverError as exc:
                        error = exc
                return P.tally_writes(outcomes, len(upload), error)
            ready = [first, second]
            while True:
                while len(pending) >= parallel and error is None:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    error = P.first_error(done, error)
                if error is not None:
                    break  # send nothing more; let what is in flight finish
                batch = ready.pop(0) if ready else await loop.run_in_executor(None, next, batches, None)
                if batch is None:
                    break
                pending.add(asyncio.ensure_future(self._send_batch(op, name, upload, batch, outcomes, bar)))
            if pending:
                done, pending = await asyncio.wait(pending)
                error = P.first_error(done, error)
        finally:
            for task in pending:  # only when the upload itself was cancelled
                task.cancel()
            bar.close()
        return P.tally_writes(outcomes, len(upload), error)

    async def _send_batch(
        self, op: str, name: str, upload: P.Upload, batch: P.Batch, outcomes: List[P.Outcome], bar: Progress
    ) -> None:
        try:
            stored, skipped = await self._run(C.write(op, name, batch.body, len(batch)))
        except QuiverError as exc:
            # Past a server limit (413, or fewer items per request): the
            # same rows again, in smaller requests. Nothing of a refused
            # request was stored, so this is safe for insert too.
            size = P.smaller_chunk(exc, len(batch))
            if size is None:
                raise
            for lo in range(batch.lo, batch.hi, size):
                hi = min(lo + size, batch.hi)
                await self._send_batch(op, name, upload, P.Batch(lo, hi, upload.body(lo, hi)), outcomes, bar)
            return
        outcomes.append((batch.lo, stored, skipped))
        bar.advance(len(batch))

    async def delete(self, name: str, ids: P.IdsLike) -> Deleted:
        """Deletes rows by id: the ids deleted, and those skipped (missing) with why. See `Client.delete`."""
        id_list = P.as_ids(ids)
        deleted: List[int] = []
        skipped: List[Skipped] = []
        size, pos = _limits.DELETE_BATCH_IDS_MAX, 0
        while pos < len(id_list):
            chunk = id_list[pos : pos + size]
            try:
                part_deleted, part_skipped = await self._run(C.delete_ids(name, chunk))
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

    async def delete_by_filter(self, name: str, filter: P.Filter) -> int:
        """Deletes every row the filter matches (``{}``: every row), as one write; returns how many."""
        return await self._run(C.delete_filter(name, filter))

    # -- Reads ------------------------------------------------------------------------------------

    async def search(
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
        return await self._run(call)

    async def search_batch(
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
                answered = await self._run(call)
            except QuiverError as exc:
                smaller = P.smaller_chunk(exc, len(part))
                if smaller is None:
                    raise
                size = smaller
                continue
            results += answered
            pos += len(part)
        return results

    async def retrieve(self, name: str, ids: P.IdsLike, *, consistency: Optional[str] = None) -> Retrieved:
        """Rows by id, in the order asked, vectors exactly as stored; missing ids listed, not raised."""
        id_list = P.as_ids(ids)
        parts: List[C.RetrievedPart] = []
        size, pos = _limits.RETRIEVE_BATCH_IDS_MAX, 0
        while pos < len(id_list):
            chunk = id_list[pos : pos + size]
            try:
                parts.append(await self._run(C.retrieve(name, chunk, consistency or self.consistency)))
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

    async def scroll(
        self,
        name: str,
        *,
        filter: Optional[P.Filter] = None,
        with_vectors: bool = False,
        page_size: int = _limits.SCROLL_PAGE_ROWS,
        after: Optional[int] = None,
        consistency: Optional[str] = None,
    ) -> AsyncIterator[Row]:
        """Every row (that `filter` matches) in order of id, a page at a time: ``async for row in ...``."""
        while True:
            call = C.scroll(name, page_size, after, filter, with_vectors, consistency or self.consistency)
            rows, after = await self._run(call)
            for row in rows:
                yield row
            if after is None:
                return
