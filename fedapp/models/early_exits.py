"""Depth-width levels with early exits on the ResNet substrate (ScaleFL, Ilhan et al. 2023).

A level keeps the first ``blocks`` residual blocks of the substrate, every stage at one width
multiplier, and carries a classifier at each exit point up to its depth: the exit points are the
depths of all levels, so level k (1-based) has k exits and its deepest one is its own final
classifier. The deepest exit of the whole network is the substrate's ``head``; the others are
``exits.<i>``. Channels at a smaller width are leading slices of the full-width ones, so every
tensor of a level (backbone and exit heads alike) is the leading slice of the same-named tensor of
the global model, and ``level_shapes`` fully describes what a level sends and receives.

An exit head is ``convs`` x [conv3x3 + BN + ReLU] then global average pooling and a linear layer:
ScaleFL's reference classifier has three such convolutions; the FEAST paper's ResNet18 adaptation
(11.27M parameters, a ~35M-MAC smallest level at 100 classes) has none.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from fedapp.models.arch import Arch, SupernetConfig
from fedapp.models.counter import Cost, count
from fedapp.models.elastic_resnet import STATIC, ResNet
from fedapp.models.substrate import width_arch


@dataclass(frozen=True)
class Level:
    """A depth-width level: the first ``blocks`` blocks, every stage at ``width``."""

    blocks: int
    width: float


#: ScaleFL's four levels on ResNet18's eight BasicBlocks (FEAST paper, Supplementary E.1).
SCALEFL_LEVELS: tuple[Level, ...] = (Level(3, 0.40), Level(4, 0.50), Level(5, 0.60), Level(8, 1.00))


def total_blocks(config: SupernetConfig) -> int:
    """Blocks of the substrate at full depth."""
    return config.num_stages * (1 + config.max_extra_blocks)


def block_position(config: SupernetConfig, block: int) -> tuple[int, int]:
    """(stage, index in stage) of the ``block``-th block (1-based) of the full-depth substrate."""
    per_stage = 1 + config.max_extra_blocks
    return (block - 1) // per_stage, (block - 1) % per_stage


def check_levels(config: SupernetConfig, levels: tuple[Level, ...]) -> None:
    """Levels must grow in depth and width, fit the substrate and end with the whole network."""
    depth = total_blocks(config)
    if not levels or levels[-1] != Level(depth, config.width_multipliers[-1]):
        raise ValueError(f"the last level must be the whole network ({depth} blocks, full width)")
    for low, high in itertools.pairwise(levels):
        if not (low.blocks < high.blocks and low.width <= high.width):
            raise ValueError(f"levels must grow in depth and not shrink in width: {low} -> {high}")
    for level in levels:
        if level.blocks < 1:
            raise ValueError(f"level {level} keeps no block")
        width_arch(config, level.width)


class ExitHead(nn.Module):
    """``convs`` x [conv3x3 + BN + ReLU], global average pooling, then a linear classifier."""

    def __init__(self, config: SupernetConfig, channels: int, convs: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(STATIC.conv(channels, channels, 3, 1) for _ in range(convs))
        self.bns = nn.ModuleList(
            STATIC.bn(channels, config.bn_eps, config.bn_momentum) for _ in range(convs)
        )
        self.fc = STATIC.linear(channels, config.num_classes)
        for conv in self.convs:
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in zip(self.convs, self.bns, strict=True):
            x = F.relu(bn(conv(x)))
        return self.fc(x.mean(dim=(2, 3)))


class EarlyExitResNet(ResNet):
    """One level of the substrate: its leading blocks at its width, with its exit heads.

    ``forward`` returns the level's deepest exit only (what serving it runs);
    ``exit_logits`` returns every exit of the level, shallow to deep (what training needs).
    """

    def __init__(
        self,
        config: SupernetConfig,
        levels: tuple[Level, ...],
        level: int,
        exit_convs: int,
        seed: int | None = None,
    ) -> None:
        check_levels(config, levels)
        chosen = levels[level]
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            super().__init__(config, width_arch(config, chosen.width))
            stage, index = block_position(config, chosen.blocks)
            for j in range(len(self.stages)):
                keep = len(self.stages[j]) if j < stage else (index + 1 if j == stage else 0)
                self.stages[j] = nn.ModuleList(list(self.stages[j])[:keep])
            self.exit_blocks = tuple(lv.blocks for lv in levels[: level + 1])
            if chosen.blocks != total_blocks(config):
                del self.head
            _, outs, _ = config.channels(self.arch)
            early = [b for b in self.exit_blocks if b != total_blocks(config)]
            self.exits = nn.ModuleList(
                ExitHead(config, outs[block_position(config, b)[0]], exit_convs) for b in early
            )

    def exit_logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self._run(x, every_exit=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, every_exit=False)[-1]

    def _run(self, x: torch.Tensor, every_exit: bool) -> list[torch.Tensor]:
        x = self.stem(x)
        outputs: list[torch.Tensor] = []
        depth = 0
        deepest = self.exit_blocks[-1]
        for blocks in self.stages:
            for block in blocks:
                x = block(x)
                depth += 1
                if depth in self.exit_blocks and (every_exit or depth == deepest):
                    if depth == total_blocks(self.config):
                        outputs.append(self.head(x.mean(dim=(2, 3))))
                    else:
                        outputs.append(self.exits[self.exit_blocks.index(depth)](x))
        return outputs


@lru_cache(maxsize=64)
def level_shapes(
    config: SupernetConfig, levels: tuple[Level, ...], level: int, exit_convs: int
) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of a level (built on the meta device: no memory, no init)."""
    with torch.device("meta"):
        model = EarlyExitResNet(config, levels, level, exit_convs)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _prefix(config: SupernetConfig, arch: Arch, blocks: int) -> tuple[SupernetConfig, Arch]:
    """The substrate cut after ``blocks`` blocks, as a configuration of the family and its arch
    (the counter then counts the backbone plus a linear head at the cut)."""
    stage, index = block_position(config, blocks)
    n = stage + 1
    cut = config.with_overrides(
        stage_channels=config.stage_channels[:n], stage_strides=config.stage_strides[:n]
    )
    depths = (*arch.d[:stage], index)
    return cut, Arch(d=depths, e=arch.e[:n], w=arch.w[: n + 1])


def head_cost(config: SupernetConfig, channels: int, size: int, convs: int) -> Cost:
    """MACs and parameters of one exit head on ``channels`` maps of ``size`` x ``size``."""
    return Cost(
        macs=convs * 9 * channels * channels * size * size + channels * config.num_classes,
        params=convs * (9 * channels * channels + 2 * channels)
        + (channels + 1) * config.num_classes,
    )


@lru_cache(maxsize=64)
def level_cost(
    config: SupernetConfig, levels: tuple[Level, ...], level: int, exit_convs: int
) -> Cost:
    """Analytic per-example MACs and parameters of a level: its backbone and all of its exits."""
    check_levels(config, levels)
    chosen = levels[level]
    arch = width_arch(config, chosen.width)
    cut, cut_arch = _prefix(config, arch, chosen.blocks)
    backbone = count(cut, cut_arch)  # with a linear classifier at the cut, taken out below
    _, outs, _ = config.channels(arch)
    cut_stage = block_position(config, chosen.blocks)[0]
    linear = head_cost(config, outs[cut_stage], config.stage_sizes[cut_stage], 0)
    macs, params = backbone.macs - linear.macs, backbone.params - linear.params
    for lv in levels[: level + 1]:  # every exit of the level; the network's final head is linear
        stage = block_position(config, lv.blocks)[0]
        convs = 0 if lv.blocks == total_blocks(config) else exit_convs
        head = head_cost(config, outs[stage], config.stage_sizes[stage], convs)
        macs, params = macs + head.macs, params + head.params
    return Cost(macs=macs, params=params)


def level_model(
    config: SupernetConfig, level: int, exit_convs: int, seed: int | None = None
) -> EarlyExitResNet:
    """ScaleFL's model of one level (index into SCALEFL_LEVELS) on the substrate ``config``."""
    return EarlyExitResNet(config, SCALEFL_LEVELS, level, exit_convs, seed=seed)


def level_costs(config: SupernetConfig, exit_convs: int) -> list[Cost]:
    """Analytic MACs and parameters of every ScaleFL level, smallest first."""
    return [level_cost(config, SCALEFL_LEVELS, i, exit_convs) for i in range(len(SCALEFL_LEVELS))]


def affordable_level(costs: list[Cost], budget: float) -> tuple[int, bool]:
    """The largest level whose MACs fit ``budget``; the smallest when none does (and True)."""
    fitting = [i for i, cost in enumerate(costs) if cost.macs <= budget]
    return (fitting[-1], False) if fitting else (0, True)
