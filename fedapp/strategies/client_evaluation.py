"""Evaluation of models that live on the clients (Ditto's personal models, the logit-exchange
methods' own models): every profiled node evaluates its model on a server-named split and
replies with metrics; a bad reply is dropped and logged, like a training reply."""

from __future__ import annotations

from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedapp.evaluation.intervals import with_interval
from fedapp.exchange import exchange
from fedapp.messages import ACCURACY, CONFIG, EVAL_SPLIT, LOSS
from fedapp.profiles import NodeRegistry
from fedapp.strategies.reply_validation import validate_metrics


def client_evaluation(
    grid: Grid, nodes: NodeRegistry, split: str, timeout: float
) -> list[dict[str, float | int]]:
    """Every connected, profiled node evaluates its own model on ``split`` ('validation' or
    'test', which clients derive from the run config); one metrics dict per valid reply, in
    partition order, with 'partition' and the accuracy's 95 % interval (from the node's own
    num-examples: ci95_low, ci95_high) added."""
    connected = set(grid.get_node_ids())
    messages = [
        Message(
            RecordDict({CONFIG: ConfigRecord({EVAL_SPLIT: split})}),
            dst_node_id=node_id,
            message_type=MessageType.EVALUATE,
        )
        for node_id in sorted(connected & set(nodes.profiles))
    ]
    rows = []
    for reply in exchange(grid, messages, timeout):
        profile = nodes.profiles[reply.metadata.src_node_id]
        try:  # an accuracy outside [0, 1] is refused with the reply, by with_interval
            metrics = with_interval(validate_metrics(reply))
        except ValueError as err:  # InvalidReply is one
            log(WARNING, "%s evaluation: dropped node %s: %s", split, profile.node_id, err)
            continue
        rows.append({"partition": profile.partition_id, **metrics})
    return sorted(rows, key=lambda row: row["partition"])


def unweighted_mean(rows: list[dict[str, float | int]]) -> dict[str, float]:
    """Mean accuracy and loss over clients' rows, each client counting once (NaN when none)."""
    return {
        key: float(np.mean([r[key] for r in rows])) if rows else float("nan")
        for key in (ACCURACY, LOSS)
    }
