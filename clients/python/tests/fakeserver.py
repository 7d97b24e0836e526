"""A scripted HTTP server on 127.0.0.1 that counts requests: for failures the real one cannot be made to show.

Each request it reads is answered by the next step of its script: ``"close"``
drops the connection without an answer (a crash between request and reply),
an int answers that status with an error envelope, and ``"ok"`` answers 200
with the given data. The last step repeats. It runs in a daemon thread, reads
with a timeout, and stops when the test ends.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, List, Optional, Union

import orjson

Step = Union[str, int]

SOCKET_TIMEOUT_S = 5.0


class FakeServer:
    def __init__(self, script: List[Step], ok_data: Optional[Any] = None) -> None:
        self.script = script
        self.ok_data = ok_data
        self.requests: List[bytes] = []  # request lines, in order
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
                    body = orjson.dumps({"status": 200, "message": "ok", "data": self.ok_data})
                    status = 200
                else:
                    status = int(step)
                    body = orjson.dumps(
                        {
                            "status": status,
                            "message": "Service unavailable",
                            "error": {"code": "TOO_MANY_CONNECTIONS", "description": "scripted"},
                        }
                    )
                connection.sendall(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, len(body), body)
                )
        except (OSError, ValueError):
            return
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=2)
