"""Server-held splits carved from the training set before the clients get their shards.

FEAST keeps part of the training set on the server (BN calibration and validation for checkpoint
selection; CIFAR-100: 500 + 4,500 of 50,000). Distillation methods also need a public set, and
data sets without an official test split need one carved here. The rest is the client pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ServerSplits:
    """Disjoint, sorted index arrays into the train arrays; together they cover all of it."""

    calibration: np.ndarray
    validation: np.ndarray
    public: np.ndarray
    test: np.ndarray
    clients: np.ndarray


def server_splits(
    labels: np.ndarray, *, calibration: int, validation: int, public: int, test: int, seed: int
) -> ServerSplits:
    """Split ``range(len(labels))`` at random (seeded) into the server sets and the client pool.

    The split is uniform rather than stratified, like the reference's permutation split; the
    client pool keeps everything not requested and must not end up empty.
    """
    sizes = {"calibration": calibration, "validation": validation, "public": public, "test": test}
    negative = {key: size for key, size in sizes.items() if size < 0}
    if negative:
        raise ValueError(f"server split sizes must be >= 0, got {negative}")
    total = len(labels)
    requested = sum(sizes.values())
    if requested >= total:
        parts = " + ".join(f"{key}={size}" for key, size in sizes.items())
        raise ValueError(
            f"server splits need {parts} = {requested} examples, but the training set has "
            f"{total}; at least one example must remain for the clients"
        )
    order = np.random.default_rng(seed).permutation(total)
    bounds = np.cumsum(list(sizes.values()))
    pieces = [np.sort(piece) for piece in np.split(order, bounds)]
    return ServerSplits(*pieces)
