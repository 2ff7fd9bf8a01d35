"""Which clients train in a round: a seeded draw without replacement from the candidates.

``generator`` draws from the run's cohort stream of that round; ``authors`` reproduces the
FEAST authors' schedule, ``np.random.seed(round_idx)`` then
``np.random.choice(N, m, replace=False)`` with 0-based rounds (their cohorts do not depend on
the run's seed), so with all N clients as candidates, ordered by partition id, the cohorts are
theirs.
"""

from __future__ import annotations

import numpy as np

from fedapp.partitions.budgets import RNG_KINDS
from fedapp.random_streams import Stream, stream_rng


def cohort_indices(
    rng: str, seed: int, server_round: int, candidates: int, size: int
) -> np.ndarray:
    """Sorted positions (into the candidates) of round ``server_round``'s cohort (rounds from 1)."""
    if rng not in RNG_KINDS:
        raise ValueError(f"cohort generator {rng!r} is not one of {', '.join(RNG_KINDS)}")
    if rng == "authors":
        chosen = np.random.RandomState(server_round - 1).choice(candidates, size, replace=False)
    else:
        chosen = stream_rng(seed, Stream.COHORT, server_round).choice(
            candidates, size=size, replace=False
        )
    return np.sort(chosen)
