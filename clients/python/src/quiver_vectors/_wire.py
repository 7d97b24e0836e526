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
connections reused while younger than the keep-alive expiry and not readable
(a readable idle connection was closed by the server, or holds bytes nobody
asked for, and is dropped rather than reused); a timeout on every socket
operation; a connection whose exchange failed in any way is closed, never
reused.
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from typing import Any, List, Optional, Tuple, Union

import httpx

#: A reply head larger than this is not quiver's (its heads are ~100 bytes).
HEAD_BYTES_MAX = 64 * 1024

#: Read size while waiting for a head (a body is then read whole into its own
#: buffer); under the allocator's mmap threshold, so a read costs no mmap.
RECV_BYTES = 64 * 1024

#: Bodies up to this size are sent in the same send as their head (one system
#: call, one TCP segment for a search); larger ones are sent after it, uncopied.
JOIN_BODY_BYTES_MAX = 64 * 1024

#: A reply body: a large one is read into a bytearray, which orjson reads as
#: it is (no copy into bytes).
Content = Union[bytes, bytearray]


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


# -- Sync ---------------------------------------------------------------------------------------


class _Connection:
    __slots__ = ("sock", "idle_since")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.idle_since = 0.0

    def usable(self, now: float, expiry_s: float) -> bool:
        if now - self.idle_since > expiry_s:
            return False
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class SyncWire:
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

    def _acquire(self) -> _Connection:
        now = time.monotonic()
        with self._lock:
            while self._idle:
                connection = self._idle.pop()
                if connection.usable(now, self.expiry_s):
                    return connection
                connection.close()
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except socket.timeout as exc:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port}: {exc}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {self.host}:{self.port}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout_s)
        return _Connection(sock)

    def _release(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        with self._lock:
            if not self._closed and len(self._idle) < self.idle_max:
                self._idle.append(connection)
                return
        connection.close()

    def exchange(self, head: bytes, body: Optional[bytes]) -> Tuple[int, Content]:
        """Sends one request and reads its reply: (status, body)."""
        connection = self._acquire()
        try:
            status, content, keep = _roundtrip(connection.sock, head, body)
        except BaseException:
            connection.close()
            raise
        if keep:
            self._release(connection)
        else:
            connection.close()
        return status, content

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


def _roundtrip(sock: socket.socket, head: bytes, body: Optional[bytes]) -> Tuple[int, Content, bool]:
    try:
        if body is None:
            sock.sendall(head)
        elif len(body) <= JOIN_BODY_BYTES_MAX:
            sock.sendall(head + body)
        else:
            sock.sendall(head)
            sock.sendall(body)
    except socket.timeout as exc:
        raise httpx.WriteTimeout(f"sending the request: {exc}") from exc
    except OSError as exc:
        raise httpx.WriteError(f"sending the request: {exc}") from exc
    try:
        buffer = b""
        while True:
            chunk = sock.recv(RECV_BYTES)
            if not chunk:
                raise httpx.RemoteProtocolError("the server closed the connection without a complete reply")
            buffer += chunk
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buffer) > HEAD_BYTES_MAX:
                raise httpx.RemoteProtocolError("reply head too large")
        status, length, keep = parse_head(buffer[:end])
        rest = buffer[end + 4 :]
        if length is None:
            return status, rest + _read_to_end(sock), False
        if len(rest) > length:
            raise httpx.RemoteProtocolError("more bytes than the reply's Content-Length")
        if len(rest) == length:
            return status, rest, keep
        content = bytearray(length)
        content[: len(rest)] = rest
        view = memoryview(content)
        got = len(rest)
        while got < length:
            n = sock.recv_into(view[got:])
            if n == 0:
                raise httpx.RemoteProtocolError("the server closed the connection in the middle of a reply")
            got += n
        return status, content, keep
    except socket.timeout as exc:
        raise httpx.ReadTimeout(f"waiting for the reply: {exc}") from exc
    except httpx.TransportError:
        raise
    except OSError as exc:
        raise httpx.ReadError(f"reading the reply: {exc}") from exc


def _read_to_end(sock: socket.socket) -> bytes:
    parts: List[bytes] = []
    while True:
        chunk = sock.recv(RECV_BYTES)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


# -- Async --------------------------------------------------------------------------------------


class _AsyncConnection:
    __slots__ = ("reader", "writer", "loop", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, loop: Any) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = loop
        self.idle_since = 0.0

    def usable(self, now: float, expiry_s: float, loop: Any) -> bool:
        # A connection belongs to the event loop that opened it; one left
        # from another loop (a test's, a script's earlier asyncio.run) is dropped.
        return (
            self.loop is loop
            and now - self.idle_since <= expiry_s
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):  # RuntimeError: its loop is closed
            pass


class AsyncWire:
    """Kept-alive asyncio connections to one host:port."""

    def __init__(
        self, host: str, port: int, timeout_s: float, connect_timeout_s: float, expiry_s: float, idle_max: int
    ) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.expiry_s = expiry_s
        self.idle_max = idle_max
        self._idle: List[_AsyncConnection] = []
        self._closed = False

    async def _acquire(self) -> _AsyncConnection:
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable(now, self.expiry_s, loop):
                return connection
            connection.close()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=HEAD_BYTES_MAX), self.connect_timeout_s
            )
        except asyncio.TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port}: timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"connecting to {self.host}:{self.port}: {exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _AsyncConnection(reader, writer, loop)

    def _release(self, connection: _AsyncConnection) -> None:
        connection.idle_since = time.monotonic()
        if not self._closed and len(self._idle) < self.idle_max:
            self._idle.append(connection)
        else:
            connection.close()

    async def exchange(self, head: bytes, body: Optional[bytes]) -> Tuple[int, Content]:
        connection = await self._acquire()
        try:
            status, content, keep = await asyncio.wait_for(_async_roundtrip(connection, head, body), self.timeout_s)
        except asyncio.TimeoutError as exc:
            connection.close()
            raise httpx.ReadTimeout("no complete reply within the timeout") from exc
        except BaseException:
            connection.close()
            raise
        if keep:
            self._release(connection)
        else:
            connection.close()
        return status, content

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


async def _async_roundtrip(connection: _AsyncConnection, head: bytes, body: Optional[bytes]) -> Tuple[int, bytes, bool]:
    reader, writer = connection.reader, connection.writer
    try:
        if body is not None and len(body) <= JOIN_BODY_BYTES_MAX:
            writer.write(head + body)
        else:
            writer.write(head)
            if body is not None:
                writer.write(body)
        await writer.drain()
    except OSError as exc:
        raise httpx.WriteError(f"sending the request: {exc}") from exc
    try:
        head_bytes = await reader.readuntil(b"\r\n\r\n")
        status, length, keep = parse_head(head_bytes[:-4])
        if length is None:
            return status, await reader.read(), False
        return status, await reader.readexactly(length), keep
    except asyncio.IncompleteReadError as exc:
        raise httpx.RemoteProtocolError("the server closed the connection without a complete reply") from exc
    except asyncio.LimitOverrunError as exc:
        raise httpx.RemoteProtocolError("reply head too large") from exc
    except OSError as exc:
        raise httpx.ReadError(f"reading the reply: {exc}") from exc
