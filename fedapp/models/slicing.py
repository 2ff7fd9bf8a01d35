"""Leading-slice algebra shared by every weight-sharing method.

A sub-model is described completely by the shape of each of its tensors: its weights are the
leading slices ``global[:s0, :s1, ...]`` of the global tensors. So one ``extract`` and one
sample-weighted accumulator serve FedAvg (every slice is the whole tensor), FEAST, the
SuperFedNAS/DeepFedNAS transfers, HeteroFL and ScaleFL alike. A contribution may also be restricted
to some rows (first axis) of its slice: HeteroFL's classifier takes only the rows of the labels a
client holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from types import EllipsisType

import numpy as np

#: Buffers that count steps rather than estimate a statistic: never averaged, the old value stays.
NON_AVERAGED_SUFFIXES: tuple[str, ...] = ("num_batches_tracked",)


def leading_slice(shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The index that selects a leading block of the given shape."""
    return tuple(slice(0, int(n)) for n in shape)


def fits(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether a leading slice of ``shape`` exists in a tensor of shape ``full``."""
    return len(shape) == len(full) and all(s <= g for s, g in zip(shape, full, strict=True))


@dataclass(frozen=True)
class Arrival:
    """One contribution to a tensor: its leading-slice shape, weight and, if restricted, the rows
    (indices along the first axis) it covers; ``rows=None`` covers the whole slice."""

    shape: tuple[int, ...]
    weight: float
    rows: frozenset[int] | None = None

    def covers(self, axis: int, hi: int) -> bool:
        """Whether this arrival covers the axis interval that ends at ``hi`` (exclusive)."""
        if axis == 0 and self.rows is not None:
            return hi - 1 in self.rows
        return self.shape[axis] >= hi


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
        if not fits(tuple(shape), tensor.shape):
            raise ValueError(f"slice {tuple(shape)} does not fit {name} of shape {tensor.shape}")
        out[name] = np.array(tensor[leading_slice(shape)], order="C")  # keeps 0-d tensors 0-d
    return out


class SliceAccumulator:
    """Sparse sample-weighted average of leading slices onto global tensors.

    ``add`` sums ``weight * slice`` into the leading block of each global tensor; ``result``
    divides every position by the total weight of the slices that covered it and keeps the old
    value where nothing arrived, so positions that nobody routed this round are untouched. BN
    running statistics are averaged like weights; step counters (``num_batches_tracked``) keep
    their old value.

    Cost: the running sums live in the leading block of the output tensors themselves (float32
    for a float32 model, as in a dense FedAvg), so no extra state-sized buffer and no per-element
    count array exist. Leading slices are nested boxes, so the covering weight is constant on the
    cells cut by the distinct slice sizes along each axis; ``result`` divides each covered cell
    in place and copies the old value into the others. ``result`` can therefore be taken once.
    """

    def __init__(self, global_state: Mapping[str, np.ndarray]) -> None:
        self._old = {name: np.asarray(t) for name, t in global_state.items()}
        self._out: dict[str, np.ndarray] = {}
        self._box: dict[str, tuple[int, ...]] = {}
        self._arrivals: dict[str, list[Arrival]] = {}
        self._taken = False
        self.total_weight = 0.0

    def add(
        self,
        sub_state: Mapping[str, np.ndarray],
        weight: float,
        rows: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Add one client's slices with its weight (all keys must be global names).

        ``rows[name]`` restricts that tensor's contribution to those first-axis indices of its
        slice: the other rows are neither summed nor counted. Every tensor is checked before
        anything is added, so a bad reply changes nothing.
        """
        self._check_open()
        if not (weight > 0 and np.isfinite(weight)):
            raise ValueError(f"aggregation weight must be positive and finite, got {weight}")
        arrays = {name: np.asarray(t) for name, t in sub_state.items()}
        for name, tensor in arrays.items():
            old = self._old.get(name)
            if old is None:
                raise KeyError(f"{name} is not a global tensor")
            if not fits(tensor.shape, old.shape):
                raise ValueError(f"slice {tensor.shape} does not fit {name} of shape {old.shape}")
        restricted = {name: _row_set(name, index, arrays) for name, index in (rows or {}).items()}
        for name, tensor in arrays.items():
            if is_averaged(name):
                kept = restricted.get(name)
                if kept is not None:  # rows outside the set add zero to the sum
                    keep = np.zeros(tensor.shape[0], dtype=tensor.dtype)
                    keep[sorted(kept)] = 1
                    tensor = tensor * keep.reshape(-1, *(1,) * (tensor.ndim - 1))
                self._add_one(name, tensor, weight)
                self._arrivals.setdefault(name, []).append(
                    Arrival(tensor.shape, float(weight), kept)
                )
        self.total_weight += weight

    def _add_one(self, name: str, tensor: np.ndarray, weight: float) -> None:
        old = self._old[name]
        out = self._out.get(name)
        part_index = (*leading_slice(tensor.shape), ...)  # a view, also for 0-d tensors
        if out is None:  # first arrival: the sum is this slice, scaled (one pass, no zeros)
            out = self._out[name] = np.empty(old.shape, np.promote_types(old.dtype, np.float32))
            np.multiply(tensor, weight, out=out[part_index], casting="same_kind")
            self._box[name] = tensor.shape
            return
        box = self._box[name]
        grown = tuple(max(a, b) for a, b in zip(box, tensor.shape, strict=True))
        if grown != box:  # zero the part of the grown box that holds no sum yet
            for k in range(len(box)):
                slab = (
                    *(slice(0, box[j]) for j in range(k)),
                    slice(box[k], grown[k]),
                    *(slice(0, grown[j]) for j in range(k + 1, len(box))),
                )
                out[slab] = 0
            self._box[name] = grown
        out[part_index] += tensor * weight

    def result(self) -> dict[str, np.ndarray]:
        """The averaged global state, in the dtypes of the old one (can be taken once)."""
        self._check_open()
        self._taken = True
        result: dict[str, np.ndarray] = {}
        for name, old in self._old.items():
            out = self._out.pop(name, None)
            if out is None:
                result[name] = old.copy()
                continue
            for cell, weight in tile_cells(self._arrivals[name], old.shape):
                if weight > 0:
                    out[cell] /= weight
                else:
                    out[cell] = old[cell]
            result[name] = out.astype(old.dtype, copy=False)
        return result

    def _check_open(self) -> None:
        if self._taken:
            raise RuntimeError("this accumulator's result was already taken; start a new one")


def _row_set(name: str, index: np.ndarray, arrays: Mapping[str, np.ndarray]) -> frozenset[int]:
    """Checked row restriction of one tensor of a reply."""
    if name not in arrays or arrays[name].ndim == 0:
        raise KeyError(f"row restriction for {name}, which the reply lacks or has no rows")
    rows = frozenset(int(i) for i in np.asarray(index).ravel())
    if any(not 0 <= i < arrays[name].shape[0] for i in rows):
        raise ValueError(f"rows {sorted(rows)} outside {name}'s {arrays[name].shape[0]} rows")
    return rows


def tile_cells(
    arrivals: list[Arrival], shape: tuple[int, ...]
) -> list[tuple[tuple[slice | EllipsisType, ...], float]]:
    """Tile a tensor of ``shape`` into cells of constant covering weight.

    ``arrivals`` are the leading slices that were added. Each axis is cut at the distinct slice
    sizes (the first axis at every row when some arrival covers only some rows); a cell is
    covered by every arrival that covers its far corner (a bit set per axis interval,
    intersected per cell), and cells no arrival reaches get weight 0.
    """
    axes = []
    for k, n in enumerate(shape):
        if k == 0 and any(a.rows is not None for a in arrivals):
            cuts = list(range(n + 1))
        else:
            cuts = sorted({0, n, *(a.shape[k] for a in arrivals)})
        axes.append(
            [
                (slice(lo, hi), sum(1 << i for i, a in enumerate(arrivals) if a.covers(k, hi)))
                for lo, hi in itertools.pairwise(cuts)
            ]
        )
    everyone = (1 << len(arrivals)) - 1
    weight_of: dict[int, float] = {}
    cells = []
    for cell in itertools.product(*axes):
        covering = everyone
        for _, bits in cell:
            covering &= bits
        if covering not in weight_of:
            weight_of[covering] = sum(a.weight for i, a in enumerate(arrivals) if covering >> i & 1)
        cells.append(((*(index for index, _ in cell), ...), weight_of[covering]))
    return cells
