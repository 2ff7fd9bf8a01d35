"""The weighted mean of the replies' leading slices: FedAvg's rule on whole models, FEAST's and
the SuperFedNAS/DeepFedNAS transfers' on routed slices, ScaleFL's on depth-width levels."""

from __future__ import annotations

from collections.abc import Sequence

from fedapp.methods.common.reply_validation import ValidReply
from fedapp.methods.common.strategy import State
from fedapp.models.slicing import SliceAccumulator


def slice_mean(
    global_state: State, replies: Sequence[ValidReply], weights: Sequence[float] | None = None
) -> State:
    """Each tensor's mean over the replies that hold a slice of it, by ``weights`` (each reply's
    example weight by default); what no reply covers keeps its value, BN step counters too."""
    accumulator = SliceAccumulator(global_state)
    chosen = [reply.weight for reply in replies] if weights is None else weights
    for reply, weight in zip(replies, chosen, strict=True):
        accumulator.add(reply.arrays, weight=weight)
    return accumulator.result()
