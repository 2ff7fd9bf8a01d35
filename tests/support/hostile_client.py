"""A hostile ClientApp: fedapp's own ClientApp, whose replies chosen partitions corrupt.

Each node trains and evaluates exactly as fedapp's ClientApp does (same functions, same state),
then, where ``lies`` names its partition and the round, changes its reply the way a lying or
broken device would: claim 10^12 times its examples (with random weights), claim it did no
work, 1 % less than it did, or half its examples and half its work (to slip under a deadline),
send a metric as a list, arrays of the wrong length, extra arrays, bytes that are no numpy
array, leave out or garble its NAS metrics, or (on the validation split) evaluate without
accuracy or claim 10^12 examples; the server must drop each such reply with a logged reason and
carry on. Random weights with the node's true example count (``noisy-weights``) pass every
check: only a robust aggregation (Krum, the median, ...) can resist them.
``profile_lies`` makes chosen partitions' handshake replies claim other profile values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp

from fedapp.apps import client_app as fedapp_client
from fedapp.methods.fedkd_nas.keys import NAS_MULTIPLIER, NAS_REASON
from fedapp.wire.messages import (
    ACCURACY,
    ARRAYS,
    COMPUTE_METRIC,
    CONFIG,
    EVAL_SPLIT,
    METRICS,
    NUM_EXAMPLES,
    PROFILE,
    SERVER_ROUND,
    TRAIN_SECONDS,
)

INFLATION = 10**12


def _metrics(reply: Message, change: Callable[[dict], dict]) -> Message:
    record = reply.content.metric_records[METRICS]
    reply.content.metric_records[METRICS] = MetricRecord(change(dict(record)))
    return reply


def _first_array(reply: Message) -> tuple[str, Array]:
    record = reply.content.array_records[ARRAYS]
    name = sorted(record.keys())[0]
    return name, record[name]


def noisy_weights(reply: Message) -> Message:
    """Random weights (N(0, 10) for every floating-point array) in place of the trained ones,
    with the node's true example count: a reply every check accepts (a Byzantine client)."""
    record = reply.content.array_records[ARRAYS]
    rng = np.random.default_rng(0)
    for name in list(record.keys()):
        values = record[name].numpy()
        if np.issubdtype(values.dtype, np.floating):
            noise = rng.normal(0, 10, values.shape).astype(values.dtype)
            record[name] = Array(np.require(noise, requirements="C"))
    return reply


def inflated_examples(reply: Message) -> Message:
    """Random weights, claimed to come from 10^12 times the node's examples."""
    noisy_weights(reply)
    return _metrics(reply, lambda m: m | {NUM_EXAMPLES: m[NUM_EXAMPLES] * INFLATION})


def no_work(reply: Message) -> Message:
    """A compute proxy of 0: the reply would take only its transfers on the fleet's clock."""
    return _metrics(reply, lambda m: m | {COMPUTE_METRIC: 0.0})


def under_reported_compute(reply: Message) -> Message:
    """The compute proxy 1 % below what the node trained."""
    return _metrics(reply, lambda m: m | {COMPUTE_METRIC: 0.99 * m[COMPUTE_METRIC]})


def fewer_examples(reply: Message) -> Message:
    """Half its examples claimed, and the compute proxy of half (its time on the clock halved)."""
    return _metrics(
        reply,
        lambda m: m | {NUM_EXAMPLES: m[NUM_EXAMPLES] // 2, COMPUTE_METRIC: 0.5 * m[COMPUTE_METRIC]},
    )


def list_metric(reply: Message) -> Message:
    """train-seconds as a list where the server reads one number."""
    return _metrics(reply, lambda m: m | {TRAIN_SECONDS: [1.0, 2.0]})


def wrong_length(reply: Message) -> Message:
    """The first array (logits, for a logit method) one row short."""
    name, array = _first_array(reply)
    values = array.numpy()
    reply.content.array_records[ARRAYS][name] = Array(np.ascontiguousarray(values[:-1]))
    return reply


def extra_arrays(reply: Message) -> Message:
    """A reply padded with an array nobody asked for (4 MB)."""
    padding = np.zeros(2**20, np.float32)
    reply.content.array_records[ARRAYS]["padding"] = Array(padding)
    return reply


def undecodable(reply: Message) -> Message:
    """The first array's header kept, its bytes replaced by as many that are no .npy file."""
    name, array = _first_array(reply)
    garbage = bytes(len(array.data))
    reply.content.array_records[ARRAYS][name] = Array(
        dtype=array.dtype, shape=tuple(array.shape), stype=array.stype, data=garbage
    )
    return reply


def no_nas_metrics(reply: Message) -> Message:
    """A FedKD-NAS reply without the NAS metrics that say which student trained."""
    return _metrics(reply, lambda m: {k: v for k, v in m.items() if not k.startswith("nas-")})


def unknown_multiplier(reply: Message) -> Message:
    """A student no candidate of the family has, and a reason out of range."""
    return _metrics(reply, lambda m: m | {NAS_MULTIPLIER: 3.7, NAS_REASON: 9})


def no_accuracy(reply: Message) -> Message:
    """An evaluation without its accuracy."""
    return _metrics(reply, lambda m: {k: v for k, v in m.items() if k != ACCURACY})


def inflated_evaluation(reply: Message) -> Message:
    """An evaluation claiming 10^12 times the images of the split."""
    return _metrics(reply, lambda m: m | {NUM_EXAMPLES: m[NUM_EXAMPLES] * INFLATION})


TRAIN_LIES: dict[str, Callable[[Message], Message]] = {
    "noisy-weights": noisy_weights,
    "inflated-examples": inflated_examples,
    "no-work": no_work,
    "under-reported-compute": under_reported_compute,
    "fewer-examples": fewer_examples,
    "list-metric": list_metric,
    "wrong-length": wrong_length,
    "extra-arrays": extra_arrays,
    "undecodable": undecodable,
    "no-nas-metrics": no_nas_metrics,
    "unknown-multiplier": unknown_multiplier,
}
EVALUATION_LIES: dict[str, Callable[[Message], Message]] = {
    "no-accuracy": no_accuracy,
    "inflated-evaluation": inflated_evaluation,
}

#: partition id -> {round: lie}: a training lie in that round, or an evaluation lie on the
#: validation split after that round's training.
Lies = Mapping[int, Mapping[int, str]]


#: partition id -> profile values its handshake reply claims instead of its own.
ProfileLies = Mapping[int, Mapping[str, Any]]


def hostile_app(lies: Lies, profile_lies: ProfileLies | None = None) -> ClientApp:
    """fedapp's ClientApp with the replies of the partitions in ``lies`` corrupted, and the
    profiles of those in ``profile_lies``."""
    app = ClientApp()
    last_round: dict[int, int] = {}  # partition -> the round it last trained
    profile_lies = profile_lies or {}

    def lie_of(context: Context, server_round: int) -> str | None:
        partition = int(context.node_config["partition-id"])
        return lies.get(partition, {}).get(server_round)

    @app.query()
    def query(message: Message, context: Context) -> Message:
        reply = fedapp_client.query(message, context)
        claims = profile_lies.get(int(context.node_config["partition-id"]))
        if claims and not reply.has_error():
            own = dict(reply.content.config_records[PROFILE])
            reply.content.config_records[PROFILE] = ConfigRecord(own | dict(claims))
        return reply

    @app.train()
    def train(message: Message, context: Context) -> Message:
        reply = fedapp_client.train(message, context)
        server_round = int(message.content[CONFIG][SERVER_ROUND])
        last_round[int(context.node_config["partition-id"])] = server_round
        lie = lie_of(context, server_round)
        return TRAIN_LIES[lie](reply) if lie in TRAIN_LIES else reply

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        reply = fedapp_client.evaluate(message, context)
        if str(message.content[CONFIG][EVAL_SPLIT]) != "validation":
            return reply
        server_round = last_round.get(int(context.node_config["partition-id"]), 0)
        lie = lie_of(context, server_round)
        return EVALUATION_LIES[lie](reply) if lie in EVALUATION_LIES else reply

    return app
