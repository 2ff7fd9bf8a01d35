"""Server-held splits: disjoint, exhaustive, requested sizes, seeded."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedapp.data.registry import load_dataset
from fedapp.partitions.splits import server_splits

SIZES = {"calibration": 100, "validation": 400, "public": 250, "test": 1000}


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return load_dataset("mnist-5k").train.labels


def test_disjoint_exhaustive_with_requested_sizes(labels) -> None:
    splits = server_splits(labels, **SIZES, seed=0)
    pieces = dataclasses.asdict(splits)
    for key, size in SIZES.items():
        assert pieces[key].size == size
    assert splits.clients.size == labels.size - sum(SIZES.values())
    everything = np.concatenate(list(pieces.values()))
    assert np.array_equal(np.sort(everything), np.arange(labels.size))
    assert all(np.all(np.diff(piece) > 0) for piece in pieces.values())


def test_empty_splits_allowed(labels) -> None:
    splits = server_splits(labels, calibration=50, validation=50, public=0, test=0, seed=1)
    assert splits.public.size == 0 and splits.test.size == 0
    assert splits.clients.size == labels.size - 100


def test_seeded(labels) -> None:
    first, again, other = (server_splits(labels, **SIZES, seed=s) for s in (2, 2, 3))
    assert np.array_equal(first.validation, again.validation)
    assert not np.array_equal(first.validation, other.validation)


def test_sizes_that_do_not_fit(labels) -> None:
    with pytest.raises(ValueError) as caught:
        server_splits(labels, calibration=500, validation=4500, public=0, test=0, seed=0)
    message = str(caught.value)
    assert "calibration=500" in message and "= 5000" in message and "has 5000" in message
    with pytest.raises(ValueError, match=">= 0"):
        server_splits(labels, calibration=-1, validation=0, public=0, test=0, seed=0)


def test_a_client_pool_is_a_seeded_draw_of_the_rest(labels) -> None:
    """client_pool > 0 keeps the server sets as they were and gives the clients that many of
    the remaining examples; the rest of the training set is held by no one."""
    whole = server_splits(labels, **SIZES, seed=4)
    pooled = server_splits(labels, **SIZES, seed=4, client_pool=1200)
    for name in SIZES:
        np.testing.assert_array_equal(getattr(whole, name), getattr(pooled, name))
    assert pooled.clients.size == 1200 and np.all(np.diff(pooled.clients) > 0)
    assert np.isin(pooled.clients, whole.clients).all()
    again = server_splits(labels, **SIZES, seed=4, client_pool=1200)
    np.testing.assert_array_equal(pooled.clients, again.clients)
    left = labels.size - sum(SIZES.values())
    with pytest.raises(ValueError, match=f"allowed is 0 \\(all of them\\) to {left}"):
        server_splits(labels, **SIZES, seed=4, client_pool=left + 1)
