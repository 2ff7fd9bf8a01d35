"""The elastic ResNet family: one skeleton, built from static or elastic layers.

``ResNet`` is a plain network of ``nn.Conv2d``, ``nn.BatchNorm2d`` and ``nn.Linear`` sized
exactly for one architecture (a static subnet). ``ElasticResNet`` is the same skeleton sized for an
upper bound (the whole supernet, or a client's routed envelope) whose layers run on leading slices
of their tensors, so ``activate(arch)`` switches architecture without copying anything. Both name
their tensors identically, and every tensor of a smaller model is the leading slice of the
same-named tensor of a larger one: ``state_shapes`` is therefore a complete description of any
sub-model, and routing, extraction and aggregation need nothing else.

Speed: a layer slices only when its active size differs from its tensor, and the input channel
count is read from the input, so an active architecture costs one ``if`` and a view per layer over
the static network. The backward of a slice writes into a gradient of the whole tensor; that cost
scales with the size of the model the layers belong to, which for a FEAST client is its routed
envelope, not the full supernet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import torch
import torch.nn.functional as F
from torch import nn

from fedapp.models.arch import Arch, SupernetConfig
from fedapp.models.slicing import leading_slice


class ElasticConv2d(nn.Conv2d):
    """Convolution on the leading ``active_out`` filters and the input's leading channels."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int) -> None:
        super().__init__(cin, cout, kernel, stride, padding=kernel // 2, bias=False)
        self.active_out = cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if self.active_out != weight.shape[0] or x.shape[1] != weight.shape[1]:
            weight = weight[: self.active_out, : x.shape[1]]
        return F.conv2d(x, weight, None, self.stride, self.padding)


class ElasticBatchNorm2d(nn.BatchNorm2d):
    """Batch norm on the leading channels of its affine parameters and running statistics."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        if c == self.num_features:
            return super().forward(x)
        factor = 0.0
        if self.training:
            self.num_batches_tracked.add_(1)
            factor = (
                1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            )
        # In-place updates of the running-stat views land in the supernet's buffers.
        return F.batch_norm(
            x,
            self.running_mean[:c],
            self.running_var[:c],
            self.weight[:c],
            self.bias[:c],
            self.training,
            factor,
            self.eps,
        )


class ElasticLinear(nn.Linear):
    """Linear head on the input's leading features (all classes are always active)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if x.shape[1] != weight.shape[1]:
            weight = weight[:, : x.shape[1]]
        return F.linear(x, weight, self.bias)


@dataclass(frozen=True)
class LayerKit:
    """Constructors for the three layer kinds, so one skeleton serves static and elastic nets."""

    conv: Callable[[int, int, int, int], nn.Module]
    bn: Callable[[int, float, float], nn.Module]
    linear: Callable[[int, int], nn.Module]


STATIC = LayerKit(
    conv=lambda cin, cout, k, s: nn.Conv2d(cin, cout, k, s, padding=k // 2, bias=False),
    bn=lambda c, eps, momentum: nn.BatchNorm2d(c, eps=eps, momentum=momentum),
    linear=nn.Linear,
)
ELASTIC = LayerKit(
    conv=ElasticConv2d,
    bn=lambda c, eps, momentum: ElasticBatchNorm2d(c, eps=eps, momentum=momentum),
    linear=ElasticLinear,
)


class Stem(nn.Module):
    def __init__(self, config: SupernetConfig, channels: int, kit: LayerKit) -> None:
        super().__init__()
        self.conv = kit.conv(config.in_channels, channels, config.stem_kernel, config.stem_stride)
        self.bn = kit.bn(channels, config.bn_eps, config.bn_momentum)
        self.pool = (
            nn.MaxPool2d(config.stem_pool, ceil_mode=True)
            if config.stem_pool > 1
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.bn(self.conv(x))))


class Projection(nn.Module):
    """Projecting shortcut of a stage's first block: a 1x1 conv and BN, reducing by the stride
    through an average pool before the conv (FEAST) or the conv's own stride (ResNet18)."""

    def __init__(self, config: SupernetConfig, cin: int, cout: int, stride: int, kit: LayerKit):
        super().__init__()
        pooled = config.shortcut == "projection" and stride > 1
        self.pool = nn.AvgPool2d(stride, ceil_mode=True) if pooled else nn.Identity()
        self.conv = kit.conv(cin, cout, 1, 1 if pooled else stride)
        self.bn = kit.bn(cout, config.bn_eps, config.bn_momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(self.pool(x)))


class Block(nn.Module):
    """Residual block: conv3x3 + BN + ReLU, conv3x3 + BN (+ ReLU in the FEAST authors' block),
    add the shortcut, ReLU."""

    def __init__(
        self,
        config: SupernetConfig,
        cin: int,
        mid: int,
        cout: int,
        stride: int,
        projected: bool,
        kit: LayerKit,
    ) -> None:
        super().__init__()
        self.conv1 = kit.conv(cin, mid, 3, stride)
        self.bn1 = kit.bn(mid, config.bn_eps, config.bn_momentum)
        self.conv2 = kit.conv(mid, cout, 3, 1)
        self.bn2 = kit.bn(cout, config.bn_eps, config.bn_momentum)
        self.shortcut = Projection(config, cin, cout, stride, kit) if projected else None
        self.relu_before_add = config.block == "feast-reference"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        if self.relu_before_add:
            out = F.relu(out)
        skip = x if self.shortcut is None else self.shortcut(x)
        return F.relu(out + skip)


class ResNet(nn.Module):
    """A network of the family sized exactly for ``arch`` (static layers unless ``kit`` says)."""

    def __init__(self, config: SupernetConfig, arch: Arch, kit: LayerKit = STATIC) -> None:
        super().__init__()
        self.config = config
        self.arch = config.validate(arch)
        stem, outs, mids = config.channels(self.arch)
        self.stem = Stem(config, stem, kit)
        stages = []
        cin = stem
        for j, (cout, mid, stride) in enumerate(zip(outs, mids, config.stage_strides, strict=True)):
            first = Block(config, cin, mid, cout, stride, config.projected[j], kit)
            rest = [Block(config, cout, mid, cout, 1, False, kit) for _ in range(self.arch.d[j])]
            blocks = [first, *rest]
            stages.append(nn.ModuleList(blocks))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.head = kit.linear(cin, config.num_classes)
        self.depths = [1 + d for d in self.arch.d]
        self._init_weights()

    def _init_weights(self) -> None:
        """Kaiming normal (fan-out) on convolutions, or leave the layers' own initialisation."""
        if self.config.init == "pytorch-default":
            return
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for blocks, depth in zip(self.stages, self.depths, strict=True):
            for block in islice(blocks, depth):
                x = block(x)
        return self.head(x.mean(dim=(2, 3)))


class ElasticResNet(ResNet):
    """Weight-sharing supernet (or routed sub-supernet) sized for ``bounds``.

    ``bounds`` defaults to the whole supernet; a FEAST client builds it with its routed envelope.
    ``seed`` makes the initial weights reproducible without touching the global RNG.
    """

    def __init__(
        self, config: SupernetConfig, bounds: Arch | None = None, seed: int | None = None
    ) -> None:
        bounds = config.max_arch() if bounds is None else bounds
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            super().__init__(config, bounds, ELASTIC)
        self.bounds = self.arch
        self.active = self.arch

    def fits(self, arch: Arch) -> bool:
        """Whether ``arch`` lies inside this network's bounds (width and depth per position)."""
        arch = self.config.validate(arch)
        return all(a <= b for a, b in zip(arch.d, self.bounds.d, strict=True)) and all(
            a <= b for a, b in zip(arch.w, self.bounds.w, strict=True)
        )

    def activate(self, arch: Arch) -> None:
        """Run ``arch`` from now on: set active depths and output channels of every layer."""
        arch = self.config.validate(arch)
        if not self.fits(arch):
            raise ValueError(f"architecture {arch} does not fit inside the bounds {self.bounds}")
        stem, outs, mids = self.config.channels(arch)
        self.stem.conv.active_out = stem
        for blocks, cout, mid in zip(self.stages, outs, mids, strict=True):
            for block in blocks:
                block.conv1.active_out = mid
                block.conv2.active_out = cout
                if block.shortcut is not None:
                    block.shortcut.conv.active_out = cout
        self.depths = [1 + d for d in arch.d]
        self.active = arch

    @torch.no_grad()
    def subnet(self, arch: Arch) -> ResNet:
        """A static network for ``arch`` holding copies of the leading slices of this one."""
        if not self.fits(arch):
            raise ValueError(f"architecture {arch} does not fit inside the bounds {self.bounds}")
        static = ResNet(self.config, arch)
        source = self.state_dict()
        static.load_state_dict(
            {name: source[name][leading_slice(t.shape)] for name, t in static.state_dict().items()}
        )
        return static.train(self.training)


def state_shapes(config: SupernetConfig, arch: Arch) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor (parameters and buffers) of the network sized for ``arch``.

    Equal to ``{k: tuple(v.shape) for k, v in ResNet(config, arch).state_dict().items()}`` without
    building anything; routing sends exactly these leading slices.
    """
    arch = config.validate(arch)
    stem, outs, mids = config.channels(arch)
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(prefix: str, cout: int, cin: int, k: int) -> None:
        shapes[f"{prefix}.weight"] = (cout, cin, k, k)

    def bn(prefix: str, c: int) -> None:
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.{leaf}"] = (c,)
        shapes[f"{prefix}.num_batches_tracked"] = ()

    conv("stem.conv", stem, config.in_channels, config.stem_kernel)
    bn("stem.bn", stem)
    cin = stem
    for j, (cout, mid) in enumerate(zip(outs, mids, strict=True)):
        for b in range(1 + arch.d[j]):
            prefix = f"stages.{j}.{b}"
            conv(f"{prefix}.conv1", mid, cin if b == 0 else cout, 3)
            bn(f"{prefix}.bn1", mid)
            conv(f"{prefix}.conv2", cout, mid, 3)
            bn(f"{prefix}.bn2", cout)
            if b == 0 and config.projected[j]:
                conv(f"{prefix}.shortcut.conv", cout, cin, 1)
                bn(f"{prefix}.shortcut.bn", cout)
        cin = cout
    shapes["head.weight"] = (config.num_classes, cin)
    shapes["head.bias"] = (config.num_classes,)
    return shapes
