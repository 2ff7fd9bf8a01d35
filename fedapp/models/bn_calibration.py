"""Batch-norm recalibration of one operating point.

Weight-shared statistics fit no single variant, so every evaluated variant gets its own: the
running mean and variance become the sample-weighted average of the per-batch statistics over a
calibration set, read in a fixed order with a fixed seed (the calibration transforms may be
random), so the same model, data and seed always give the same statistics.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from fedapp.models.elastic_resnet import ElasticBatchNorm2d

Batch = torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor]


@torch.no_grad()
def recalibrate_bn(model: nn.Module, batches: Iterable[Batch], seed: int = 0) -> int:
    """Replace the BN running statistics of ``model`` by their average over ``batches``.

    Batch ``k`` of size ``b`` enters with momentum ``b / (seen + b)``, which makes the result the
    exact sample-weighted cumulative average (the first batch overwrites whatever was there).
    Static BN layers are also reset first; an elastic supernet's layers are not, so only the
    active slices change and other variants keep their statistics. ``batches`` yields inputs or
    ``(inputs, labels, ...)``; iteration runs under ``torch.manual_seed(seed)`` without touching
    the caller's RNG. Returns the number of calibration samples.
    """
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    momenta = [bn.momentum for bn in layers]
    was_training = model.training
    for bn in layers:
        if not isinstance(bn, ElasticBatchNorm2d):
            bn.reset_running_stats()
    model.train()
    seen = 0
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for batch in batches:
                inputs = batch if isinstance(batch, torch.Tensor) else batch[0]
                size = int(inputs.shape[0])
                for bn in layers:
                    bn.momentum = size / (seen + size)
                model(inputs)
                seen += size
    finally:
        for bn, momentum in zip(layers, momenta, strict=True):
            bn.momentum = momentum
        model.train(was_training)
    if seen == 0:
        raise ValueError("the BN calibration set is empty")
    return seen
