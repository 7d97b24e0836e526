"""A scripted HTTP server on 127.0.0.1 that counts requests: for failures the real one cannot be made to show.

Each request it reads is answered by the next step of its script: ``"close"``
drops the connection without an answer (a crash between request and reply),
an int answers that status with an error envelope, ``"ok"`` answers 200 with
the given data, and ``"trickle"`` answers the same a byte at a time, every
`TRICKLE_S`. The last step repeats. With `body_bytes_max`, a request whose
body is longer is answered 413 as soon as its head is read, and the
connection closed with the body unread (a reset, for the client still
sending it), as a server refusing a body by its `Content-Length` does; those
requests are counted in `refused`, not in the script. It runs in a daemon
thread, reads with a timeout, and stops when the test ends.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, List, Optional, Union

import orjson

Step = Union[str, int]

SOCKET_TIMEOUT_S = 5.0
TRICKLE_S = 0.02


class FakeServer:
    def __init__(self, script: List[Step], ok_data: Optional[Any] = None, body_bytes_max: Optional[int] = None) -> None:
        self.script = script
        self.ok_data = ok_data
        self.body_bytes_max = body_bytes_max
        self.requests: List[bytes] = []  # request lines, in order
        self.refused = 0  # requests answered 413 before their body was read
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def _next_step(self, request_line: bytes) -> Step:
        with self._lock:
            self.requests.append(request_line)
            index = min(len(self.requests) - 1, len(self.script) - 1)
            return self.script[index]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection: socket.socket) -> None:
        connection.settimeout(SOCKET_TIMEOUT_S)
        buffer = b""
        try:
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buffer:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if self.body_bytes_max is not None and length > self.body_bytes_max:
                    with self._lock:
                        self.refused += 1
                    connection.sendall(_reply(413, "REQUEST_TOO_LARGE", b"Connection: close\r\n"))
                    return
                while len(buffer) < length:
                    chunk = connection.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                buffer = buffer[length:]
                step = self._next_step(head.split(b"\r\n")[0])
                if step == "close":
                    return
                if step == "ok":
                    connection.sendall(self._ok())
                elif step == "trickle":
                    for byte in self._ok():
                        connection.sendall(bytes([byte]))
                        time.sleep(TRICKLE_S)
                else:
                    connection.sendall(_reply(int(step), "TOO_MANY_CONNECTIONS"))
        except (OSError, ValueError):
            return
        finally:
            connection.close()

    def _ok(self) -> bytes:
        body = orjson.dumps({"status": 200, "message": "ok", "data": self.ok_data})
        return _head(200, len(body)) + body

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=2)


def _head(status: int, length: int, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n" % (status, extra, length)


def _reply(status: int, code: str, extra: bytes = b"") -> bytes:
    """An error envelope with `code`."""
    body = orjson.dumps({"status": status, "message": "scripted", "error": {"code": code, "description": "scripted"}})
    return _head(status, len(body), extra) + body
