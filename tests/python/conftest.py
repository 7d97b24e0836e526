"""Starts the real quiver binary on a free port with a temporary data directory."""

import os
import subprocess
import threading

import pytest

KEY = "python-test-key-0123456789"
BINARY = os.environ.get("QUIVER_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "target", "debug", "quiver"))


class Server:
    def __init__(self, tmp_path):
        self.process = subprocess.Popen(
            [BINARY, "--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "data"), "--api-key", KEY],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        for line in self.process.stderr:
            self.log.append(line)
            if "listening on " in line:
                address = line.split("listening on ")[1].split(",")[0]
                break
        else:
            raise RuntimeError("quiver exited before listening:\n" + "".join(self.log))
        self.url = f"http://{address}"
        self.key = KEY
        # Keep reading the log so the server never blocks on a full pipe.
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()

    def stop(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def server(tmp_path):
    running = Server(tmp_path)
    yield running
    assert running.process.poll() is None, "quiver died during the test:\n" + "".join(running.log)
    running.stop()
