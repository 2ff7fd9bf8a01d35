"""FedKD-NAS's composite efficiency scores across the methods of one comparison (paper Table II).

The paper gives the scores' names and values but not their formulas (its equations are missing
from every copy); these are reconstructed and reproduce its numbers (PQS 0.6940, CES 44.49,
RES 0.7625 give UES 40.49). All are relative to the other methods of the same comparison, so they
are only meaningful within one table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ACCURACY_WEIGHT = 0.7
LOSS_WEIGHT = 0.3


@dataclass(frozen=True)
class MethodCosts:
    """What one method measured: test accuracy and loss, traffic and client resources."""

    accuracy: float
    loss: float
    comm_mb: float
    cpu_percent: float | None = None
    memory_mb: float | None = None


def _spread(value: float, low: float, high: float) -> float:
    """Position of ``value`` in [low, high]; 1 when every method measured the same."""
    return 1.0 if high == low else (value - low) / (high - low)


def pqs(
    accuracy: float, loss: float, accuracies: Sequence[float], losses: Sequence[float]
) -> float:
    """Performance quality: 0.7 x min-max-scaled accuracy + 0.3 x (1 - min-max-scaled loss)."""
    return ACCURACY_WEIGHT * _spread(accuracy, min(accuracies), max(accuracies)) + LOSS_WEIGHT * (
        1.0 - _spread(loss, min(losses), max(losses))
    )


def ces(comm_mb: float, comms: Sequence[float]) -> float:
    """Communication efficiency: the most communicating method's traffic over this one's."""
    return max(comms) / comm_mb


def res(cpu: float, memory: float, cpus: Sequence[float], memories: Sequence[float]) -> float:
    """Resource use (lower is better): mean of CPU and memory, each relative to the maximum."""
    return 0.5 * cpu / max(cpus) + 0.5 * memory / max(memories)


def ues(pqs_value: float, ces_value: float, res_value: float | None) -> float:
    """Unified efficiency: PQS x CES / RES, or UES* = PQS x CES without a resource trace."""
    return pqs_value * ces_value if res_value is None else pqs_value * ces_value / res_value


def efficiency_scores(methods: Mapping[str, MethodCosts]) -> dict[str, dict[str, float | None]]:
    """PQS, CES, RES, UES and UES* of every method, relative to the others in ``methods``."""
    accuracies = [m.accuracy for m in methods.values()]
    losses = [m.loss for m in methods.values()]
    comms = [m.comm_mb for m in methods.values()]
    traced = all(
        m.cpu_percent is not None and m.memory_mb is not None and math.isfinite(m.cpu_percent)
        for m in methods.values()
    )
    cpus = [m.cpu_percent for m in methods.values()] if traced else []
    memories = [m.memory_mb for m in methods.values()] if traced else []
    scores = {}
    for name, m in methods.items():
        p = pqs(m.accuracy, m.loss, accuracies, losses)
        c = ces(m.comm_mb, comms)
        r = res(m.cpu_percent, m.memory_mb, cpus, memories) if traced else None
        scores[name] = {
            "PQS": p,
            "CES": c,
            "RES": r,
            "UES": ues(p, c, r) if r is not None else None,
            "UES*": ues(p, c, None),
        }
    return scores
