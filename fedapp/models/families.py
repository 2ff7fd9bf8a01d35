"""Candidate architecture families a client's NAS controller picks from (FedKD-NAS and Local-KD).

A family is one backbone at several width multipliers: LeNet5 (channel multipliers), MobileNetV2
(torchvision, width_mult), ShuffleNetV2 (torchvision x0.5 / x1.0) and ResNet18 widths (the
project's elastic ResNet family in its ResNet18 substrate configuration). Every
candidate carries its forward MACs and parameters, counted once with torch's FLOP counter on one
input of the run's shape (MACs = FLOPs / 2), and a training-memory estimate, so the controller can
tell which ones a client's budget affords without building them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import torch
from torch import nn

from fedapp.data.registry import DatasetInfo
from fedapp.models.arch import load_supernet
from fedapp.models.budgets import BudgetError
from fedapp.models.elastic_resnet import ResNet
from fedapp.models.substrate import width_arch

BYTES_PER_VALUE = 4  # float32
#: Per parameter, training keeps the weight, its gradient and the SGD momentum buffer.
PARAM_COPIES_IN_TRAINING = 3
#: Inputs up to this side get a stride-1 stem (no early downsampling), the usual CIFAR/MNIST
#: adaptation of ImageNet backbones; larger inputs keep torchvision's stem.
SMALL_INPUT_SIDE = 32


@dataclass(frozen=True)
class Candidate:
    """One architecture a client may train, with what it costs."""

    name: str
    family: str
    multiplier: float
    macs: int
    params: int
    train_memory_bytes: int


class LeNet5(nn.Module):
    """LeNet-5 (conv 6@5x5, pool, conv 16@5x5, pool, fc 120, fc 84, fc C) with every width scaled.

    The first conv pads by 2 (28x28 stays 28x28, as for MNIST). The second conv pads by 2 too when
    the input is small (< 16 pixels, e.g. 8x8 digits), otherwise its map would vanish.
    """

    def __init__(self, multiplier: float, info: DatasetInfo) -> None:
        super().__init__()
        c1, c2, f1, f2 = (max(1, round(w * multiplier)) for w in (6, 16, 120, 84))
        pad2 = 2 if info.image_size < 16 else 0
        side = info.image_size // 2 + 2 * pad2 - 4
        side //= 2
        self.features = nn.Sequential(
            nn.Conv2d(info.channels, c1, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=pad2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c2 * side * side, f1),
            nn.ReLU(inplace=True),
            nn.Linear(f1, f2),
            nn.ReLU(inplace=True),
            nn.Linear(f2, info.num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _stem_conv(old: nn.Conv2d, info: DatasetInfo) -> nn.Conv2d:
    """The backbone's first conv for the data set's channels; stride 1 for small inputs."""
    stride = 1 if info.image_size <= SMALL_INPUT_SIDE else old.stride
    return nn.Conv2d(
        info.channels,
        old.out_channels,
        old.kernel_size,
        stride=stride,
        padding=old.padding,
        bias=old.bias is not None,
    )


def _mobilenetv2(multiplier: float, info: DatasetInfo) -> nn.Module:
    import torchvision  # only where a torchvision backbone is built: config imports this module

    model = torchvision.models.mobilenet_v2(width_mult=multiplier, num_classes=info.num_classes)
    model.features[0][0] = _stem_conv(model.features[0][0], info)
    return model


def _shufflenetv2(multiplier: float, info: DatasetInfo) -> nn.Module:
    import torchvision  # see _mobilenetv2

    builders = {
        0.5: torchvision.models.shufflenet_v2_x0_5,
        1.0: torchvision.models.shufflenet_v2_x1_0,
    }
    model = builders[multiplier](num_classes=info.num_classes)
    model.conv1[0] = _stem_conv(model.conv1[0], info)
    if info.image_size <= SMALL_INPUT_SIDE:
        model.maxpool = nn.Identity()
    return model


def _resnet18(multiplier: float, info: DatasetInfo) -> nn.Module:
    """The standard-width ResNet18 (64/128/256/512) of the project's substrate configurations
    (``resnet18-cifar``: 3x3 stride-1 stem; ``resnet18-tinyimagenet`` above 32 pixels: max-pool
    2 after the stem) with every position at ``multiplier``, sized for the data set."""
    name = "resnet18-cifar" if info.image_size <= SMALL_INPUT_SIDE else "resnet18-tinyimagenet"
    config = load_supernet(
        name,
        in_channels=info.channels,
        image_size=info.image_size,
        num_classes=info.num_classes,
    )
    return ResNet(config, width_arch(config, multiplier))


@dataclass(frozen=True)
class _Family:
    multipliers: tuple[float, ...]
    build: Callable[[float, DatasetInfo], nn.Module]


FAMILIES: dict[str, _Family] = {
    "lenet5": _Family((0.25, 0.5, 1.0, 2.0), LeNet5),
    "mobilenetv2": _Family((0.25, 0.35, 0.5, 0.75, 1.0), _mobilenetv2),
    "shufflenetv2": _Family((0.5, 1.0), _shufflenetv2),
    "resnet18": _Family((0.125, 0.25, 0.5, 1.0), _resnet18),
}
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)


def candidate_name(family: str, multiplier: float) -> str:
    return f"{family}-x{float(multiplier)!r}"


def candidate_names() -> tuple[str, ...]:
    """Every candidate of every family (what the ``model`` key may name besides YAML models)."""
    return tuple(candidate_name(f, m) for f, fam in FAMILIES.items() for m in fam.multipliers)


def _parse(name: str) -> tuple[str, float]:
    family, _, width = name.rpartition("-x")
    if family not in FAMILIES or name not in candidate_names():
        raise ValueError(f"unknown candidate {name!r}; known: {', '.join(candidate_names())}")
    return family, float(width)


def build_candidate(name: str, info: DatasetInfo) -> nn.Module:
    """A freshly initialised candidate for the data set's channels, size and classes."""
    family, multiplier = _parse(name)
    return FAMILIES[family].build(multiplier, info)


def counted_macs(model: nn.Module, channels: int, side: int) -> int:
    """Forward MACs of one image through the model, FLOP-counted (a MAC is two FLOPs)."""
    from torch.utils.flop_counter import FlopCounterMode  # imports triton: only when counting

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.zeros(1, channels, side, side))
    return counter.get_total_flops() // 2


@cache
def _profile(name: str, channels: int, side: int, num_classes: int) -> tuple[int, int, int]:
    """(forward MACs, parameters, activation values kept for backward) for one image."""
    info = DatasetInfo(name, num_classes, channels, side, (0.0,), (1.0,), "none", False)
    model = build_candidate(name, info).eval()
    activations = 0

    def count_output(_: nn.Module, __: object, output: torch.Tensor) -> None:
        nonlocal activations
        activations += output.numel()

    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_hook(count_output) for m in leaves]
    macs = counted_macs(model, channels, side)
    for hook in hooks:
        hook.remove()
    params = sum(p.numel() for p in model.parameters())
    return macs, params, activations


def describe(name: str, info: DatasetInfo, batch_size: int) -> Candidate:
    """The candidate's costs at the data set's input size.

    Training memory = 4 bytes x (3 x parameters [weight, gradient, momentum] + batch x (input +
    every leaf module's output on one image)): the outputs autograd keeps for the backward pass.
    It ignores allocator slack and framework overhead, so it ranks candidates rather than predicts
    a process's RSS.
    """
    family, multiplier = _parse(name)
    macs, params, activations = _profile(name, info.channels, info.image_size, info.num_classes)
    per_image = activations + info.channels * info.image_size**2
    memory = BYTES_PER_VALUE * (PARAM_COPIES_IN_TRAINING * params + batch_size * per_image)
    return Candidate(name, family, multiplier, macs, params, memory)


def family_candidates(family: str, info: DatasetInfo, batch_size: int) -> list[Candidate]:
    """A family's candidates, cheapest first (by MACs)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILY_NAMES)}")
    names = [candidate_name(family, m) for m in FAMILIES[family].multipliers]
    return sorted((describe(n, info, batch_size) for n in names), key=lambda c: c.macs)


def affordable(
    candidates: Sequence[Candidate], budget_macs: float, memory_bytes: float | None = None
) -> list[Candidate]:
    """The candidates within the MAC budget (and the memory budget when one is given)."""
    memory = math.inf if memory_bytes is None else memory_bytes
    return [c for c in candidates if c.macs <= budget_macs and c.train_memory_bytes <= memory]


def largest_affordable(candidates: Sequence[Candidate], budget_macs: float) -> Candidate:
    """The most expensive candidate within the budget; a BudgetError below the cheapest."""
    fitting = affordable(candidates, budget_macs)
    if not fitting:
        cheapest = min(candidates, key=lambda c: c.macs)
        raise BudgetError(
            f"budget {budget_macs:,.0f} MACs is below the smallest candidate "
            f"{cheapest.name} ({cheapest.macs:,} MACs)"
        )
    return max(fitting, key=lambda c: c.macs)
