"""Server-side fusion of client logits on the public set (FedKD-NAS, after the clients answer).

P_agg combines the clients' (M, C) logit matrices; the plain and sample-weighted means are the
paper's, the coordinate-wise trimmed mean and median are ours, against clients that upload
malicious logits. The fused target mixes in the teacher and is smoothed over rounds by an EMA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

LOGIT_AGGREGATIONS = ("mean", "weighted", "trimmed-mean", "median")


def aggregate_logits(
    logits: Sequence[np.ndarray],
    weights: Sequence[float],
    method: str,
    trim_fraction: float = 0.0,
) -> np.ndarray:
    """P_agg of the clients' logits: 'weighted' by ``weights`` (sample counts), 'mean',
    'trimmed-mean' (per coordinate, drop the ``trim_fraction`` lowest and highest values, at
    least one each side when a fraction is set and enough clients remain) or 'median'."""
    stack = np.stack([np.asarray(x, dtype=np.float64) for x in logits])
    if method == "weighted":
        w = np.asarray(weights, dtype=np.float64)
        return (np.tensordot(w / w.sum(), stack, axes=1)).astype(np.float32)
    if method == "mean":
        return stack.mean(axis=0).astype(np.float32)
    if method == "median":
        return np.median(stack, axis=0).astype(np.float32)
    if method == "trimmed-mean":
        k = len(stack)
        cut = math.ceil(trim_fraction * k) if trim_fraction > 0 else 0
        cut = min(cut, (k - 1) // 2)
        ordered = np.sort(stack, axis=0)
        return ordered[cut : k - cut].mean(axis=0).astype(np.float32)
    raise ValueError(f"unknown logit aggregation {method!r}; known: {LOGIT_AGGREGATIONS}")


def fuse_with_teacher(
    aggregated: np.ndarray, teacher: np.ndarray | None, beta: float
) -> np.ndarray:
    """Z = beta * P_T + (1 - beta) * P_agg (just P_agg without a teacher)."""
    if teacher is None:
        return aggregated
    return (beta * teacher + (1.0 - beta) * aggregated).astype(np.float32)


def smooth(previous: np.ndarray | None, fused: np.ndarray, gamma: float) -> np.ndarray:
    """Z~(r) = gamma * Z~(r-1) + (1 - gamma) * Z; the first target is Z itself."""
    if previous is None:
        return fused
    return (gamma * previous + (1.0 - gamma) * fused).astype(np.float32)
