"""Every partitioner through the factory, on the real MNIST client pool."""

from __future__ import annotations

import numpy as np
import pytest

from fedapp.data.registry import load_dataset
from fedapp.partitions.budgets import allocation_shares, zipf_budgets
from fedapp.partitions.factory import PARTITIONER_NAMES, client_partitions
from fedapp.partitions.splits import server_splits

NUM_CLIENTS = 20


@pytest.fixture(scope="module")
def pool() -> np.ndarray:
    """Labels of the client pool left after server splits (4,250 examples, not a round number)."""
    labels = load_dataset("mnist-5k").train.labels
    splits = server_splits(labels, calibration=100, validation=400, public=250, test=0, seed=0)
    return labels[splits.clients]


def _partitions(name: str, labels: np.ndarray, seed: int, **overrides) -> list[np.ndarray]:
    shares = allocation_shares(zipf_budgets(NUM_CLIENTS, 25e6, 1.5e9, 1.2, seed=1), 1.0, 600e6)
    arguments = {"seed": seed, "alpha": 0.3, "shards_per_client": 3, "shares": shares} | overrides
    return client_partitions(name, labels, NUM_CLIENTS, **arguments)


@pytest.mark.parametrize("name", PARTITIONER_NAMES)
def test_disjoint_exhaustive_sorted_and_large_enough(pool, name: str) -> None:
    parts = _partitions(name, pool, seed=0)
    assert len(parts) == NUM_CLIENTS
    everything = np.concatenate(parts)
    assert np.array_equal(np.sort(everything), np.arange(pool.size))
    assert all(np.all(np.diff(part) > 0) for part in parts)
    assert min(part.size for part in parts) >= 10


@pytest.mark.parametrize("name", PARTITIONER_NAMES)
def test_deterministic_by_seed(pool, name: str) -> None:
    first, again, other = (_partitions(name, pool, seed) for seed in (7, 7, 8))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_label_skew_by_scheme(pool) -> None:
    """IID clients see every class; 3 shards (+ a leftover block) give at most a few."""
    classes = {
        name: [np.unique(pool[part]).size for part in _partitions(name, pool, seed=0)]
        for name in ("iid", "shards")
    }
    assert min(classes["iid"]) == 10
    assert np.median(classes["shards"]) <= 4


def test_bad_requests(pool) -> None:
    with pytest.raises(ValueError, match="unknown partitioner") as caught:
        client_partitions(
            "pathological", pool, 4, seed=0, alpha=1, shards_per_client=2, shares=None
        )
    assert all(name in str(caught.value) for name in PARTITIONER_NAMES)
    with pytest.raises(ValueError, match="one share per client"):
        _partitions("budget-dirichlet", pool, seed=0, shares=None)
    with pytest.raises(ValueError, match="at most 425 clients"):
        client_partitions("iid", pool, 500, seed=0, alpha=1, shards_per_client=2, shares=None)
    with pytest.raises(ValueError, match="shards_per_client=300 needs 20 x 300"):
        _partitions("shards", pool, seed=0, shards_per_client=300)
    with pytest.raises(ValueError, match="integer"):
        client_partitions(
            "iid", pool.astype(float), 4, seed=0, alpha=1, shards_per_client=2, shares=None
        )
