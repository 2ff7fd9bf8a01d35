"""The gamma-allocation budget-aware Dirichlet partitioner on real MNIST labels."""

from __future__ import annotations

import datasets
import numpy as np
import pytest

from fedapp.data.registry import load_dataset
from fedapp.partitions.budget_dirichlet import BudgetDirichletPartitioner, budget_dirichlet_indices
from fedapp.partitions.budgets import allocation_shares, zipf_budgets

CAP = 600e6
NUM_CLIENTS = 20


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return np.asarray(load_dataset("mnist-5k").train.labels)


@pytest.fixture(scope="module")
def budgets() -> np.ndarray:
    return zipf_budgets(NUM_CLIENTS, 25e6, 1.5e9, 1.2, seed=3)


def _partitioner(labels: np.ndarray, shares: np.ndarray, seed: int) -> BudgetDirichletPartitioner:
    partitioner = BudgetDirichletPartitioner(shares, alpha=0.1, seed=seed)
    partitioner.dataset = datasets.Dataset.from_dict({"label": labels})
    return partitioner


def _mean_shares(labels: np.ndarray, shares: np.ndarray, seeds: int = 30) -> np.ndarray:
    sizes = [
        [part.size for part in _partitioner(labels, shares, seed).partition_indices]
        for seed in range(seeds)
    ]
    return np.mean(sizes, axis=0) / labels.size


def test_partitioner_contract(labels, budgets) -> None:
    partitioner = _partitioner(labels, allocation_shares(budgets, 1.0, CAP), seed=0)
    assert partitioner.num_partitions == NUM_CLIENTS
    parts = partitioner.partition_indices
    everything = np.concatenate(parts)
    assert everything.size == labels.size and np.unique(everything).size == labels.size
    assert min(part.size for part in parts) >= 10
    assert all(np.all(np.diff(part) > 0) for part in parts)
    partition = partitioner.load_partition(4)
    assert np.array_equal(partition["label"], labels[parts[4]])
    with pytest.raises(ValueError, match="partition_id"):
        partitioner.load_partition(NUM_CLIENTS)


def test_deterministic_by_seed(labels, budgets) -> None:
    shares = allocation_shares(budgets, 1.0, CAP)
    first, again, other = (
        _partitioner(labels, shares, seed).partition_indices for seed in (5, 5, 6)
    )
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_gamma_zero_gives_equal_expected_shares(labels, budgets) -> None:
    """gamma = 0: mean share over 30 draws within 10 % (relative) of 1/N for every client."""
    shares = allocation_shares(budgets, 0.0, CAP)
    mean = _mean_shares(labels, shares)
    assert np.abs(mean * NUM_CLIENTS - 1.0).max() < 0.10


def test_gamma_one_gives_shares_proportional_to_capped_budget(labels, budgets) -> None:
    """gamma = 1: mean share over 30 draws tracks min(b, cap) / Σ min(b, cap).

    Tolerances: every client within 20 % (relative; the smallest shares are biased up by the
    redraw-until-10-examples rule), the average relative error below 5 %.
    """
    expected = np.minimum(budgets, CAP) / np.minimum(budgets, CAP).sum()
    assert expected.max() / expected.min() > 10  # the test needs a real spread of budgets
    mean = _mean_shares(labels, allocation_shares(budgets, 1.0, CAP))
    relative = np.abs(mean / expected - 1.0)
    assert relative.max() < 0.20 and relative.mean() < 0.05


def test_balancing_cap_masks_full_clients(labels, budgets) -> None:
    """A client stops receiving once it reaches q_i·N, so it overshoots by < one class."""
    shares = allocation_shares(budgets, 1.0, CAP)
    largest_class = np.bincount(labels).max()
    for seed in range(5):
        sizes = np.array([p.size for p in _partitioner(labels, shares, seed).partition_indices])
        assert np.all(sizes < shares * labels.size + largest_class)


def test_impossible_requests_explain_themselves(labels) -> None:
    with pytest.raises(ValueError, match="at least 10 examples"):
        budget_dirichlet_indices(
            labels, np.full(600, 1 / 600), alpha=0.1, min_partition_size=10, seed=0, max_redraws=5
        )
    skewed = np.array([1e-4] + [1.0] * 9)
    with pytest.raises(ValueError, match="failed 3 times") as caught:
        budget_dirichlet_indices(
            labels, skewed / skewed.sum(), alpha=0.1, min_partition_size=10, seed=0, max_redraws=3
        )
    assert "fewer clients" in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shares": [0.5, 0.0]}, "shares"),
        ({"shares": []}, "shares"),
        ({"alpha": 0.0}, "alpha"),
        ({"min_partition_size": -1}, "min_partition_size"),
        ({"max_redraws": 0}, "max_redraws"),
    ],
)
def test_invalid_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BudgetDirichletPartitioner(**({"shares": [0.5, 0.5]} | kwargs))
