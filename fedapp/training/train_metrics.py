"""The metrics every client trainer's reply carries about its local work, which the server's
accounting reads (training loss, steps and time; the compute proxy, ``COMPUTE_METRIC``)."""

from __future__ import annotations

from fedapp.training.loops import TrainStats
from fedapp.wire.messages import (
    COMPUTE_METRIC,
    NUM_EXAMPLES,
    TRAIN_LOSS,
    TRAIN_SECONDS,
    TRAIN_STEPS,
)

#: Forward + backward convolution arithmetic as a multiple of the forward pass (paper: 3).
FORWARD_BACKWARD_FACTOR = 3


def train_metrics(
    num_examples: int, stats: TrainStats, seconds: float, forward_macs: float
) -> dict[str, float | int]:
    """Examples held, mean training loss, optimizer steps, wall time, and the compute proxy:
    ``FORWARD_BACKWARD_FACTOR`` x ``forward_macs`` (forward MACs summed over the examples)."""
    return {
        NUM_EXAMPLES: num_examples,
        TRAIN_LOSS: stats.loss,
        TRAIN_STEPS: stats.steps,
        TRAIN_SECONDS: seconds,
        COMPUTE_METRIC: float(FORWARD_BACKWARD_FACTOR * forward_macs),
    }
