"""`quiver_vectors.testing`: a server that cannot start says why, at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import BINARY

from quiver_vectors.testing import Server, ServerError, readme_snippet


def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="no quiver binary at .*nowhere"):
        Server(tmp_path / "data", binary=str(tmp_path / "nowhere"))


def test_a_server_that_exits_before_listening_shows_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="exited before listening:(.|\n)*--no-such-flag"):
        Server(tmp_path / "data", binary=BINARY, args=["--no-such-flag"])


def test_a_readme_snippet_is_the_one_block_importing_from_a_module(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("```python\nfrom a import b\nb()\n```\n\n```python\nfrom c import d\n```\n")
    assert readme_snippet(readme, "a") == "from a import b\nb()\n"
    with pytest.raises(ValueError, match="found 0"):
        readme_snippet(readme, "e")
