"""Server-held splits carved from the training set before the clients get their shards.

FEAST keeps part of the training set on the server (BN calibration and validation for checkpoint
selection; CIFAR-100: 500 + 4,500 of 50,000). Distillation methods also need a public set, and
data sets without an official test split need one carved here. The rest is the client pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.random_streams import Stream, stream_rng


@dataclass(frozen=True)
class ServerSplits:
    """Disjoint, sorted index arrays into the train arrays; together they cover all of it unless
    the client pool was drawn smaller."""

    calibration: np.ndarray
    validation: np.ndarray
    public: np.ndarray
    test: np.ndarray
    clients: np.ndarray


def server_splits(
    labels: np.ndarray,
    *,
    calibration: int,
    validation: int,
    public: int,
    test: int,
    seed: int,
    client_pool: int = 0,
) -> ServerSplits:
    """Split ``range(len(labels))`` at random (seeded) into the server sets and the client pool.

    The split is uniform rather than stratified, like the reference's permutation split; the
    client pool keeps everything not requested (or, with ``client_pool`` > 0, that many of the
    rest, so that a large set can be trained on in less time) and must not end up empty.
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
    order = stream_rng(seed, Stream.SERVER_SPLITS).permutation(total)
    if client_pool < 0 or client_pool > total - requested:
        raise ValueError(
            f"a client pool of {client_pool} examples does not fit: the server splits leave "
            f"{total - requested} of {total}; allowed is 0 (all of them) to {total - requested}"
        )
    bounds = np.cumsum(list(sizes.values()))
    pieces = [np.sort(piece) for piece in np.split(order, bounds)]
    if client_pool:
        pieces[-1] = np.sort(order[bounds[-1] : bounds[-1] + client_pool])
    return ServerSplits(*pieces)
