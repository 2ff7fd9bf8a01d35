"""Architectures of the elastic ResNet family and the channel arithmetic they share.

An architecture is ``a = (d[S], e[S], w[S+1])``: extra blocks per stage, expansion ratio per stage
and a width-multiplier index for the stem and each stage (S = 4 for every FEAST supernet). The
supernet configuration comes from YAML (``conf/supernets/<name>.yaml``) so the canonical CIFAR-100
network, the TinyImageNet variant and the small CPU network differ only in data, not in code.
Everything that depends on channel counts (the model, the counter, the GA, routing) reads them from
the lookup tables built here, so the rounding rules live in exactly one place.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

#: Where named supernet configurations live (``conf/supernets`` at the repository root).
SUPERNETS_DIR = Path(__file__).resolve().parents[2] / "conf" / "supernets"
#: Where named variant caches of a supernet live (``conf/caches``; fedapp.models.cache reads them).
CACHES_DIR = Path(__file__).resolve().parents[2] / "conf" / "caches"


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Nearest multiple of ``divisor`` (half up), never below ``min_value`` (default: divisor),
    bumped by one divisor when rounding lost more than 10 % of ``value``."""
    floor = divisor if min_value is None else min_value
    rounded = max(floor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def round_channels(value: float, rule: str, divisor: int) -> int:
    """Channels of a scaled layer by the configuration's rule.

    ``divisible``: FEAST/OFA's :func:`make_divisible`; ``ceil``: HeteroFL's and ScaleFL's
    ``ceil(multiplier x channels)`` with no divisor (the product is rounded to 9 decimals first so
    that float noise such as 0.6 x 5 = 3.0000000000000004 does not add a channel).
    """
    if rule == "ceil":
        return max(1, math.ceil(round(value, 9)))
    return make_divisible(value, divisor)


#: Channel rounding rules a supernet configuration may name (see :func:`round_channels`).
CHANNEL_ROUNDING = ("divisible", "ceil")
#: Shortcut styles: ``projection`` = AvgPool + 1x1 conv + BN in every stage's first block (FEAST);
#: ``identity`` = identity unless the stride or the channel count changes, then a strided 1x1 conv
#: + BN (ResNet18 as in HeteroFL and ScaleFL).
SHORTCUTS = ("projection", "identity")
#: Residual blocks: ``resnet`` = conv-BN-ReLU, conv-BN, add the shortcut, ReLU (ResNet's
#: BasicBlock); ``feast-reference`` = the FEAST authors' block, which also applies a ReLU after
#: the second BN, before the add.
BLOCKS = ("resnet", "feast-reference")
#: Middle channels of a block from ``out * e``: ``product`` = the channel rule applied to the
#: product (the FEAST authors' MAC counter); ``rounded-product`` = to the product rounded to an
#: integer first (what the FEAST authors' networks build).
MID_ROUNDINGS = ("product", "rounded-product")
#: Weight initialisation: ``kaiming-fan-out`` = Kaiming normal (fan-out) on every convolution;
#: ``pytorch-default`` = the layers' own initialisation (what the FEAST authors keep).
INITS = ("kaiming-fan-out", "pytorch-default")


def ceil_div(size: int, stride: int) -> int:
    """Spatial size after a stride: 3x3 convs with padding 1 and ceil-mode pooling agree on it."""
    return -(-size // stride)


@dataclass(frozen=True)
class Arch:
    """One architecture: extra blocks ``d``, expansion ratios ``e`` and width indices ``w``."""

    d: tuple[int, ...]
    e: tuple[float, ...]
    w: tuple[int, ...]

    def __str__(self) -> str:
        return (
            f"d={','.join(map(str, self.d))} "
            f"e={','.join(f'{x:g}' for x in self.e)} "
            f"w={','.join(map(str, self.w))}"
        )

    def as_dict(self) -> dict[str, list[Any]]:
        return {"d": list(self.d), "e": list(self.e), "w": list(self.w)}


_ARCH_PART = re.compile(r"^\s*([dew])\s*=\s*\[?([0-9.,\s]+?)\]?\s*$")


def parse_arch(text: str) -> Arch:
    """Parse ``"d=3,7,6,7 e=0.18,0.18,0.1,0.1 w=2,0,0,0,0"`` (';' may separate the parts)."""
    parts: dict[str, list[str]] = {}
    for chunk in re.split(r"[;\s]+(?=[dew]\s*=)", text.strip()):
        match = _ARCH_PART.match(chunk)
        if not match:
            raise ValueError(
                f"cannot parse architecture part {chunk!r} (expected e.g. 'd=3,7,6,7')"
            )
        parts[match.group(1)] = [v for v in re.split(r"[,\s]+", match.group(2).strip()) if v]
    missing = sorted({"d", "e", "w"} - parts.keys())
    if missing:
        raise ValueError(f"architecture {text!r} lacks {', '.join(missing)}")
    try:
        return Arch(
            d=tuple(int(v) for v in parts["d"]),
            e=tuple(float(v) for v in parts["e"]),
            w=tuple(int(v) for v in parts["w"]),
        )
    except ValueError as err:
        raise ValueError(f"architecture {text!r}: {err}") from None


@dataclass(frozen=True)
class SupernetConfig:
    """Everything that fixes the shape of one elastic ResNet supernet."""

    name: str
    in_channels: int
    image_size: int
    num_classes: int
    stem_channels: int
    stage_channels: tuple[int, ...]
    stage_strides: tuple[int, ...]
    max_extra_blocks: int
    width_multipliers: tuple[float, ...]
    expand_ratios: tuple[float, ...]
    stem_kernel: int = 3
    stem_stride: int = 1
    stem_pool: int = 1
    divisor: int = 8
    channel_rounding: str = "divisible"
    shortcut: str = "projection"
    block: str = "resnet"
    mid_rounding: str = "product"
    #: The rule behind published MAC figures for this supernet (a cache's ``nominal_macs``);
    #: empty: the built rule, so nominal and built MACs are the same.
    nominal_mid_rounding: str = ""
    init: str = "kaiming-fan-out"
    bn_momentum: float = 0.1
    bn_eps: float = 1e-5
    #: Free-form notes from the YAML (e.g. which data set the configuration is meant for).
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("in_channels", "image_size", "num_classes", "stem_channels", "stem_kernel"):
            if getattr(self, name) < 1:
                raise ValueError(f"supernet {self.name}: {name} must be positive")
        if self.stem_kernel % 2 == 0:
            raise ValueError(f"supernet {self.name}: stem_kernel must be odd")
        if len(self.stage_channels) != len(self.stage_strides) or not self.stage_channels:
            raise ValueError(f"supernet {self.name}: stage_channels and stage_strides differ")
        if self.max_extra_blocks < 0:
            raise ValueError(f"supernet {self.name}: max_extra_blocks must be >= 0")
        if self.channel_rounding not in CHANNEL_ROUNDING:
            raise ValueError(
                f"supernet {self.name}: channel_rounding must be one of {CHANNEL_ROUNDING}"
            )
        if self.shortcut not in SHORTCUTS:
            raise ValueError(f"supernet {self.name}: shortcut must be one of {SHORTCUTS}")
        for name, allowed in (
            ("block", BLOCKS),
            ("mid_rounding", MID_ROUNDINGS),
            ("nominal_mid_rounding", ("", *MID_ROUNDINGS)),
            ("init", INITS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"supernet {self.name}: {name} = {getattr(self, name)!r} is not one of "
                    + ", ".join(repr(a) for a in allowed)
                )
        for name in ("width_multipliers", "expand_ratios"):
            values = getattr(self, name)
            if not values or list(values) != sorted(set(values)) or values[0] <= 0:
                raise ValueError(f"supernet {self.name}: {name} must be increasing and positive")

    # ---- sizes --------------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stage_channels)

    @property
    def stem_conv_size(self) -> int:
        """Spatial size at the stem convolution's output (where its MACs are spent)."""
        return ceil_div(self.image_size, self.stem_stride)

    @cached_property
    def stage_sizes(self) -> tuple[int, ...]:
        """Spatial output size of every stage."""
        size = ceil_div(self.stem_conv_size, self.stem_pool)
        sizes = []
        for stride in self.stage_strides:
            size = ceil_div(size, stride)
            sizes.append(size)
        return tuple(sizes)

    # ---- channel tables (rows: stem then stages; columns: width index) ------------------------
    @cached_property
    def channel_table(self) -> np.ndarray:
        """``[position, w_index] -> channels`` for the stem (row 0) and each stage."""
        bases = (self.stem_channels, *self.stage_channels)
        multipliers = self.width_multipliers
        return np.array(
            [
                [round_channels(b * m, self.channel_rounding, self.divisor) for m in multipliers]
                for b in bases
            ],
            dtype=np.int64,
        )

    @cached_property
    def mid_table(self) -> np.ndarray:
        """``[stage, w_index, e_index] -> middle channels`` of a block at that width/expansion.

        ``mid_rounding`` says whether the channel rule sees ``out * e`` as it is (the FEAST
        authors' counter, and so the paper's MAC axis) or rounded to an integer first (their
        networks); the two differ in 31 of the 56 reference-cache rows. A ResNet BasicBlock is
        the family's block at expansion 1 (middle = output channels).
        """
        out = self.channel_table[1:]
        first = round if self.mid_rounding == "rounded-product" else float
        return np.array(
            [
                [
                    [
                        round_channels(first(int(c) * e), self.channel_rounding, self.divisor)
                        for e in self.expand_ratios
                    ]
                    for c in row
                ]
                for row in out
            ],
            dtype=np.int64,
        )

    def nominal(self) -> SupernetConfig:
        """This supernet as its published MAC figures count it (itself if they count the build)."""
        rule = self.nominal_mid_rounding or self.mid_rounding
        return self if rule == self.mid_rounding else replace(self, mid_rounding=rule)

    @cached_property
    def projected(self) -> tuple[bool, ...]:
        """Per stage: whether its first block's shortcut is a 1x1 projection (else identity).

        Decided on the full-width channels, so every sub-model has the same layers; an identity
        shortcut then needs equal widths on both of its ends (see :meth:`validate`).
        """
        if self.shortcut == "projection":
            return (True,) * self.num_stages
        ins = (self.stem_channels, *self.stage_channels[:-1])
        return tuple(
            stride != 1 or cin != cout
            for cin, cout, stride in zip(ins, self.stage_channels, self.stage_strides, strict=True)
        )

    # ---- architectures -------------------------------------------------------------------------
    @property
    def num_genes(self) -> int:
        """Length of the integer encoding (d, e-index, w-index) used by the GA."""
        return 3 * self.num_stages + 1

    @cached_property
    def gene_high(self) -> np.ndarray:
        """Exclusive upper bound of every gene."""
        s = self.num_stages
        return np.array(
            [self.max_extra_blocks + 1] * s
            + [len(self.expand_ratios)] * s
            + [len(self.width_multipliers)] * (s + 1),
            dtype=np.int64,
        )

    def max_arch(self) -> Arch:
        """The whole supernet: deepest, widest, largest expansion."""
        s = self.num_stages
        return Arch(
            d=(self.max_extra_blocks,) * s,
            e=(self.expand_ratios[-1],) * s,
            w=(len(self.width_multipliers) - 1,) * (s + 1),
        )

    def expand_index(self, ratio: float) -> int:
        """Index of an expansion ratio in this supernet's choices (tolerant to float noise)."""
        for i, choice in enumerate(self.expand_ratios):
            if math.isclose(ratio, choice, rel_tol=0, abs_tol=1e-6):
                return i
        choices = ", ".join(f"{x:g}" for x in self.expand_ratios)
        raise ValueError(f"expansion ratio {ratio:g} is not one of {choices}")

    def validate(self, arch: Arch) -> Arch:
        """Check an architecture against this supernet; return it with canonical e values."""
        s = self.num_stages
        if (len(arch.d), len(arch.e), len(arch.w)) != (s, s, s + 1):
            raise ValueError(
                f"architecture {arch} needs {s} depths, {s} expansions and {s + 1} width indices"
            )
        if any(not 0 <= x <= self.max_extra_blocks for x in arch.d):
            raise ValueError(f"depths {list(arch.d)} must lie in 0..{self.max_extra_blocks}")
        top = len(self.width_multipliers) - 1
        if any(not 0 <= x <= top for x in arch.w):
            raise ValueError(f"width indices {list(arch.w)} must lie in 0..{top}")
        for j, projected in enumerate(self.projected):
            if not projected and arch.w[j] != arch.w[j + 1]:
                raise ValueError(
                    f"width indices {list(arch.w)}: stage {j} starts with an identity shortcut, "
                    f"so its width index must equal the one before it"
                )
        e = tuple(self.expand_ratios[self.expand_index(x)] for x in arch.e)
        return Arch(d=tuple(int(x) for x in arch.d), e=e, w=tuple(int(x) for x in arch.w))

    def genes(self, arch: Arch) -> np.ndarray:
        """Integer encoding of an architecture: ``[d..., e_index..., w_index...]``."""
        arch = self.validate(arch)
        return np.array([*arch.d, *(self.expand_index(x) for x in arch.e), *arch.w], dtype=np.int64)

    def arch_from_genes(self, genes: np.ndarray) -> Arch:
        """Inverse of :meth:`genes`."""
        s = self.num_stages
        g = [int(x) for x in genes]
        return Arch(
            d=tuple(g[:s]),
            e=tuple(self.expand_ratios[i] for i in g[s : 2 * s]),
            w=tuple(g[2 * s :]),
        )

    def channels(self, arch: Arch) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """(stem channels, stage output channels, stage middle channels) of an architecture."""
        g = self.genes(arch)
        s = self.num_stages
        e_idx, w_idx = g[s : 2 * s], g[2 * s :]
        stem = int(self.channel_table[0, w_idx[0]])
        outs = tuple(int(self.channel_table[j + 1, w_idx[j + 1]]) for j in range(s))
        mids = tuple(int(self.mid_table[j, w_idx[j + 1], e_idx[j]]) for j in range(s))
        return stem, outs, mids

    def with_overrides(self, **overrides: Any) -> SupernetConfig:
        """A copy with some fields replaced (e.g. ``num_classes``, ``image_size``)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown supernet field(s): {', '.join(unknown)}")
        return replace(self, **{k: _coerce(k, v) for k, v in overrides.items()})


_TUPLE_FIELDS = {"stage_channels", "stage_strides", "width_multipliers", "expand_ratios"}


def _coerce(name: str, value: Any) -> Any:
    return tuple(value) if name in _TUPLE_FIELDS else value


def yaml_names(folder: Path) -> tuple[str, ...]:
    """Names (file stems) of the YAML files in a configuration folder, sorted."""
    return tuple(sorted(p.stem for p in folder.glob("*.yaml")))


def named_yaml(name_or_path: str | Path, folder: Path, kind: str) -> Path:
    """A YAML file given by path, or by name (no suffix) in ``folder``; errors list the names."""
    path = Path(name_or_path)
    if not path.suffix:
        path = folder / f"{name_or_path}.yaml"
    if not path.is_file():
        known = yaml_names(folder)
        raise ValueError(f"no {kind} {str(name_or_path)!r} (known: {', '.join(known)})")
    return path


def load_supernet(name_or_path: str | Path, **overrides: Any) -> SupernetConfig:
    """Load a supernet configuration by name (``conf/supernets/<name>.yaml``) or by file path.

    ``overrides`` replace fields, e.g. ``num_classes=10`` or ``image_size=8`` for a data set with
    other dimensions than the YAML's default.
    """
    path = named_yaml(name_or_path, SUPERNETS_DIR, "supernet")
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a supernet file must be a mapping")
    raw.setdefault("name", path.stem)
    known_fields = {f.name for f in fields(SupernetConfig)}
    unknown = sorted(set(raw) - known_fields)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}")
    try:
        config = SupernetConfig(**{k: _coerce(k, v) for k, v in raw.items()})
    except TypeError as err:
        raise ValueError(f"{path}: {err}") from None
    return config.with_overrides(**overrides) if overrides else config
