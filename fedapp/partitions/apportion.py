"""Whole counts in proportion to weights: each gets its share rounded down, and the places left
over go to the largest remainders (ties to the earlier weight), so the counts sum to the total."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def apportion(weights: Sequence[float] | np.ndarray, total: int) -> np.ndarray:
    """``total`` split in proportion to ``weights`` by largest remainders."""
    weights = np.asarray(weights, dtype=np.float64)
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(int)
    order = np.lexsort((np.arange(len(weights)), -(exact - counts)))
    counts[order[: total - int(counts.sum())]] += 1
    return counts
