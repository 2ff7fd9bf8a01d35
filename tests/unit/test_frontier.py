"""The rise of a frontier: its end-to-end gain and Spearman's rho, checked by hand and against
the definition (Pearson's correlation of average ranks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedapp.evaluation.frontier import average_ranks, frontier_rise, spearman


def test_average_ranks_share_ties() -> None:
    np.testing.assert_array_equal(average_ranks([3.0, 1.0, 3.0, 2.0]), [3.5, 1.0, 3.5, 2.0])


def test_spearman_by_hand() -> None:
    # ranks of y: 1 3 2 4 5 -> d = 0 -1 1 0 0 -> rho = 1 - 6 * 2 / (5 * 24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [0.1, 0.3, 0.2, 0.4, 0.5]) == pytest.approx(0.9)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2, 3], [0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="two equal-length"):
        spearman([1], [1])


def test_frontier_rise_from_points_in_any_order() -> None:
    points = [
        {"macs": 14e6, "accuracy": 0.90},
        {"macs": 0.6e6, "accuracy": 0.85},
        {"macs": 5e6, "accuracy": 0.88},
        {"macs": 9e6, "accuracy": 0.87},
    ]
    rise = frontier_rise(points)
    assert rise is not None and rise.points == 4
    assert rise.rise == pytest.approx(0.05)
    assert rise.spearman == pytest.approx(0.8)  # d = 0 0 -1 1 -> 1 - 6 * 2 / 60
    assert frontier_rise(points[:1]) is None
