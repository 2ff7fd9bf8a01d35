"""What a client keeps between its rounds (personal models, NAS history), in Flower's node state.

Flower hands every message of a node the same ``Context.state`` (in simulation and on a
SuperNode), so methods with client-side state store it there under their own keys instead of in
process memory, which a Ray actor or a fresh device process does not keep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict

from fedapp.wire.records import from_record, to_record


def save_arrays(
    state: RecordDict, key: str, arrays: Mapping[str, np.ndarray | torch.Tensor]
) -> None:
    """Keep named arrays (e.g. a model's state dict) under ``key``, replacing what was there."""
    state[key] = to_record(arrays)


def load_arrays(state: RecordDict, key: str) -> dict[str, np.ndarray] | None:
    """The arrays kept under ``key``, or None if this node has kept none yet."""
    if key not in state.array_records:
        return None
    return {name: array.copy() for name, array in from_record(state.array_records[key]).items()}


def forget(state: RecordDict, key: str) -> None:
    """Drop what is kept under ``key`` (bounded memory for methods that keep several models)."""
    if key in state:
        del state[key]


def save_values(state: RecordDict, key: str, values: Mapping[str, Any]) -> None:
    """Keep scalars and lists of scalars (ints, floats, strings, bools) under ``key``."""
    state[key] = ConfigRecord(dict(values))


def load_values(state: RecordDict, key: str) -> dict[str, Any] | None:
    """The values kept under ``key``, or None if this node has kept none yet."""
    if key not in state.config_records:
        return None
    return dict(state.config_records[key])
