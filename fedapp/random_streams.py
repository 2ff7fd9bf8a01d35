"""Every random purpose of a run, each with a stream of its own.

A run has one seed. Each purpose draws from the stream keyed ``(seed, purpose, len(parts),
*parts)``: the purpose's number tells purposes apart, and the parts (round, partition id, fold,
...) tell the draws of one purpose apart. numpy's ``SeedSequence`` pads a key of fewer than four
words with zeros, so without the count of parts ``(seed, p)`` and ``(seed, p, 0)`` would be one
stream; with it, two different keys never meet. Torch and libraries that take a plain integer
get one derived from the key by ``SeedSequence`` too.

The FEAST authors' schedules (``budget-rng`` / ``cohort-rng = "authors"``) are the one exception:
they reproduce the authors' legacy ``np.random.seed`` calls exactly, collisions included.
"""

from __future__ import annotations

from enum import IntEnum, unique

import numpy as np


@unique
class Stream(IntEnum):
    """The random purposes of a run; a number is never reused for another purpose."""

    SERVER_SPLITS = 1  # calibration, validation, public and test sets carved from train
    PARTITION = 2  # the partitioner's draw of client shards
    PARTITION_LEFTOVERS = 3  # shards: where the examples the partitioner dropped go
    BUDGETS = 4  # the Zipf budget population
    COHORT = 5  # parts (round,): who trains in a round
    INITIAL_WEIGHTS = 6  # the server's round-0 model
    BN_RECALIBRATION = 7  # augmentation draws while recalibrating an operating point's BN
    LOCAL_TRAINING = 8  # parts (round, partition): data order, augmentation, mixing, variants
    DITTO_PERSONAL = 9  # parts (round, partition): Ditto's personal model's local work
    NAS_WARMUP = 10  # parts (round, partition): a challenger's warm-up batches
    NAS_PRIVATE_HOLDOUT = 11  # parts (partition,): a client's hold-out of its shard
    NAS_PUBLIC_HOLDOUT = 12  # the public images scored, never distilled
    TEACHER_FOLDS = 13  # FedKD-NAS: which public images each teacher trains on
    TEACHER_TRAINING = 14  # parts (fold,): a teacher's initial weights and data order
    FEDMD_ALIGNMENT = 15  # parts (round,): FedMD's alignment subset of the public set
    FEDDF_DISTILLATION = 16  # parts (round, prototype): FedDF's server distillation
    HETEROFL_WIDTHS = 17  # parts (round,): HeteroFL's dynamic width per client
    MAXNET_SUBNETS = 18  # parts (round, partition): SuperFedNAS/DeepFedNAS subnet draws
    AVAILABILITY = 19  # parts (round, partition): whether a fleet's device is reachable


def stream_key(seed: int, stream: Stream, *parts: int) -> list[int]:
    """The entropy of one stream: distinct for any two (purpose, parts), even after padding."""
    words = [seed, int(stream), len(parts), *parts]
    if any(int(w) < 0 for w in words):
        raise ValueError(f"seeds and stream parts must be >= 0, got {words}")
    return [int(w) for w in words]


def stream_rng(seed: int, stream: Stream, *parts: int) -> np.random.Generator:
    """A numpy generator on the stream's own key."""
    return np.random.default_rng(stream_key(seed, stream, *parts))


def stream_seed(seed: int, stream: Stream, *parts: int) -> int:
    """A 63-bit integer from the stream's key, for torch and APIs that take one integer."""
    low, high = np.random.SeedSequence(stream_key(seed, stream, *parts)).generate_state(2)
    return ((int(high) << 32) | int(low)) & (2**63 - 1)


def stream_seed32(seed: int, stream: Stream, *parts: int) -> int:
    """A 32-bit integer from the stream's key, for APIs limited to ``[0, 2**32)``."""
    return int(np.random.SeedSequence(stream_key(seed, stream, *parts)).generate_state(1)[0])
