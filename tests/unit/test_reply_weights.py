"""What one reply can weigh in a round: ``max-weight-share`` caps any reply's share of the
round's aggregation weight, and an aggregate that is not finite is refused."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedapp.methods.common.reply_validation import capped_weights
from fedapp.methods.common.strategy import finite_or_none


@pytest.mark.parametrize(
    ("weights", "share"),
    [
        ([10**12, 100, 100, 100], 0.25),
        ([10**12, 100, 100, 100], 0.4),
        ([500, 400, 100, 50, 50], 0.3),
        ([7, 7, 7, 7], 0.3),
        ([900, 900, 10, 10, 10, 10, 10, 10], 0.2),
    ],
)
def test_no_capped_weight_exceeds_its_share_and_the_small_ones_are_kept(weights, share) -> None:
    capped = capped_weights(weights, share)
    total = sum(capped)
    assert max(capped) <= share * total * (1 + 1e-12)
    cap = max(capped)
    for before, after in zip(weights, capped, strict=True):
        assert after == (before if before < cap else cap)  # only the largest are lowered


def test_an_inflated_reply_weighs_no_more_than_its_share() -> None:
    honest = [100, 120, 90]
    capped = capped_weights([10**12, *honest], 0.4)
    assert capped[1:] == honest
    assert capped[0] == pytest.approx(0.4 * 310 / 0.6)  # T = 0.4 (T + 310)
    # at 1/4 with four replies, lowering the liar alone is not enough: all become equal
    assert capped_weights([10**12, *honest], 0.25) == [90] * 4


def test_no_cap_or_weights_under_it_change_nothing() -> None:
    weights = [300, 200, 100]
    assert capped_weights(weights, 1.0) == weights
    assert capped_weights(weights, 0.5) == weights  # the largest share is exactly 0.5
    assert capped_weights([5], 0.1) == [5]


def test_a_share_no_k_weights_can_meet_makes_them_equal() -> None:
    assert capped_weights([9, 3, 1], 0.2) == [1, 1, 1]


def test_an_aggregate_that_is_not_finite_is_refused_and_said(caplog) -> None:
    overflowed = {"w": np.full(3, np.finfo(np.float32).max, np.float32) * np.float32(4)}
    finite = {"w": np.ones(3, np.float32), "steps": np.array([3], np.int64)}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert finite_or_none(7, overflowed) is None
        assert finite_or_none(8, finite) is finite
    assert "round 7: the aggregated state is not finite (w)" in caplog.text
    assert "round 8" not in caplog.text
