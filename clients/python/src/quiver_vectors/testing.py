"""A real quiver server for tests: one process on 127.0.0.1, a free port, a data directory of its own.

Tests of code that talks to quiver are worth most against the real thing.
`Server` starts the binary (``$QUIVER_BIN``, or a path given), waits, bounded
in time, until its log says where it listens, and keeps reading the log so
the process never blocks on a full pipe. This package's tests and those of
the LangChain and LlamaIndex stores use it; so can any project's::

    from quiver_vectors.testing import Server

    server = Server(tmp_path / "data")
    with server.client() as client:
        ...
    server.kill()
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

from ._sync import Client

#: The key the servers started here take, unless one is given.
KEY = "quiver-test-key-0123456789"

#: How long a server may take to start listening before it is killed.
START_TIMEOUT_S = 30.0

#: How long a killed server may take to exit.
STOP_TIMEOUT_S = 10.0


class ServerError(RuntimeError):
    """The server did not start: its log is in the message."""


def binary(default: Union[str, Path]) -> str:
    """The quiver binary: ``$QUIVER_BIN``, else `default`."""
    return os.environ.get("QUIVER_BIN") or str(default)


class Server:
    """One quiver process on 127.0.0.1, listening on a free port (or `port`).

    `url`, `address`, `port` and `key` say how to reach it; `log` holds its
    log lines so far. `args` are more flags for it.
    """

    def __init__(
        self,
        data_dir: Union[str, Path],
        *,
        binary: str,
        args: Sequence[str] = (),
        key: str = KEY,
        port: int = 0,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if not os.path.exists(binary):
            raise ServerError(f"no quiver binary at {binary}: build it, or set QUIVER_BIN")
        self.data_dir = Path(data_dir)
        self.key = key
        self.log: List[str] = []
        self.process = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir), "--api-key", key]
            + list(args),
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump() -> None:
            # Keeps reading the log so the server never blocks on a full pipe.
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise ServerError("quiver did not start listening in time:\n" + "".join(self.log)) from None
            if line is None:
                raise ServerError("quiver exited before listening:\n" + "".join(self.log))
            if "listening on " in line:
                self.address = line.split("listening on ")[1].split(",")[0].strip()
                break
        self.url = f"http://{self.address}"
        self.port = int(self.address.rsplit(":", 1)[1])

    def client(self, **kwargs: Any) -> Client:
        """A client of this server (keyword arguments as `Client` takes them)."""
        return Client(self.url, api_key=self.key, **kwargs)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Kills the process (``kill -9``: nothing is flushed that was not already durable)."""
        if self.process.poll() is None:
            self.process.kill()
        # The log's reader ends at the pipe's end, once the process is gone.
        self.process.wait(timeout=STOP_TIMEOUT_S)


def readme_snippet(readme: Union[str, Path], importing: str) -> str:
    """The one ```python block of `readme` that imports from `importing`, as written."""
    blocks = re.findall(r"```python\n(.*?)```", Path(readme).read_text(), re.S)
    found = [block for block in blocks if f"from {importing} import" in block]
    if len(found) != 1:
        raise ValueError(f"expected one block importing from {importing} in {readme}, found {len(found)}")
    return found[0]
