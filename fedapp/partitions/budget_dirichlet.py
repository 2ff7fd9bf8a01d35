"""FEAST's budget-aware Dirichlet partition (gamma-allocation) as a flwr-datasets ``Partitioner``.

Per class k (indices shuffled), client proportions are drawn from Dir(alpha·N_k·q), so client i
receives in expectation the fraction q_i of every class; label skew still grows as alpha shrinks.
A client whose running count has reached its cap q_i·N is masked out for later classes, which
keeps realised sizes close to the shares. The whole draw is repeated until every client has at
least ``min_partition_size`` examples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedapp.data.extras import DATA, needs_extra

with needs_extra(DATA, "the partitioner 'budget-dirichlet'"):
    import datasets
    from flwr_datasets.partitioner import Partitioner

_MIN_CONCENTRATION = 1e-6  # Dir() needs positive concentrations; tiny shares of rare classes


class BudgetDirichletPartitioner(Partitioner):
    """Partition by ``partition_by`` so that partition i holds about ``shares[i]`` of the data.

    ``shares`` are normalised to sum to 1; ``len(shares)`` is the number of partitions. Indices
    within a partition are sorted. Deterministic for a given seed and data set.
    """

    def __init__(
        self,
        shares: Sequence[float],
        partition_by: str = "label",
        alpha: float = 0.1,
        min_partition_size: int = 10,
        seed: int = 42,
        max_redraws: int = 1000,
    ) -> None:
        super().__init__()
        q = np.asarray(shares, dtype=np.float64)
        if q.ndim != 1 or q.size == 0 or not np.all(np.isfinite(q)) or not np.all(q > 0):
            raise ValueError("shares must be a non-empty 1-D sequence of finite values > 0")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if min_partition_size < 0:
            raise ValueError(f"min_partition_size must be >= 0, got {min_partition_size}")
        if max_redraws < 1:
            raise ValueError(f"max_redraws must be >= 1, got {max_redraws}")
        self._shares = q / q.sum()
        self._partition_by = partition_by
        self._alpha = alpha
        self._min_partition_size = min_partition_size
        self._seed = seed
        self._max_redraws = max_redraws
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        """Total number of partitions (one per share)."""
        return int(self._shares.size)

    @property
    def partition_indices(self) -> list[np.ndarray]:
        """Row indices into the assigned data set for every partition (computed once)."""
        if self._indices is None:
            column = self.dataset.select_columns([self._partition_by]).with_format("numpy")
            labels = np.asarray(column[:][self._partition_by])
            self._indices = budget_dirichlet_indices(
                labels,
                self._shares,
                alpha=self._alpha,
                min_partition_size=self._min_partition_size,
                seed=self._seed,
                max_redraws=self._max_redraws,
            )
        return self._indices

    def load_partition(self, partition_id: int) -> datasets.Dataset:
        """Rows of partition ``partition_id`` (0-based) as a ``datasets.Dataset``."""
        if not 0 <= partition_id < self.num_partitions:
            raise ValueError(
                f"partition_id must be in [0, {self.num_partitions - 1}], got {partition_id}"
            )
        return self.dataset.select(self.partition_indices[partition_id])


def budget_dirichlet_indices(
    labels: np.ndarray,
    shares: np.ndarray,
    *,
    alpha: float,
    min_partition_size: int,
    seed: int,
    max_redraws: int,
) -> list[np.ndarray]:
    """Draw the partition; returns sorted index arrays, one per share (shares sum to 1)."""
    num_partitions, total = shares.size, labels.size
    if num_partitions * min_partition_size > total:
        raise ValueError(
            f"cannot give {num_partitions} partitions at least {min_partition_size} examples "
            f"each from only {total} examples; use fewer clients or a smaller minimum"
        )
    rng = np.random.default_rng(seed)
    caps = shares * total
    class_members = [np.flatnonzero(labels == k) for k in np.unique(labels)]
    smallest = 0
    for _ in range(max_redraws):
        parts = _draw_once(class_members, shares, caps, alpha, rng)
        smallest = min(part.size for part in parts)
        if smallest >= min_partition_size:
            return parts
    raise ValueError(
        f"budget-aware Dirichlet partition failed {max_redraws} times to give all "
        f"{num_partitions} partitions >= {min_partition_size} examples (smallest in the last "
        f"draw: {smallest}; {total} examples, smallest share {shares.min():.4g} -> expected "
        f"{shares.min() * total:.1f} examples). Use fewer clients, a larger alpha, a smaller "
        "gamma or a narrower budget range."
    )


def _draw_once(
    class_members: list[np.ndarray],
    shares: np.ndarray,
    caps: np.ndarray,
    alpha: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    counts = np.zeros(shares.size, dtype=np.int64)
    assigned: list[list[np.ndarray]] = [[] for _ in range(shares.size)]
    for members in class_members:
        members = rng.permutation(members)
        proportions = rng.dirichlet(np.maximum(alpha * members.size * shares, _MIN_CONCENTRATION))
        open_clients = counts < caps
        proportions = np.where(open_clients, proportions, 0.0)
        if proportions.sum() == 0.0:
            # The draw put all mass on full clients (tiny concentrations can underflow the
            # rest to exactly 0): split this class among the open clients by their shares.
            proportions = np.where(open_clients, shares, 0.0)
        proportions /= proportions.sum()
        cuts = (np.cumsum(proportions) * members.size).astype(np.int64)[:-1]
        for client, chunk in enumerate(np.split(members, cuts)):
            assigned[client].append(chunk)
            counts[client] += chunk.size
    return [np.sort(np.concatenate(chunks)) for chunks in assigned]
