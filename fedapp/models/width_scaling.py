"""What a width-scaled sub-model needs in HeteroFL-style local training: static BN and the Scaler.

Static BN normalises with batch statistics only and keeps no running buffers, so a client's
state is its weights and biases alone; the server computes statistics per width before testing
(sBN). The Scaler divides a conv's output by the width rate, which compensates a narrower layer's
smaller pre-activation sums; HeteroFL applies it in training only.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from fedapp.models.arch import SupernetConfig
from fedapp.models.elastic_resnet import STATIC, LayerKit, ResNet
from fedapp.models.substrate import width_arch

#: Static layers whose BN keeps no running statistics (normalises by batch statistics always).
STATIC_BN = LayerKit(
    conv=STATIC.conv,
    bn=lambda c, eps, momentum: nn.BatchNorm2d(c, eps=eps, track_running_stats=False),
    linear=STATIC.linear,
)


def _scale(
    rate: float, training_only: bool, module: nn.Module, args: tuple, output: torch.Tensor
) -> torch.Tensor:
    if training_only and not module.training:
        return output
    return output / rate


def attach_scaler(model: nn.Module, rate: float, training_only: bool = True) -> None:
    """Divide every convolution's output by ``rate`` (before the BN that follows it).

    HeteroFL places its Scaler in front of each normalisation; in the family's post-activation
    blocks every BN directly follows a conv (stem, both block convs, the projecting shortcut),
    so this is the same position. ``training_only=False`` gives ScaleFL's always-on variant.
    """
    if not 0 < rate <= 1:
        raise ValueError(f"scaler rate must lie in (0, 1], got {rate}")
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.register_forward_hook(partial(_scale, rate, training_only))


#: HeteroFL's width multipliers (rate letters e, d, c, b, a), smallest first.
WIDTHS: tuple[float, ...] = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)


def width_model(config: SupernetConfig, rate: float) -> ResNet:
    """The static sub-model of one width as a client trains it: static BN, Scaler(rate)."""
    model = ResNet(config, width_arch(config, rate), STATIC_BN)
    attach_scaler(model, rate)
    return model
