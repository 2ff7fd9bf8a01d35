"""A client's round set-up and local epochs under the run's settings, for every trainer: the
round's seeded generator, its shuffled shard, SGD at the message's learning rate (the loops
themselves are fedapp.training.loops)."""

from __future__ import annotations

import torch
from flwr.app import Message
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from fedapp.random_streams import Stream
from fedapp.run.context import RunContext
from fedapp.run.pieces import LocalTraining
from fedapp.run.profiles import LocalNode
from fedapp.training.loops import (
    Gradients,
    TrainStats,
    resolve_device,
    seed_local_work,
    sgd,
    train_epochs,
    train_loader,
)
from fedapp.wire.messages import CONFIG, LEARNING_RATE, SERVER_ROUND


def round_generator(
    message: Message, run: RunContext, node: LocalNode, stream: Stream = Stream.LOCAL_TRAINING
) -> torch.Generator:
    """The generator of this node's work in the message's round, by ``stream``; it seeds torch's
    global generator too, so a model built after it is initialised from the same stream."""
    server_round = int(message.content[CONFIG][SERVER_ROUND])
    return seed_local_work(run.training.seed, stream, server_round, node.partition_id)


def shard_loader(run: RunContext, node: LocalNode, generator: torch.Generator) -> DataLoader:
    """The node's training shard, shuffled by ``generator``, in the run's batch size."""
    return train_loader(node.shard(run.data), run.info, run.training.batch_size, generator)


def local_sgd(
    model: nn.Module,
    message: Message,
    run: RunContext,
    node: LocalNode,
    weight_decay: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Generator, DataLoader, torch.optim.SGD]:
    """A client's round set-up after its model is built: the round's seeded generator (``generator``
    where the trainer seeded it before building its model), its shuffled shard and SGD at the
    message's learning rate (``weight_decay`` overrides the run's)."""
    generator = round_generator(message, run, node) if generator is None else generator
    loader = shard_loader(run, node, generator)
    decay = run.training.weight_decay if weight_decay is None else weight_decay
    learning_rate = float(message.content[CONFIG][LEARNING_RATE])
    return generator, loader, sgd(model, learning_rate, run.training.momentum, decay)


def train_local_epochs(
    model: nn.Module,
    loader: DataLoader,
    optimizer: Optimizer,
    gradients: Gradients,
    training: LocalTraining,
    generator: torch.Generator,
    *,
    clip: bool = True,
    min_batch: int = 1,
) -> TrainStats:
    """``local-epochs`` of :func:`train_epochs` with the run's device, batch mixing
    (``mix-batches``) and gradient clipping (``grad-clip``, unless ``clip`` is False)."""
    return train_epochs(
        model,
        loader,
        optimizer,
        gradients,
        epochs=training.local_epochs,
        device=resolve_device(training.device),
        generator=generator,
        mix=training.mix_batches,
        grad_clip=training.grad_clip if clip else None,
        min_batch=min_batch,
    )
