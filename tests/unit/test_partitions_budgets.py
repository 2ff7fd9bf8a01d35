"""Zipf budgets and gamma-allocation shares (FEAST §3)."""

from __future__ import annotations

import numpy as np
import pytest

from fedapp.partitions.budgets import (
    _zipf_budgets_from,
    allocation_shares,
    rank_probabilities,
    zipf_budgets,
)

B_MIN, B_MAX, S = 24_957_968.0, 1.5e9, 1.2  # the reference's smallest variant, Bmax, exponent


def test_budgets_are_clipped_float64_and_reproducible() -> None:
    for seed in range(50):
        budgets = zipf_budgets(100, B_MIN, B_MAX, S, seed)
        assert budgets.shape == (100,) and budgets.dtype == np.float64
        assert budgets.min() >= B_MIN and budgets.max() <= B_MAX
    assert np.array_equal(
        zipf_budgets(100, B_MIN, B_MAX, S, 3), zipf_budgets(100, B_MIN, B_MAX, S, 3)
    )
    assert not np.array_equal(
        zipf_budgets(100, B_MIN, B_MAX, S, 3), zipf_budgets(100, B_MIN, B_MAX, S, 4)
    )
    # Clipping really happens: rank-1 jitter below Bmin lands exactly on Bmin.
    assert (zipf_budgets(100, B_MIN, B_MAX, S, 0) == B_MIN).any()


def test_rank_distribution_matches_zipf() -> None:
    """Ranks recovered from 40,000 budgets follow P(r) ∝ r^-s.

    A budget lies within half a step of its rank's grid point, so the rank is
    round((b - Bmin) / Δ) + 1. Tolerances: each rank frequency within 0.01 of P(r)
    (about 4.5 standard errors for rank 1, P = 0.2775) and total variation below 0.03.
    """
    n = 100
    step = (B_MAX - B_MIN) / (n - 1)
    budgets = np.concatenate([zipf_budgets(n, B_MIN, B_MAX, S, seed) for seed in range(400)])
    ranks = np.rint((budgets - B_MIN) / step).astype(int) + 1
    frequencies = np.bincount(ranks, minlength=n + 1)[1:] / ranks.size
    expected = rank_probabilities(n, S)
    assert expected[0] == pytest.approx(0.2775, abs=1e-4)
    assert np.abs(frequencies - expected).max() < 0.01
    assert 0.5 * np.abs(frequencies - expected).sum() < 0.03


def test_reference_figures_with_the_legacy_rng() -> None:
    """np.random.seed(0) in the reference (the FEAST authors' draw) gives these counts."""
    budgets = _zipf_budgets_from(np.random.RandomState(0), 100, B_MIN, B_MAX, S)
    mega = 1e6
    assert (budgets == B_MIN).sum() == 15
    assert (budgets <= 50 * mega).sum() == 43
    assert (budgets <= 100 * mega).sum() == 59
    assert (budgets >= 600 * mega).sum() == 10
    assert (budgets < 35 * mega).sum() == 32
    assert budgets.max() / mega == pytest.approx(1360.9, abs=0.05)


def test_degenerate_cases() -> None:
    assert np.array_equal(zipf_budgets(1, B_MIN, B_MAX, S, 0), [B_MAX])
    assert np.array_equal(zipf_budgets(5, 7.0, 7.0, S, 0), [7.0] * 5)
    uniform = rank_probabilities(4, 0.0)
    assert np.allclose(uniform, 0.25)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 2.5}, "num_clients"),
        ({"b_min": 2e9}, "b_min <= b_max"),
        ({"b_min": 0.0}, "0 < b_min"),
        ({"b_max": float("inf")}, "finite"),
        ({"s": -1.0}, "s must be"),
    ],
)
def test_invalid_budget_arguments(kwargs: dict, message: str) -> None:
    arguments = {"num_clients": 10, "b_min": B_MIN, "b_max": B_MAX, "s": S, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        zipf_budgets(**arguments)


def test_allocation_shares() -> None:
    budgets = np.array([25e6, 100e6, 600e6, 1500e6])
    assert np.allclose(allocation_shares(budgets, 0.0, 600e6), 0.25)
    capped = np.array([25, 100, 600, 600]) / 1325
    assert np.allclose(allocation_shares(budgets, 1.0, 600e6), capped)
    squared = allocation_shares(budgets, 2.0, 600e6)
    assert np.allclose(squared, capped**2 / (capped**2).sum())
    # Large exponents on MAC-sized numbers must not overflow.
    steep = allocation_shares(budgets, 50.0, 600e6)
    assert np.isfinite(steep).all() and steep.sum() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("budgets", "gamma", "cap", "message"),
    [
        (np.array([1.0, 2.0]), -0.5, 1.0, "gamma"),
        (np.array([1.0, 2.0]), 1.0, 0.0, "cap"),
        (np.array([1.0, 0.0]), 1.0, 1.0, "> 0"),
        (np.array([]), 1.0, 1.0, "non-empty"),
    ],
)
def test_invalid_allocation_arguments(budgets, gamma, cap, message) -> None:
    with pytest.raises(ValueError, match=message):
        allocation_shares(budgets, gamma, cap)
