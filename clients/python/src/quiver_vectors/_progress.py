"""An optional progress bar for uploads, counted in rows.

tqdm is an extra (`pip install 'quiver-vectors[progress]'`), imported only when
a bar is asked for: most programs never show one and should not pay for the
import. Asking for a bar without tqdm installed is an error, not a silent
no-op, since the caller asked to see something.
"""

from __future__ import annotations

import threading
from typing import Any, Optional


class Progress:
    """A bar (or nothing) that several threads may advance at once."""

    __slots__ = ("_bar", "_lock")

    def __init__(self, bar: Optional[Any]) -> None:
        self._bar = bar
        self._lock = threading.Lock()

    def advance(self, rows: int) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(rows)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def open_progress(progress: bool, total: int, what: str) -> Progress:
    if not progress:
        return Progress(None)
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise ImportError(
            "progress=True shows a tqdm bar, and tqdm is not installed: "
            "pip install 'quiver-vectors[progress]' (or pip install tqdm)"
        ) from None
    return Progress(tqdm(total=total, unit="rows", desc=what, unit_scale=True))
