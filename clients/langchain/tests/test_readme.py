"""The repository README's LangChain snippet, run as written against a fresh server.

The snippet reads the server's address and key from `QUIVER_URL` and
`QUIVER_API_KEY`, as the README tells users to set them; the test sets them
to its own server and runs the block's text, unchanged, in a fresh
interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from quiver_vectors import Client
from quiver_vectors.testing import readme_snippet

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_snippet_runs_as_written(server) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ, QUIVER_URL=server.url, QUIVER_API_KEY=server.key)
    code = readme_snippet(README, "langchain_quiver")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    # The one text whose tags hold "db", with its typed metadata, and a score.
    assert "page_content='quiver answers exactly'" in run.stdout, run.stdout
    assert "'year': 2026" in run.stdout and "'tags': ['db']" in run.stdout, run.stdout
    assert "arrows" not in run.stdout, run.stdout
    with Client(server.url, api_key=server.key) as client:
        assert client.stats("notes").count == 2
