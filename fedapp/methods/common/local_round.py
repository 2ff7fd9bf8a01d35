"""A client's round set-up and local epochs under the run's settings, for the trainers of
FEAST, HeteroFL, ScaleFL, FIARSE and FedAvg (the loops themselves are fedapp.training.loops)."""

from __future__ import annotations

import torch
from flwr.app import Message
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from fedapp.config import RunConfig
from fedapp.data.registry import DatasetInfo
from fedapp.messages import CONFIG, LEARNING_RATE, SERVER_ROUND
from fedapp.profiles import LocalNode
from fedapp.random_streams import Stream
from fedapp.training.loops import (
    Gradients,
    TrainStats,
    resolve_device,
    seed_local_work,
    sgd,
    train_epochs,
    train_loader,
)


def local_sgd(
    model: nn.Module,
    message: Message,
    cfg: RunConfig,
    node: LocalNode,
    info: DatasetInfo,
    weight_decay: float | None = None,
) -> tuple[torch.Generator, DataLoader, torch.optim.SGD]:
    """A client's round set-up after its model is built: the round's seeded generator, its
    shuffled shard and SGD at the message's learning rate (``weight_decay`` overrides the run's).
    """
    config = message.content[CONFIG]
    generator = seed_local_work(
        cfg.seed, Stream.LOCAL_TRAINING, int(config[SERVER_ROUND]), node.partition_id
    )
    loader = train_loader(node.shard(cfg), info, cfg.batch_size, generator)
    decay = cfg.weight_decay if weight_decay is None else weight_decay
    return generator, loader, sgd(model, float(config[LEARNING_RATE]), cfg.momentum, decay)


def train_local_epochs(
    model: nn.Module,
    loader: DataLoader,
    optimizer: Optimizer,
    gradients: Gradients,
    cfg: RunConfig,
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
        epochs=cfg.local_epochs,
        device=resolve_device(cfg.device),
        generator=generator,
        mix=cfg.mix_batches,
        grad_clip=cfg.grad_clip if clip else None,
        min_batch=min_batch,
    )
