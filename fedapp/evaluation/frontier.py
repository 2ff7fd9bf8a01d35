"""How much an accuracy-per-MAC frontier rises: from its cheapest to its costliest point, and in
rank order (Spearman's rho of MACs and accuracy), so that "accuracy grows with the budget" is a
number a reader can check against the points' intervals."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class FrontierRise:
    """The rise of a method's operating points (accuracies as fractions)."""

    points: int
    rise: float  # accuracy of the point with the most MACs minus that of the one with the fewest
    spearman: float  # rank correlation of MACs and accuracy; NaN when either is constant


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties sharing the mean of the ranks they span (as Spearman's rho needs)."""
    array = np.asarray(values, dtype=np.float64)
    order = np.argsort(array, kind="stable")
    ranks = np.empty(array.size, dtype=np.float64)
    ranks[order] = np.arange(1, array.size + 1)
    for value in np.unique(array):
        tied = array == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the average ranks."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"Spearman's rho needs two equal-length samples of >= 2, got {len(x)}")
    rx, ry = average_ranks(x), average_ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    scale = math.sqrt(float(dx @ dx) * float(dy @ dy))
    return float(dx @ dy) / scale if scale > 0 else math.nan


def frontier_rise(points: Sequence[Mapping[str, Any]]) -> FrontierRise | None:
    """The rise of points that carry ``macs`` and ``accuracy``; None for fewer than two."""
    if len(points) < 2:
        return None
    macs = [float(p["macs"]) for p in points]
    accuracy = [float(p["accuracy"]) for p in points]
    cheapest, costliest = int(np.argmin(macs)), int(np.argmax(macs))
    return FrontierRise(
        points=len(points),
        rise=accuracy[costliest] - accuracy[cheapest],
        spearman=spearman(macs, accuracy),
    )
