"""Evaluation of models that live on the clients (Ditto's personal models, the logit-exchange
methods' own models): every profiled node evaluates its model on a server-named split and
replies with metrics; a bad reply is dropped and logged, like a training reply: one that lacks
accuracy or loss, claims more examples than the split holds, or that the method cannot read."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.evaluation.intervals import with_interval
from fedapp.methods.common.reply_validation import reason_of, validate_metrics
from fedapp.run.exchange import exchange
from fedapp.run.profiles import NodeRegistry
from fedapp.wire.messages import ACCURACY, CONFIG, EVAL_SPLIT, LOSS

#: What every evaluation reply must report.
EVALUATION_METRICS = frozenset({ACCURACY, LOSS})

Row = dict[str, Any]


def client_evaluation(
    grid: Grid,
    nodes: NodeRegistry,
    split: str,
    timeout: float,
    split_size: int,
    required: Iterable[str] = (),
    read: Callable[[Row], Row] = dict,
) -> list[Row]:
    """Every connected, profiled node evaluates its own model on ``split`` ('validation' or
    'test', which clients derive from the run config; ``split_size`` images); one metrics dict
    per valid reply, in partition order, with 'partition' and the accuracy's 95 % interval
    (from the node's own num-examples: ci95_low, ci95_high) added, then ``read`` (the method's
    reading of a row, e.g. the model it names; whatever it raises drops the reply)."""
    connected = set(grid.get_node_ids())
    messages = [
        Message(
            RecordDict({CONFIG: ConfigRecord({EVAL_SPLIT: split})}),
            dst_node_id=node_id,
            message_type=MessageType.EVALUATE,
        )
        for node_id in sorted(connected & set(nodes.profiles))
    ]
    needed = EVALUATION_METRICS | set(required)
    rows = []
    for reply in exchange(grid, messages, timeout):
        node_id = reply.metadata.src_node_id
        profile = nodes.profiles.get(node_id)
        try:  # an accuracy outside [0, 1] is refused with the reply, by with_interval
            if profile is None:
                raise ValueError("node was not asked to evaluate")
            metrics = with_interval(validate_metrics(reply, needed, split_size))
            rows.append(read({"partition": profile.partition_id, **metrics}))
        except Exception as err:  # a lying or broken node's reply: dropped, the others count
            log(WARNING, "%s evaluation: dropped node %s: %s", split, node_id, reason_of(err))
    return sorted(rows, key=lambda row: row["partition"])


def unweighted_mean(rows: list[Row]) -> dict[str, float]:
    """Mean accuracy and loss over clients' rows, each client counting once (NaN when none)."""
    return {
        key: float(np.mean([r[key] for r in rows])) if rows else float("nan")
        for key in (ACCURACY, LOSS)
    }
