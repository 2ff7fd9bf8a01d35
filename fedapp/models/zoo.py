"""One model builder for whole-model methods: ``model`` names a YAML CNN or a family candidate."""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from fedapp.data.registry import DatasetInfo
from fedapp.models.cnn import available_models, build_cnn
from fedapp.models.families import build_candidate, candidate_names, counted_macs, describe


def model_names() -> tuple[str, ...]:
    """What ``model`` accepts: ``conf/models/*.yaml`` names, then every family candidate."""
    return available_models() + candidate_names()


def build_model(name: str, info: DatasetInfo) -> nn.Module:
    """A freshly initialised model for the data set's channels, input size and classes."""
    if name in available_models():
        return build_cnn(name, info.channels, info.num_classes)
    return build_candidate(name, info)


def forward_macs(name: str, info: DatasetInfo) -> int:
    """Forward MACs of one image through the named model (the compute proxy's unit): counted
    once per name and input shape, on a throw-away build that leaves the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        if name in available_models():
            return _cnn_macs(name, info.channels, info.image_size, info.num_classes)
        return describe(name, info, batch_size=1).macs


@cache
def _cnn_macs(name: str, channels: int, side: int, num_classes: int) -> int:
    return counted_macs(build_cnn(name, channels, num_classes).eval(), channels, side)
