"""A Flower strategy's server optimiser state as JSON for fedapp's checkpoint, bit-exact: each
array as base64 of its ``.npy`` bytes, in the dict or list that holds it (None stays None)."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray] | list[np.ndarray] | None


def _encode(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _decode(text: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)


def encode_arrays(values: dict[str, Arrays]) -> dict[str, Any]:
    """Each named value (a dict or list of arrays, or None) in JSON-safe form."""
    encoded: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            encoded[name] = None
        elif isinstance(value, dict):
            encoded[name] = {"dict": {k: _encode(v) for k, v in value.items()}}
        else:
            encoded[name] = {"list": [_encode(v) for v in value]}
    return encoded


def decode_arrays(encoded: dict[str, Any]) -> dict[str, Arrays]:
    """The values :func:`encode_arrays` wrote; ValueError on anything else."""
    if not isinstance(encoded, dict):
        raise ValueError(f"a server optimiser state is a JSON object, not {type(encoded).__name__}")
    values: dict[str, Arrays] = {}
    for name, value in encoded.items():
        if value is None:
            values[name] = None
        elif isinstance(value, dict) and isinstance(value.get("dict"), dict):
            values[name] = {k: _decode(v) for k, v in value["dict"].items()}
        elif isinstance(value, dict) and isinstance(value.get("list"), list):
            values[name] = [_decode(v) for v in value["list"]]
        else:
            raise ValueError(f"server optimiser entry {name!r} is not an encoded array set")
    return values
