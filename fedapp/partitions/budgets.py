"""Client compute budgets (Zipf ranks mapped onto a MAC range) and gamma-allocation data shares.

Follows FEAST §3: ranks r ∈ {1..N} are drawn i.i.d. with P(r) ∝ r^(-s), so rank 1 — the lowest
budget — is the most common and a few clients are powerful. Each rank is mapped linearly onto
[Bmin, Bmax] with uniform jitter of one step, clipped, and the vector is shuffled so budget is not
tied to client id. Data shares then grow with the (capped) budget to the power gamma.

The draw runs on the run's budget stream (``generator``) or, as the FEAST authors' code does,
on the legacy global-state generator of ``np.random.seed(seed)`` (``authors``): the same calls on
a ``RandomState(seed)`` give their population exactly.
"""

from __future__ import annotations

import math

import numpy as np

from fedapp.random_streams import Stream, stream_rng

#: Random generators a budget population (and a cohort draw) can use.
RNG_KINDS = ("generator", "authors")


def rank_probabilities(num_clients: int, s: float) -> np.ndarray:
    """P(r) ∝ r^(-s) for r = 1..num_clients (index 0 holds rank 1)."""
    weights = np.arange(1, num_clients + 1, dtype=np.float64) ** -s
    return weights / weights.sum()


def zipf_budgets(
    num_clients: int, b_min: float, b_max: float, s: float, seed: int, rng: str = "generator"
) -> np.ndarray:
    """Draw one compute budget per client (float64, in [b_min, b_max]), reproducible by seed.

    ``rng`` is one of :data:`RNG_KINDS`.

    With a single client there is no rank spread (Δ is undefined), so that client gets b_max:
    a lone client is treated as unconstrained rather than as the weakest device.
    """
    if not isinstance(num_clients, int | np.integer) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if not (math.isfinite(b_min) and math.isfinite(b_max) and 0 < b_min <= b_max):
        raise ValueError(f"budgets need 0 < b_min <= b_max (finite), got {b_min} and {b_max}")
    if not (math.isfinite(s) and s >= 0):
        raise ValueError(f"Zipf exponent s must be finite and >= 0, got {s}")
    if rng not in RNG_KINDS:
        raise ValueError(f"budget generator {rng!r} is not one of {', '.join(RNG_KINDS)}")
    if num_clients == 1:
        return np.array([float(b_max)])
    generator = (
        np.random.RandomState(seed) if rng == "authors" else stream_rng(seed, Stream.BUDGETS)
    )
    return _zipf_budgets_from(generator, num_clients, b_min, b_max, s)


def _zipf_budgets_from(
    rng: np.random.Generator | np.random.RandomState,
    num_clients: int,
    b_min: float,
    b_max: float,
    s: float,
) -> np.ndarray:
    """The draw itself, for any numpy RNG (the legacy one reproduces the reference code)."""
    ranks = rng.choice(
        np.arange(1, num_clients + 1), size=num_clients, p=rank_probabilities(num_clients, s)
    )
    step = (b_max - b_min) / (num_clients - 1)
    jitter = rng.uniform(-step / 2, step / 2, size=num_clients)
    budgets = np.clip(b_min + (ranks - 1) * step + jitter, b_min, b_max)
    rng.shuffle(budgets)
    return budgets


def allocation_shares(budgets: np.ndarray, gamma: float, cap: float) -> np.ndarray:
    """Data shares q_i = min(b_i, cap)^gamma / Σ_j min(b_j, cap)^gamma (gamma = 0: equal shares).

    The cap stops the strongest clients from swallowing the data set; budgets are divided by
    their maximum before the power so large MAC counts cannot overflow for big gamma.
    """
    budgets = np.asarray(budgets, dtype=np.float64)
    if budgets.ndim != 1 or budgets.size == 0:
        raise ValueError(f"budgets must be a non-empty 1-D array, got shape {budgets.shape}")
    if not (np.all(np.isfinite(budgets)) and np.all(budgets > 0)):
        raise ValueError("budgets must all be finite and > 0")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma must be finite and >= 0, got {gamma}")
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"cap must be finite and > 0, got {cap}")
    allocated = np.minimum(budgets, cap)
    weights = (allocated / allocated.max()) ** gamma
    return weights / weights.sum()
