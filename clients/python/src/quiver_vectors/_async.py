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
from typing import Any, AsyncIterator, Callable, List, Optional, Sequence, Set, Tuple, TypeVar, Union

import httpx

from . import _calls as C
from . import _limits
from . import _protocol as P
from ._base import IDLE_CONNECTIONS_MAX, SOCKET_OPTIONS, _Core, transport_limits
from ._errors import IndexExistsError, IndexNotFoundError, QuiverError
from ._retry import RETRYABLE_STATUS, RETRYABLE_TRANSPORT_ERRORS, RetryPolicy
from ._types import ClusterMember, ClusterStatus, Deleted, Health, Hit, IndexStats, Retrieved, Row, Search, WriteResult
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

    async def _drive(self, plan: "C.Plan[T]") -> T:
        """Carries out a plan (see `_calls`): awaits each call it yields and sends it the result."""
        send: Callable[[Any], C.Call[Any]] = plan.send
        value: Any = None
        while True:
            try:
                call = send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            try:
                value, send = await self._run(call), plan.send
            except QuiverError as exc:
                value, send = exc, plan.throw  # the plan may handle it; if not, it comes back out

    async def close(self) -> None:
        """Closes the kept-alive connections."""
        if self._wire is not None:
            self._wire.close()
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
        upload = C.Uploader(op, name, vectors, ids, metadata, progress, batch_rows, batch_bytes, parallel)
        error: Optional[QuiverError] = None
        loop = asyncio.get_running_loop()
        pending: Set["asyncio.Future[None]"] = set()

        def encoded() -> "asyncio.Future[Optional[P.Batch]]":
            return loop.run_in_executor(None, next, upload.batches, None)

        try:
            first = await encoded()
            second = await encoded() if first is not None else None
            if second is None:
                # One request (the common small write): awaited here, as no
                # other request of this upload can run beside it.
                if first is not None:
                    try:
                        await self._drive(upload.send(first))
                    except QuiverError as exc:
                        error = exc
            else:
                lanes = upload.lanes()
                batch: Optional[P.Batch] = first
                later: List[P.Batch] = [second]
                while batch is not None:
                    while len(pending) >= lanes and error is None:
                        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                        error = P.first_error(done, error)
                    if error is not None:
                        break  # send nothing more; let what is in flight finish
                    pending.add(asyncio.ensure_future(self._drive(upload.send(batch))))
                    # The next batch is encoded while this one is sent.
                    batch = later.pop() if later else await encoded()
                if pending:
                    done, pending = await asyncio.wait(pending)
                    error = P.first_error(done, error)
        finally:
            for task in pending:  # only when the upload itself was cancelled
                task.cancel()
            upload.close()
        return upload.result(error)

    async def delete(self, name: str, ids: P.IdsLike) -> Deleted:
        """Deletes rows by id: the ids deleted, and those skipped (missing) with why. See `Client.delete`."""
        return await self._drive(C.delete_plan(name, P.as_ids(ids)))

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
        vectors: Union[P.VectorsLike, Sequence[Search]],
        k: int = 10,
        *,
        filter: Optional[P.Filter] = None,
        with_scores: bool = True,
        with_vectors: bool = False,
        consistency: Optional[str] = None,
    ) -> List[List[Hit]]:
        """Many searches, run together by the server; results in the order asked. See `Client.search_batch`."""
        searches = P.batch_searches(vectors, k, filter, with_scores, with_vectors)
        return await self._drive(C.search_batch_plan(name, searches, consistency or self.consistency))

    async def retrieve(self, name: str, ids: P.IdsLike, *, consistency: Optional[str] = None) -> Retrieved:
        """Rows by id, in the order asked, vectors exactly as stored; missing ids listed, not raised. See `Client.retrieve`."""
        return await self._drive(C.retrieve_plan(name, P.as_ids(ids), consistency or self.consistency))

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
