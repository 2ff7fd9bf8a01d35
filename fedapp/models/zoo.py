"""One model builder for whole-model methods: ``model`` names a YAML CNN, a family candidate, or
a ResNet18 substrate of conf/supernets at one of its widths (``resnet18-fmnist@1``: the whole
model HeteroFL, ScaleFL and FIARSE slice, trained whole, with ordinary BN)."""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from fedapp.data.registry import DatasetInfo
from fedapp.models.arch import SUPERNETS_DIR, SupernetConfig, load_supernet, yaml_names
from fedapp.models.cnn import available_models, build_cnn
from fedapp.models.counter import count
from fedapp.models.elastic_resnet import ResNet
from fedapp.models.families import build_candidate, candidate_names, counted_macs, describe
from fedapp.models.substrate import width_arch

#: conf/supernets files that are ResNet18 substrates (their names start so).
SUBSTRATE_PREFIX = "resnet18-"


def model_names() -> tuple[str, ...]:
    """What ``model`` accepts: ``conf/models/*.yaml`` names, every family candidate, then every
    substrate at each of its widths."""
    return available_models() + candidate_names() + substrate_model_names()


@cache
def substrate_model_names() -> tuple[str, ...]:
    """``<substrate>@<width>`` for every ResNet18 substrate of conf/supernets."""
    return tuple(
        f"{name}@{rate:g}"
        for name in yaml_names(SUPERNETS_DIR)
        if name.startswith(SUBSTRATE_PREFIX)
        for rate in load_supernet(name).width_multipliers
    )


def _substrate(name: str, info: DatasetInfo) -> tuple[SupernetConfig, float]:
    """A substrate model's configuration sized to the data set, and its width."""
    substrate, _, rate = name.partition("@")
    config = load_supernet(
        substrate,
        in_channels=info.channels,
        image_size=info.image_size,
        num_classes=info.num_classes,
    )
    return config, float(rate)


def build_model(name: str, info: DatasetInfo) -> nn.Module:
    """A freshly initialised model for the data set's channels, input size and classes."""
    if name in available_models():
        return build_cnn(name, info.channels, info.num_classes)
    if name in substrate_model_names():
        config, rate = _substrate(name, info)
        return ResNet(config, width_arch(config, rate))
    return build_candidate(name, info)


def forward_macs(name: str, info: DatasetInfo) -> int:
    """Forward MACs of one image through the named model (the compute proxy's unit): counted
    once per name and input shape, on a throw-away build that leaves the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        if name in available_models():
            return _cnn_macs(name, info.channels, info.image_size, info.num_classes)
        if name in substrate_model_names():
            config, rate = _substrate(name, info)
            return count(config, width_arch(config, rate)).macs
        return describe(name, info, batch_size=1).macs


@cache
def _cnn_macs(name: str, channels: int, side: int, num_classes: int) -> int:
    return counted_macs(build_cnn(name, channels, num_classes).eval(), channels, side)
