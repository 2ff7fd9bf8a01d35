"""Reply validation: a bad client reply is dropped and logged, never averaged in.

Every reply is the node's own word, so it is read against what the server knows: the arrays it
was sent (names, shapes and dtypes, checked from each array's header before its bytes are
decoded; names it was not sent are refused undecoded), the metrics the method reads (scalars,
finite; times, CPU and memory figures not negative) and how many examples the node can have
used (its profile's training examples, or the size of the split it evaluated) and the least
work those examples take (a compute proxy below the method's floor would shorten the reply's
time on the fleet's clock; a reply that claims it is dropped). Any failure
while reading a reply, also inside a method's own reading of it (``ReplySchema.read``), drops
that reply alone with its reason: no reply can stop a round.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, Message
from flwr.common.constant import SType
from flwr.common.logger import log

from fedapp.wire.messages import (
    ARRAYS,
    COMPUTE_METRIC,
    CPU_PERCENT,
    METRICS,
    NUM_EXAMPLES,
    PEAK_RSS_MB,
    TORCH_THREADS,
    TRAIN_LOSS,
    TRAIN_SECONDS,
    TRAIN_STEPS,
    WALL_SECONDS,
)

#: Metrics the server reads as one number wherever a reply carries them (the round's timing,
#: the accounts and summary.json), and those of them that cannot be negative.
SCALAR_METRICS = frozenset(
    {NUM_EXAMPLES, TRAIN_LOSS, TRAIN_STEPS, TRAIN_SECONDS, COMPUTE_METRIC, CPU_PERCENT,
     PEAK_RSS_MB, WALL_SECONDS, TORCH_THREADS}
)  # fmt: skip
NON_NEGATIVE_METRICS = frozenset(
    {TRAIN_STEPS, TRAIN_SECONDS, COMPUTE_METRIC, CPU_PERCENT, PEAK_RSS_MB, WALL_SECONDS,
     TORCH_THREADS}
)  # fmt: skip
#: Bytes a numpy-serialised array may hold beyond its values (np.save's header: 128 bytes for
#: the shapes fedapp sends, a multiple of 64 in general).
NPY_HEADER_ALLOWANCE = 4096


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype a reply array must have."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class ValidReply:
    """A reply that passed every check."""

    node_id: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, float | int]
    #: Its aggregation weight where ``max-weight-share`` capped it (None: its num-examples).
    capped_weight: float | None = None

    @property
    def num_examples(self) -> int:
        return int(self.metrics[NUM_EXAMPLES])

    @property
    def weight(self) -> float | int:
        """What the reply weighs in every sample-weighted mean of its round."""
        return self.num_examples if self.capped_weight is None else self.capped_weight


class InvalidReply(ValueError):
    """Why a reply was refused (the message is logged)."""


@dataclass(frozen=True)
class ComputeFloor:
    """The least compute proxy (MACs) a training reply can honestly report: ``per_example``
    for each example trained beyond the first (a lone last batch is left out of training),
    plus ``fixed`` (work that does not grow with the shard). The default is no floor."""

    per_example: float = 0.0
    fixed: float = 0.0
    #: The examples the client trains whatever its reply claims (its profile's, where the
    #: method trains the whole shard); None: the reply's claim.
    held: int | None = None

    def examples(self, claimed: int) -> int:
        return claimed if self.held is None else self.held

    def of(self, claimed: int) -> float:
        return self.fixed + self.per_example * max(self.examples(claimed) - 1, 0)


def _no_reading(reply: ValidReply) -> None:
    """The default of ``ReplySchema.read``: a method with nothing of its own to read."""


@dataclass(frozen=True)
class ReplySchema:
    """What one node's reply must hold: its arrays, the scalar metrics the method reads besides
    num-examples, the most examples it can claim (None: no bound), the least compute proxy
    its claimed examples take, and ``read``, the method's own reading of an otherwise valid
    reply (anything it raises drops the reply)."""

    arrays: Mapping[str, ArraySpec]
    metrics: frozenset[str] = frozenset()
    max_examples: int | None = None
    compute_floor: ComputeFloor = ComputeFloor()
    read: Callable[[ValidReply], None] = field(default=_no_reading, compare=False)


def spec_of(state: Mapping[str, np.ndarray]) -> dict[str, ArraySpec]:
    """The specs that a reply echoing this state must meet."""
    return {name: ArraySpec(tuple(a.shape), str(a.dtype)) for name, a in state.items()}


def decode_array(name: str, array: Any, spec: ArraySpec) -> np.ndarray:
    """One reply array, checked against its spec from its header and byte count before its
    bytes are decoded, and its decoded values after."""
    if not isinstance(array, Array) or array.stype != SType.NUMPY:
        kind = getattr(array, "stype", type(array).__name__)
        raise InvalidReply(f"{name}: not a numpy-serialised array ({kind})")
    shape = tuple(array.shape)
    if shape != spec.shape or array.dtype != spec.dtype:
        raise InvalidReply(
            f"{name}: got {array.dtype}{list(shape)}, expected {spec.dtype}{list(spec.shape)}"
        )
    size = len(array.data)
    if not spec.nbytes <= size <= spec.nbytes + NPY_HEADER_ALLOWANCE:
        raise InvalidReply(f"{name}: {size} bytes for {spec.nbytes} bytes of values")
    try:
        values = array.numpy()
    except Exception as err:  # whatever np.load makes of bytes that are no .npy
        raise InvalidReply(f"{name}: undecodable ({type(err).__name__}: {err})") from None
    if tuple(values.shape) != spec.shape or str(values.dtype) != spec.dtype:
        raise InvalidReply(
            f"{name}: decodes to {values.dtype}{list(values.shape)}, its header says "
            f"{spec.dtype}{list(spec.shape)}"
        )
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
        raise InvalidReply(f"{name}: non-finite values")
    return values


def validate_reply(message: Message, schema: ReplySchema) -> ValidReply:
    """Check a training reply against its schema; raise InvalidReply saying what is wrong."""
    node_id = message.metadata.src_node_id
    if message.has_error():
        raise InvalidReply(f"node failed: {message.error.reason}")
    content = message.content
    if ARRAYS not in content.array_records or METRICS not in content.metric_records:
        raise InvalidReply(f"reply lacks '{ARRAYS}' or '{METRICS}' records")
    metrics = validate_metrics(message, schema.metrics, schema.max_examples)
    check_compute(metrics, schema.compute_floor)
    record = content.array_records[ARRAYS]
    names = set(record.keys())
    if names != set(schema.arrays):
        missing = sorted(set(schema.arrays) - names)
        extra = sorted(names - set(schema.arrays))
        raise InvalidReply(f"wrong keys: missing {missing[:3]}, unexpected {extra[:3]}")
    arrays = {name: decode_array(name, record[name], spec) for name, spec in schema.arrays.items()}
    reply = ValidReply(node_id=node_id, arrays=arrays, metrics=metrics)
    schema.read(reply)
    return reply


def validate_metrics(
    message: Message, required: Iterable[str] = (), max_examples: int | None = None
) -> dict[str, float | int]:
    """The reply's metrics, if every one is finite, the ``required`` ones and those the server
    reads (SCALAR_METRICS) are single numbers (times, CPU and memory not negative), and its
    positive integer num-examples is no more than ``max_examples``."""
    if message.has_error():
        raise InvalidReply(f"node failed: {message.error.reason}")
    if METRICS not in message.content.metric_records:
        raise InvalidReply(f"reply lacks the '{METRICS}' record")
    metrics = dict(message.content.metric_records[METRICS])
    missing = sorted(set(required) - set(metrics))
    if missing:
        raise InvalidReply(f"reply lacks the metrics {missing[:3]}")
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        if not all(_is_number(v) and math.isfinite(v) for v in values):
            raise InvalidReply(f"metric {key} is not finite")
        if (key in SCALAR_METRICS or key in required) and not _is_number(value):
            raise InvalidReply(f"metric {key} must be one number, got {type(value).__name__}")
        if key in NON_NEGATIVE_METRICS and value < 0:
            raise InvalidReply(f"metric {key} = {value!r} is negative")
    examples = metrics.get(NUM_EXAMPLES)
    if not isinstance(examples, int) or isinstance(examples, bool) or examples <= 0:
        raise InvalidReply(f"metric {NUM_EXAMPLES} must be a positive integer, got {examples!r}")
    if max_examples is not None and examples > max_examples:
        raise InvalidReply(
            f"metric {NUM_EXAMPLES} = {examples} is more than the {max_examples} examples the "
            "node can have used"
        )
    return metrics


def check_compute(metrics: Mapping[str, Any], floor: ComputeFloor) -> None:
    """Refuse a compute proxy below the floor of the examples trained (a missing one where
    there is a floor)."""
    claimed = int(metrics[NUM_EXAMPLES])
    least = floor.of(claimed)
    if least <= 0:
        return
    reported = metrics.get(COMPUTE_METRIC)
    if reported is None or reported < least:
        raise InvalidReply(
            f"metric {COMPUTE_METRIC} = {reported!r} is less than the {least:.6g} MACs its "
            f"{floor.examples(claimed)} examples take at the least"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def capped_weights(weights: Sequence[float | int], share: float) -> list[float | int]:
    """The weights with none above ``share`` of their sum: the largest are lowered to one common
    cap T solving T = share * (k * T + the rest), the others kept as they are (unchanged when
    ``share`` >= 1 or every weight already is below it). A share below 1/K, which K weights
    cannot meet, makes them equal."""
    if share >= 1 or len(weights) < 2 or max(weights) <= share * sum(weights):
        return list(weights)
    if share * len(weights) <= 1:
        return [min(weights)] * len(weights)
    rest = float(sum(weights))
    cap = share * rest
    for capped, weight in enumerate(sorted(weights, reverse=True)):
        cap = share * rest / (1 - capped * share)
        if weight <= cap:
            break
        rest -= weight
    return [min(w, cap) for w in weights]


def cap_shares(replies: list[ValidReply], share: float) -> list[ValidReply]:
    """The round's replies with their weights capped at ``share`` of the round's (as they are
    when no weight exceeds it)."""
    weights = capped_weights([r.num_examples for r in replies], share)
    return [
        r if w == r.num_examples else dataclasses.replace(r, capped_weight=float(w))
        for r, w in zip(replies, weights, strict=True)
    ]


@dataclass
class CheckedRound:
    """A training round's replies after the checks."""

    valid: list[ValidReply]  # in partition order: float sums must not depend on arrival order
    dropped: dict[int, str]  # node id -> why its reply was refused, or that none came


def check_round(
    server_round: int,
    replies: Iterable[Message],
    expected: Mapping[int, ReplySchema],
    partition_of: Callable[[int], int | None],
) -> CheckedRound:
    """Check every reply against what its node was sent; a refused one is logged with its
    reason, as is every sampled node that did not answer. Whatever reading a reply raises drops
    that reply, never the round."""
    awaited = dict(expected)
    valid: list[ValidReply] = []
    dropped: dict[int, str] = {}
    for message in replies:
        node_id = message.metadata.src_node_id
        try:
            if node_id not in awaited:
                raise InvalidReply("node was not sampled this round")
            valid.append(validate_reply(message, awaited.pop(node_id)))
        except Exception as err:  # a lying or broken node's reply: dropped, the round goes on
            dropped[node_id] = reason_of(err)
            partition = partition_of(node_id)
            log(
                WARNING,
                "round %d: dropped reply of node %s (partition %s): %s",
                server_round,
                node_id,
                "?" if partition is None else partition,
                dropped[node_id],
            )
    for node_id in awaited:
        dropped[node_id] = "no reply (round timeout, or the node left)"
    valid.sort(key=lambda r: partition_of(r.node_id) or 0)
    return CheckedRound(valid, dropped)


def reason_of(err: Exception) -> str:
    """A refusal's reason as logged: InvalidReply's own words, any other error with its kind."""
    if isinstance(err, InvalidReply):
        return str(err)
    return f"unreadable ({type(err).__name__}: {err})"
