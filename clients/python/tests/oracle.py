"""A brute-force NumPy oracle for search results, and small helpers the tests share.

The server scores in float32, so two rows whose true scores differ by less
than float32 rounding may come in either order; the oracle scores in float64
and accepts a swap only between rows whose true scores are that close.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from quiver_vectors import Hit

LARGER_IS_NEARER = {"cosine": True, "ip": True, "l2": False}

#: Relative closeness below which two true scores may come in either order.
TIE_TOLERANCE = 1e-5


def true_scores(metric: str, data: np.ndarray, query: np.ndarray) -> np.ndarray:
    x = data.astype(np.float64)
    q = np.asarray(query, dtype=np.float64)
    if metric == "cosine":
        return (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))
    if metric == "ip":
        return x @ q
    if metric == "l2":
        return ((x - q) ** 2).sum(axis=1)
    raise ValueError(metric)


def expected_ids(
    metric: str, data: np.ndarray, ids: Sequence[int], query: np.ndarray, k: int, mask: Optional[np.ndarray] = None
) -> List[int]:
    scores = true_scores(metric, data, query)
    id_array = np.asarray(ids)
    keep = np.ones(len(ids), dtype=bool) if mask is None else mask
    primary = -scores[keep] if LARGER_IS_NEARER[metric] else scores[keep]
    order = np.lexsort((id_array[keep], primary))  # by score, then id ascending
    return id_array[keep][order][:k].tolist()


def assert_hits_match(
    hits: List[Hit],
    metric: str,
    data: np.ndarray,
    ids: Sequence[int],
    query: np.ndarray,
    k: int,
    mask: Optional[np.ndarray] = None,
    with_scores: bool = True,
) -> None:
    """The hits are the exact k nearest (among `mask`), in order, with the server's scores."""
    expected = expected_ids(metric, data, ids, query, k, mask)
    scores = true_scores(metric, data, query)
    score_of: Dict[int, float] = dict(zip(np.asarray(ids).tolist(), scores.tolist()))
    assert [h.rank for h in hits] == list(range(len(hits)))
    assert len(hits) == len(expected), (len(hits), len(expected))
    scale = max(1.0, max(abs(score_of[i]) for i in expected)) if expected else 1.0
    for position, (hit, want) in enumerate(zip(hits, expected)):
        if hit.id != want:
            gap = abs(score_of[hit.id] - score_of[want])
            assert gap <= TIE_TOLERANCE * scale, f"rank {position}: got id {hit.id}, expected {want} (gap {gap})"
        if with_scores:
            assert hit.score is not None
            assert abs(hit.score - score_of[hit.id]) <= 1e-4 * scale, (hit.score, score_of[hit.id])
        else:
            assert hit.score is None
    if mask is not None:
        allowed = set(np.asarray(ids)[mask].tolist())
        assert all(h.id in allowed for h in hits)


def bits(array: np.ndarray) -> List[int]:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).ravel().tolist()


def random_float32_bits(rng: np.random.Generator, shape: tuple, magnitude_max: float) -> np.ndarray:
    """Random bit patterns: every exponent and mantissa, subnormals included, finite and bounded."""
    raw = rng.integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out: np.ndarray = np.where(np.isfinite(raw) & (np.abs(raw) <= magnitude_max), raw, np.float32(0.5))
    return out.astype(np.float32)
