"""The repository README's snippet for this client, run as written against a fresh server.

The snippet reads the server's address and key from `QUIVER_URL` and
`QUIVER_API_KEY`, as the README tells users to set them; the test sets them
to its own server and runs the text of the block, unchanged, in a fresh
interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import Server

from quiver_vectors.testing import readme_snippet

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_snippet_runs_as_written(server: Server) -> None:
    env = dict(os.environ, QUIVER_URL=server.url, QUIVER_API_KEY=server.key)
    code = readme_snippet(README, "quiver_vectors")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    # The three nearest rows from 2020 on, by a brute-force cosine oracle.
    vectors = np.random.default_rng(0).random((10_000, 384), dtype=np.float32).astype(np.float64)
    cosine = vectors @ vectors[0] / np.linalg.norm(vectors, axis=1) / np.linalg.norm(vectors[0])
    cosine[np.arange(10_000) % 25 < 20] = -np.inf
    hits = re.findall(r"Hit\(id=(\d+).*?'year': (\d+)", run.stdout)
    assert [int(id) for id, _ in hits] == list(np.argsort(-cosine, kind="stable")[:3]), run.stdout
    assert all(int(year) >= 2020 for _, year in hits), run.stdout
    with server.client() as client:
        assert client.stats("papers").count == 10_000
