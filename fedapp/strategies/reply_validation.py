"""Reply validation: a bad client reply is dropped and logged, never averaged in."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import WARNING

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from fedapp.messages import ARRAYS, METRICS, NUM_EXAMPLES
from fedapp.records import from_record


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype a reply array must have."""

    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class ValidReply:
    """A reply that passed every check."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float | int]

    @property
    def num_examples(self) -> int:
        return int(self.metrics[NUM_EXAMPLES])


class InvalidReply(ValueError):
    """Why a reply was refused (the message is logged)."""


def spec_of(state: Mapping[str, np.ndarray]) -> dict[str, ArraySpec]:
    """The specs that a reply echoing this state must meet."""
    return {name: ArraySpec(tuple(a.shape), str(a.dtype)) for name, a in state.items()}


def validate_reply(message: Message, expected: Mapping[str, ArraySpec]) -> ValidReply:
    """Check a training reply against what was sent; raise InvalidReply saying what is wrong."""
    node_id = message.metadata.src_node_id
    if message.has_error():
        raise InvalidReply(f"node failed: {message.error.reason}")
    content = message.content
    if ARRAYS not in content.array_records or METRICS not in content.metric_records:
        raise InvalidReply(f"reply lacks '{ARRAYS}' or '{METRICS}' records")
    arrays = from_record(content.array_records[ARRAYS])
    if set(arrays) != set(expected):
        missing, extra = sorted(set(expected) - set(arrays)), sorted(set(arrays) - set(expected))
        raise InvalidReply(f"wrong keys: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, array in arrays.items():
        spec = expected[name]
        if tuple(array.shape) != spec.shape or str(array.dtype) != spec.dtype:
            raise InvalidReply(
                f"{name}: got {array.dtype}{list(array.shape)}, "
                f"expected {spec.dtype}{list(spec.shape)}"
            )
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            raise InvalidReply(f"{name}: non-finite values")
    return ValidReply(node_id=node_id, arrays=arrays, metrics=validate_metrics(message))


def validate_metrics(message: Message) -> dict[str, float | int]:
    """The reply's metrics if they are finite and count a positive number of examples."""
    if message.has_error():
        raise InvalidReply(f"node failed: {message.error.reason}")
    if METRICS not in message.content.metric_records:
        raise InvalidReply(f"reply lacks the '{METRICS}' record")
    metrics = dict(message.content.metric_records[METRICS])
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(math.isfinite(v) for v in values):
            raise InvalidReply(f"metric {key} is not finite")
    examples = metrics.get(NUM_EXAMPLES)
    if not isinstance(examples, int) or examples <= 0:
        raise InvalidReply(f"metric {NUM_EXAMPLES} must be a positive integer, got {examples!r}")
    return metrics


@dataclass
class CheckedRound:
    """A training round's replies after the checks."""

    valid: list[ValidReply]  # in partition order: float sums must not depend on arrival order
    dropped: dict[int, str]  # node id -> why its reply was refused, or that none came


def check_round(
    server_round: int,
    replies: Iterable[Message],
    expected: Mapping[int, Mapping[str, ArraySpec]],
    partition_of: Callable[[int], int | None],
) -> CheckedRound:
    """Check every reply against what its node was sent; a refused one is logged with its
    reason, as is every sampled node that did not answer."""
    awaited = dict(expected)
    valid: list[ValidReply] = []
    dropped: dict[int, str] = {}
    for message in replies:
        node_id = message.metadata.src_node_id
        try:
            if node_id not in awaited:
                raise InvalidReply("node was not sampled this round")
            valid.append(validate_reply(message, awaited.pop(node_id)))
        except InvalidReply as err:
            dropped[node_id] = str(err)
            partition = partition_of(node_id)
            log(
                WARNING,
                "round %d: dropped reply of node %s (partition %s): %s",
                server_round,
                node_id,
                "?" if partition is None else partition,
                err,
            )
    for node_id in awaited:
        dropped[node_id] = "no reply (round timeout, or the node left)"
    valid.sort(key=lambda r: partition_of(r.node_id) or 0)
    return CheckedRound(valid, dropped)
