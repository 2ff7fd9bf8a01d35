"""Ditto client (Li et al., ICML 2021): the FedAvg update of the global model, plus a personal
model kept on this node and pulled towards the round's global model by a proximal term.

Order: PFLlib's, not the official interleaved one. The global copy trains exactly as a FedAvg client
(fedapp.methods.common.whole_model_client, reused), then the personal model trains on the same shard
for the same epochs with v <- v - lr * (grad F(v) + lambda * (v - w^t)), w^t = the global model
received this round. The two updates are independent (each starts from its own model and only reads
w^t), so the order changes nothing but which mini-batch order each one sees.

The personal model lives in Flower's node state (fedapp.methods.common.node_state), initialised from
the first global model this node receives; only the global copy travels back to the server.
"""

from __future__ import annotations

import torch
from flwr.app import Message, RecordDict
from torch import nn

from fedapp.methods.common.evaluation_reply import evaluation_reply, no_model_reply
from fedapp.methods.common.local_round import round_generator, shard_loader
from fedapp.methods.common.node_state import load_arrays, save_arrays
from fedapp.methods.common.whole_model_client import train_named_model
from fedapp.methods.ditto.settings import DittoSettings
from fedapp.models.zoo import build_model
from fedapp.random_streams import Stream
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.training.loops import (
    TrainStats,
    resolve_device,
    sgd,
    train_supervised,
)
from fedapp.training.proximal import add_proximal_term
from fedapp.wire.messages import (
    ARRAYS,
    COMPUTE_METRIC,
    CONFIG,
    LEARNING_RATE,
    METRICS,
    TRAIN_SECONDS,
)
from fedapp.wire.records import from_record, load_state

#: node-state key of the personal model
PERSONAL_KEY = "ditto-personal"


def train_personal(
    personal: nn.Module,
    global_model: nn.Module,
    loader: torch.utils.data.DataLoader,
    run: RunContext,
    lr: float,
    device: torch.device,
) -> TrainStats:
    """``local-epochs`` of SGD on the personal model with the proximal term towards the global
    model's parameters (``ditto.lambda``)."""
    personal.to(device)
    anchor = [p.detach().to(device).clone() for p in global_model.parameters()]
    optimizer = sgd(personal, lr, run.training.momentum, run.training.weight_decay)
    add_proximal_term(optimizer, anchor, run.section(DittoSettings).lambda_)
    return train_supervised(personal, loader, optimizer, run.training.local_epochs, device)


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """FedAvg's local update of the global model, then the personal model's proximal update."""
    reply = train_named_model(run.model, message, run, node)
    info = run.info
    lr = float(message.content[CONFIG][LEARNING_RATE])
    received = from_record(message.content[ARRAYS])
    global_model = build_model(run.model, info)
    load_state(global_model, received)
    personal = build_model(run.model, info)
    load_state(personal, load_arrays(node.state, PERSONAL_KEY) or received)
    generator = round_generator(message, run, node, Stream.DITTO_PERSONAL)
    loader = shard_loader(run, node, generator)
    stats = train_personal(
        personal, global_model, loader, run, lr, resolve_device(run.training.device)
    )
    save_arrays(node.state, PERSONAL_KEY, personal.state_dict())
    metrics = reply.metric_records[METRICS]
    metrics["personal-train-loss"] = stats.loss
    # the personal model trains as many examples as the global copy, at the same cost
    metrics[COMPUTE_METRIC] = 2 * float(metrics[COMPUTE_METRIC])
    metrics[TRAIN_SECONDS] = float(metrics[TRAIN_SECONDS]) + stats.seconds
    return reply


def evaluate_personal(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """This node's personal model on the server-held split the message names (a node never
    sampled has none: :func:`no_model_reply`)."""
    kept = load_arrays(node.state, PERSONAL_KEY)
    if kept is None:
        return no_model_reply()
    info = run.info
    model = build_model(run.model, info)
    load_state(model, kept)
    return evaluation_reply(model, message, run)
