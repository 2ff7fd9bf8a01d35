"""Leading-slice algebra shared by every weight-sharing method.

A sub-model is described completely by the shape of each of its tensors: its weights are the
leading slices ``global[:s0, :s1, ...]`` of the global tensors. So one ``extract`` and one
sample-weighted accumulator serve FedAvg (every slice is the whole tensor), FEAST, the
SuperFedNAS/DeepFedNAS transfers, HeteroFL and ScaleFL alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

#: Buffers that count steps rather than estimate a statistic: never averaged, the old value stays.
NON_AVERAGED_SUFFIXES: tuple[str, ...] = ("num_batches_tracked",)


def leading_slice(shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The index that selects a leading block of the given shape."""
    return tuple(slice(0, int(n)) for n in shape)


def is_averaged(name: str) -> bool:
    """Whether a tensor takes part in averaging (step counters do not)."""
    return not name.endswith(NON_AVERAGED_SUFFIXES)


def extract(
    global_state: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """Copy the leading slice of each named global tensor with the requested shape."""
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        tensor = global_state[name]
        if len(shape) != tensor.ndim or any(
            s > g for s, g in zip(shape, tensor.shape, strict=True)
        ):
            raise ValueError(f"slice {tuple(shape)} does not fit {name} of shape {tensor.shape}")
        out[name] = np.ascontiguousarray(tensor[leading_slice(shape)])
    return out


class SliceAccumulator:
    """Sparse sample-weighted average of leading slices onto global tensors.

    ``add`` sums ``weight * slice`` into the leading block of each global tensor; ``result``
    divides every position by the total weight of the slices that covered it and keeps the old
    value where nothing arrived, so positions that nobody routed this round are untouched. BN
    running statistics are averaged like weights; step counters (``num_batches_tracked``) keep
    their old value.

    Cost: sums live only over the bounding box of what arrived, and no per-element count array is
    kept. Leading slices cover nested boxes, so the covering weight is constant on the cells cut
    by the distinct slice sizes along each axis; ``result`` divides cell by cell. Sums use the
    global tensor's float type (float32 for a float32 model), like a dense FedAvg would.
    """

    def __init__(self, global_state: Mapping[str, np.ndarray]) -> None:
        self._old = {name: np.asarray(t) for name, t in global_state.items()}
        self._sum: dict[str, np.ndarray] = {}
        self._arrivals: dict[str, list[tuple[tuple[int, ...], float]]] = {}
        self.total_weight = 0.0

    def add(self, sub_state: Mapping[str, np.ndarray], weight: float) -> None:
        """Add one client's slices with its sample weight (all keys must be global names).

        Every tensor is checked before anything is added, so a bad reply changes nothing.
        """
        if not (weight > 0 and np.isfinite(weight)):
            raise ValueError(f"aggregation weight must be positive and finite, got {weight}")
        arrays = {name: np.asarray(t) for name, t in sub_state.items()}
        for name, tensor in arrays.items():
            old = self._old.get(name)
            if old is None:
                raise KeyError(f"{name} is not a global tensor")
            if tensor.ndim != old.ndim or any(
                s > g for s, g in zip(tensor.shape, old.shape, strict=True)
            ):
                raise ValueError(f"slice {tensor.shape} does not fit {name} of shape {old.shape}")
        for name, tensor in arrays.items():
            if not is_averaged(name):
                continue
            total = self._grow(name, tensor.shape)
            part = total[leading_slice(tensor.shape)]
            part += tensor * weight if weight != 1 else tensor
            self._arrivals.setdefault(name, []).append((tensor.shape, float(weight)))
        self.total_weight += weight

    def _grow(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The sum array of ``name``, enlarged (rarely) to cover ``shape``."""
        total = self._sum.get(name)
        if total is None or any(s > t for s, t in zip(shape, total.shape, strict=True)):
            box = shape if total is None else tuple(np.maximum(shape, total.shape))
            dtype = np.promote_types(self._old[name].dtype, np.float32)
            grown = np.zeros(box, dtype=dtype)
            if total is not None:
                grown[leading_slice(total.shape)] = total
            self._sum[name] = total = grown
        return total

    def result(self) -> dict[str, np.ndarray]:
        """The averaged global state, in the dtypes of the old one."""
        out: dict[str, np.ndarray] = {}
        for name, old in self._old.items():
            new = old.copy()
            total = self._sum.get(name)
            if total is not None:
                for cell, weight in covered_cells(self._arrivals[name]):
                    np.divide(total[cell], weight, out=new[cell], casting="same_kind")
            out[name] = new
        return out


def covered_cells(
    arrivals: list[tuple[tuple[int, ...], float]],
) -> list[tuple[tuple[slice, ...], float]]:
    """Cells of constant covering weight for leading slices ``(shape, weight)`` of one tensor.

    Each axis is cut at the distinct slice sizes; a cell is covered by every slice that reaches
    its far corner. Returns the cells with positive weight.
    """
    ndim = len(arrivals[0][0])
    cuts = [sorted({0, *(shape[k] for shape, _ in arrivals)}) for k in range(ndim)]
    cells = []
    for corner in itertools.product(*(range(1, len(c)) for c in cuts)):
        hi = [cuts[k][j] for k, j in enumerate(corner)]
        weight = sum(
            w for shape, w in arrivals if all(s >= h for s, h in zip(shape, hi, strict=True))
        )
        if weight > 0:
            index = tuple(slice(cuts[k][j - 1], cuts[k][j]) for k, j in enumerate(corner))
            cells.append((index, weight))
    return cells
