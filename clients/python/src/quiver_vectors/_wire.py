"""A minimal HTTP/1.1 keep-alive client for plain ``http://``: the default way bytes travel.

Why not httpx's transport for everything: a search on a warm index is answered
in a few hundred microseconds to a few milliseconds, and httpx's stack (its
models, then httpcore and h11's state machines) spends about 200 to 350
microseconds of CPU per request, more than the budget the client has over the
server's own latency (0.3 ms). This module does only what quiver's answers
need (the server always sends `Content-Length` and never chunks a reply) in
about 30 microseconds, and raises httpx's exceptions, so the retry rules and
the errors callers see are the same whichever way a request went. Anything
else (https, a proxy, a transport the caller passes) goes through httpx.

What it does: one request at a time per connection; an idle pool of
connections reused while younger than the keep-alive expiry and still open
with nothing to read (`reusable`); a deadline of `timeout_s` for the whole
exchange of a request and its answer; an answer the server sent before it
read the whole request (a 413, then closing) is read and returned, as httpx
does; a connection whose exchange failed in any way is closed, never reused.
Sockets are non-blocking throughout: the sync path waits with poll() up to
the deadline, rather than with Python's socket timeouts, which take a system
call to set before each operation and a poll before each send.

The sync and async paths share everything but the waiting: the pool, the
check of an idle connection, the sending of a request in one or two pieces,
and the reading of a reply (`read_reply`, a generator that says where the
next bytes go and is told how many came). The async path's transport
receives straight into the buffers `read_reply` gives (`_Receiver`, a
buffered protocol), so a reply is read as it arrives, even one sent before
the request was whole.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from typing import Any, Generator, List, Optional, Tuple, Union

import httpx

#: A reply head larger than this is not quiver's (its heads are ~100 bytes).
HEAD_BYTES_MAX = 64 * 1024

#: Each connection's receive buffer, which a head must fit in; a small reply
#: arrives whole in it, a larger body is then read into a buffer of its own.
#: Under the allocator's mmap threshold, so allocating it costs no mmap.
RECV_BYTES = HEAD_BYTES_MAX

#: Bodies up to this size are sent in the same send as their head (one system
#: call, one TCP segment for a search); larger ones are sent after it, uncopied.
JOIN_BODY_BYTES_MAX = 64 * 1024

#: How long to wait for an answer after sending a request failed. A server
#: that answers before reading a whole body (413) sends the answer before it
#: closes, so the answer is already there when the sending fails; the wait
#: only bounds a connection that broke without one.
EARLY_REPLY_WAIT_S = 1.0

#: A reply body: a large one is read into a bytearray, which orjson reads as
#: it is (no copy into bytes).
Content = Union[bytes, bytearray]

#: Reads a reply: yields where the next bytes go, is sent how many came (0:
#: the connection closed), returns (status, body, keep the connection).
ReplyReader = Generator[memoryview, int, Tuple[int, Content, bool]]


def request_head(method: str, target: str, host: str, headers: bytes, body_len: Optional[int]) -> bytes:
    """The request line and headers; `headers` is pre-encoded ``Name: value\\r\\n`` lines."""
    length = b"" if body_len is None else b"Content-Length: %d\r\n" % body_len
    return b"%s %s HTTP/1.1\r\nHost: %s\r\n%s%s\r\n" % (
        method.encode("ascii"),
        target.encode("ascii"),
        host.encode("ascii"),
        headers,
        length,
    )


def parse_head(head: bytes) -> Tuple[int, Optional[int], bool]:
    """Status, Content-Length (None if absent) and whether the connection stays open."""
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        raise httpx.RemoteProtocolError(f"not an HTTP/1.x reply: {lines[0][:80]!r}")
    try:
        status = int(status_line[1])
    except ValueError:
        raise httpx.RemoteProtocolError(f"bad status line: {lines[0][:80]!r}") from None
    length: Optional[int] = None
    keep = status_line[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise httpx.RemoteProtocolError(f"bad Content-Length: {value[:40]!r}") from None
            if length < 0:
                raise httpx.RemoteProtocolError("negative Content-Length")
        elif name == b"connection":
            token = value.strip().lower()
            keep = token != b"close" and (keep or token == b"keep-alive")
        elif name == b"transfer-encoding":
            # quiver never chunks a reply; a server that does is not one this
            # path was written for.
            raise httpx.RemoteProtocolError("chunked replies are not supported on this path")
    if length is None:
        keep = False  # the body runs to the end of the connection
    return status, length, keep


def read_reply(buffer: bytearray) -> ReplyReader:
    """Reads one reply into `buffer` (a connection's) and, for a larger body, a buffer of its own."""
    view = memoryview(buffer)
    got = 0
    while True:
        n = yield view[got:]
        if n == 0:
            raise httpx.RemoteProtocolError("the server closed the connection without a complete reply")
        got += n
        end = buffer.find(b"\r\n\r\n", max(0, got - n - 3), got)
        if end >= 0:
            break
        if got == len(buffer):
            raise httpx.RemoteProtocolError("reply head too large")
    status, length, keep = parse_head(bytes(view[:end]))
    start = end + 4
    if length is None:  # the body runs to the end of the connection
        parts = [bytes(view[start:got])]
        while True:
            n = yield view
            if n == 0:
                return status, b"".join(parts), False
            parts.append(bytes(view[:n]))
    if got - start > length:
        raise httpx.RemoteProtocolError("more bytes than the reply's Content-Length")
    if got - start == length:
        return status, bytes(view[start:got]), keep
    content = bytearray(length)
    content[: got - start] = view[start:got]
    body = memoryview(content)
    filled = got - start
    while filled < length:
        n = yield body[filled:]
        if n == 0:
            raise httpx.RemoteProtocolError("the server closed the connection in the middle of a reply")
        filled += n
    return status, content, keep


def _pieces(head: bytes, body: Optional[bytes]) -> Tuple[bytes, ...]:
    """What to send: a small body joined to its head, a large one after it, uncopied."""
    if body is None:
        return (head,)
    if len(body) <= JOIN_BODY_BYTES_MAX:
        return (head + body,)
    return (head, body)


def reusable(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection (a non-blocking socket) can carry a request.

    One peek at the socket, which works for any descriptor (``select`` fails
    past 1024) and sees what the server did while the connection was idle:
    nothing to read, it is open (usable); the end of the stream, the server
    closed it; bytes nobody asked for, it is in no state to reuse.
    """
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False  # closed (b""), or bytes nobody asked for


class _Connection:
    """A socket to the server and its receive buffer."""

    __slots__ = ("sock", "buffer", "idle_since", "_polls")

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.sock = sock
        self.buffer = bytearray(RECV_BYTES)
        self.idle_since = 0.0
        self._polls: Optional[Tuple[Any, Any]] = None  # (readable, writable), made at the first wait

    def wait(self, writing: bool, deadline: float) -> None:
        """Returns once the socket can be read (or written); past `deadline`, raises `socket.timeout`."""
        left = deadline - time.monotonic()
        if left > 0:
            if not hasattr(select, "poll"):  # Windows, whose select() takes any socket
                readers, writers = ([], [self.sock]) if writing else ([self.sock], [])
                if any(select.select(readers, writers, [], left)):
                    return
            else:
                if self._polls is None:
                    readable, writable = select.poll(), select.poll()
                    readable.register(self.sock, select.POLLIN)
                    writable.register(self.sock, select.POLLOUT)
                    self._polls = (readable, writable)
                if self._polls[writing].poll(left * 1000):
                    return
        raise socket.timeout("timed out")

    def usable(self) -> bool:
        return reusable(self.sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Wire:
    """Kept-alive connections to one host:port, safe to share between threads."""

    def __init__(
        self, host: str, port: int, timeout_s: float, connect_timeout_s: float, expiry_s: float, idle_max: int
    ) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.expiry_s = expiry_s
        self.idle_max = idle_max
        self._idle: List[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _take_idle(self) -> Optional[_Connection]:
        """The newest idle connection that can be reused; the others found on the way are closed."""
        now = time.monotonic()
        while True:
            with self._lock:
                if not self._idle:
                    return None
                connection = self._idle.pop()
            if now - connection.idle_since <= self.expiry_s and connection.usable():
                return connection
            connection.close()

    def _done(self, connection: _Connection, keep: bool) -> None:
        if keep:
            connection.idle_since = time.monotonic()
            with self._lock:
                if not self._closed and len(self._idle) < self.idle_max:
                    self._idle.append(connection)
                    return
        connection.close()

    def _connect_error(self, exc: BaseException) -> httpx.TransportError:
        where = f"connecting to {self.host}:{self.port}"
        if isinstance(exc, (socket.timeout, asyncio.TimeoutError)):
            return httpx.ConnectTimeout(f"{where}: timed out")
        return httpx.ConnectError(f"{where}: {exc}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _write_error(exc: BaseException) -> httpx.TransportError:
    if isinstance(exc, socket.timeout):
        return httpx.WriteTimeout(f"sending the request: {exc}")
    return httpx.WriteError(f"sending the request: {exc}")


def _read_error(exc: BaseException) -> httpx.TransportError:
    if isinstance(exc, socket.timeout):
        return httpx.ReadTimeout(f"waiting for the reply: {exc}")
    return httpx.ReadError(f"reading the reply: {exc}")


# -- Sync ---------------------------------------------------------------------------------------


class SyncWire(_Wire):
    def exchange(self, head: bytes, body: Optional[bytes]) -> Tuple[int, Content]:
        """Sends one request and reads its reply, within `timeout_s` in all: (status, body)."""
        connection = self._take_idle() or self._connect()
        deadline = time.monotonic() + self.timeout_s
        try:
            status, content, keep = _roundtrip(connection, head, body, deadline)
        except BaseException:
            connection.close()
            raise
        self._done(connection, keep)
        return status, content

    def _connect(self) -> _Connection:
        try:
            return _Connection(socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s))
        except OSError as exc:
            raise self._connect_error(exc) from exc


def _roundtrip(connection: _Connection, head: bytes, body: Optional[bytes], deadline: float) -> Tuple[int, Content, bool]:
    try:
        for piece in _pieces(head, body):
            _send(connection, piece, deadline)
    except OSError as exc:
        if isinstance(exc, socket.timeout):
            raise _write_error(exc) from exc
        try:
            early = min(deadline, time.monotonic() + EARLY_REPLY_WAIT_S)
            status, content, _ = _receive(connection, read_reply(connection.buffer), early)
        except httpx.TransportError:
            raise _write_error(exc) from exc
        return status, content, False  # the server closed it, or is closing it
    return _receive(connection, read_reply(connection.buffer), deadline)


def _send(connection: _Connection, data: bytes, deadline: float) -> None:
    try:
        sent = connection.sock.send(data)  # a small request goes whole, at once
    except BlockingIOError:
        sent = 0
    view = memoryview(data)[sent:]
    while view:
        connection.wait(True, deadline)
        try:
            view = view[connection.sock.send(view) :]
        except BlockingIOError:
            continue


def _receive(connection: _Connection, reader: ReplyReader, deadline: float) -> Tuple[int, Content, bool]:
    try:
        into = next(reader)
        while True:
            # Waiting first: right after a request, its answer is not there yet.
            connection.wait(False, deadline)
            try:
                n = connection.sock.recv_into(into)
            except BlockingIOError:
                continue
            try:
                into = reader.send(n)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
    except OSError as exc:
        raise _read_error(exc) from exc


# -- Async --------------------------------------------------------------------------------------


class AsyncWire(_Wire):
    """As `SyncWire`, awaited."""

    async def exchange(self, head: bytes, body: Optional[bytes]) -> Tuple[int, Content]:
        loop = asyncio.get_running_loop()
        connection = self._take_idle() or await self._connect(loop)
        assert isinstance(connection, _AsyncConnection)
        try:
            reply = connection.receiver.expect(loop, read_reply(connection.buffer))
            for piece in _pieces(head, body):
                connection.transport.write(piece)
            status, content, keep = await asyncio.wait_for(reply, self.timeout_s)
        except asyncio.TimeoutError as exc:
            connection.close()
            raise httpx.ReadTimeout("no complete reply within the timeout") from exc
        except BaseException:
            connection.close()
            raise
        self._done(connection, keep)
        return status, content

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> "_AsyncConnection":
        try:
            sock = await asyncio.wait_for(_async_connect(loop, self.host, self.port), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise self._connect_error(exc) from exc
        connection = _AsyncConnection(sock, loop)
        try:
            await loop.create_connection(lambda: connection.receiver, sock=sock)
        except BaseException:
            connection.close()
            raise
        return connection


class _Receiver(asyncio.BufferedProtocol):
    """Receives one connection's replies: the transport reads into the buffers of the reply being read.

    Between exchanges nothing is expected: bytes or the end of the stream
    then mark the connection broken, never to be reused.
    """

    def __init__(self, idle_buffer: bytearray) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.broken = False
        self._idle = memoryview(idle_buffer)
        self._reader: Optional[ReplyReader] = None
        self._into = self._idle
        self._reply: "Optional[asyncio.Future[Tuple[int, Content, bool]]]" = None

    def expect(self, loop: asyncio.AbstractEventLoop, reader: ReplyReader) -> "asyncio.Future[Tuple[int, Content, bool]]":
        """The reply `reader` reads from the bytes that come next."""
        self._reader, self._into = reader, next(reader)
        self._reply = loop.create_future()
        return self._reply

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._into

    def buffer_updated(self, nbytes: int) -> None:
        self._feed(nbytes)

    def eof_received(self) -> bool:
        self._feed(0)
        return False  # the transport closes

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if exc is None:
            self._feed(0)
        else:
            self._end(_read_error(exc))
        self.broken = True

    def _feed(self, nbytes: int) -> None:
        if self._reader is None:
            self.broken = True  # bytes nobody asked for, or the end of the stream
            return
        try:
            self._into = self._reader.send(nbytes)
        except StopIteration as done:
            self._end(done.value)
        except httpx.TransportError as exc:
            self._end(exc)

    def _end(self, outcome: Any) -> None:
        reply, self._reply, self._reader, self._into = self._reply, None, None, self._idle
        if reply is None or reply.done():  # no exchange, or it was given up (cancelled, timed out)
            return
        if isinstance(outcome, BaseException):
            reply.set_exception(outcome)
        else:
            reply.set_result(outcome)


class _AsyncConnection(_Connection):
    """A connection of the async path: its socket is read by the event loop's transport."""

    __slots__ = ("receiver", "loop")

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(sock)
        self.receiver = _Receiver(self.buffer)
        self.loop = loop

    @property
    def transport(self) -> asyncio.Transport:
        assert self.receiver.transport is not None
        return self.receiver.transport

    def usable(self) -> bool:
        # The transport reads while the event loop runs, and marks what it
        # sees; the socket holds what arrived while the loop was busy. A
        # connection belongs to the loop that opened it.
        return self.loop is asyncio.get_running_loop() and not self.receiver.broken and reusable(self.sock)

    def close(self) -> None:
        transport = self.receiver.transport
        if transport is not None:
            try:
                transport.close()
                return
            except RuntimeError:  # its event loop is closed
                pass
        super().close()


async def _async_connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    try:
        # A numeric address (the usual case) is read without a lookup, which
        # the loop would otherwise run in a thread.
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    failure: Optional[OSError] = None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            return sock
        except OSError as exc:
            sock.close()
            failure = exc
        except BaseException:
            sock.close()
            raise
    raise failure or OSError(f"no address for {host}")
