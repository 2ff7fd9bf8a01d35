"""Named arrays <-> Flower records, the one conversion both halves use for payloads, replies and
node state (names kept, so a reply's arrays match its payload by name)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord


def to_record(state: Mapping[str, np.ndarray | torch.Tensor]) -> ArrayRecord:
    """Named arrays (numpy or torch) as an ArrayRecord, names kept."""
    record = ArrayRecord()
    for name, value in state.items():
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        record[name] = Array(np.require(array, requirements="C"))  # keeps 0-d arrays 0-d
    return record


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as named numpy arrays."""
    return {name: array.numpy() for name, array in record.items()}


def load_state(model: torch.nn.Module, state: Mapping[str, np.ndarray]) -> None:
    """Load named numpy arrays into a torch model (strict: names and shapes must match)."""
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})


def load_into(model: torch.nn.Module, record: ArrayRecord) -> None:
    """Load a full state record into a torch model."""
    load_state(model, from_record(record))
