"""Budget-tailored routing (FEAST): affordable set, envelope, sub-supernet shapes.

A client with budget ``b`` can run every cached variant with ``MACs <= b``; its routed
sub-supernet is the envelope of those variants: per stage the largest depth, per position the
largest width, and middle channels sized for the largest expansion at that width. Every tensor of
the sub-supernet is the leading slice of the global tensor with the same name, so the map back to
global tensors (the paper's Omega_i) is just ``shapes``: name -> slice shape. ``slicing.extract``
cuts the payload with it and ``slicing.SliceAccumulator`` folds the reply back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedapp.models.arch import Arch, SupernetConfig
from fedapp.models.budgets import BudgetError
from fedapp.models.cache import VariantCache
from fedapp.models.counter import count
from fedapp.models.elastic_resnet import state_shapes


def affordable(cache: VariantCache, budget: float) -> list[int]:
    """Indices of the cached variants whose (nominal) MACs fit ``budget`` (cheapest first)."""
    indices = [i for i, v in enumerate(cache.variants) if v.nominal_macs <= budget]
    if not indices:
        raise BudgetError(
            f"budget {budget:,.0f} MACs is below the smallest cached variant "
            f"({cache.min_macs:,} MACs)"
        )
    return indices


def envelope(config: SupernetConfig, archs: Sequence[Arch]) -> Arch:
    """The smallest sub-supernet that contains every architecture in ``archs``."""
    if not archs:
        raise ValueError("the envelope of no architectures is undefined")
    archs = [config.validate(a) for a in archs]
    s = config.num_stages
    return Arch(
        d=tuple(max(a.d[j] for a in archs) for j in range(s)),
        e=(config.expand_ratios[-1],) * s,
        w=tuple(max(a.w[j] for a in archs) for j in range(s + 1)),
    )


@dataclass(frozen=True)
class Route:
    """What one client receives for its budget."""

    budget: float
    affordable: tuple[int, ...]  # cache indices, cheapest first
    envelope: Arch
    shapes: dict[str, tuple[int, ...]]  # local tensor -> leading slice of the same global tensor
    params: int  # trainable parameters of the envelope (what the paper's payload counts)

    @property
    def largest(self) -> int:
        """Cache index of the largest affordable variant (the client's served model)."""
        return self.affordable[-1]


def route(cache: VariantCache, budget: float) -> Route:
    """Affordable set, envelope and sub-supernet shapes for a client budget."""
    indices = affordable(cache, budget)
    env = envelope(cache.config, [cache.variants[i].arch for i in indices])
    return Route(
        budget=float(budget),
        affordable=tuple(indices),
        envelope=env,
        shapes=state_shapes(cache.config, env),
        params=count(cache.config, env).params,
    )
