"""The run's FEAST model space: the supernet sized for the data set, its variant cache, routes.

Server and clients build it from the run's keys alone, so both derive identical tensor shapes
(and MACs, recounted for the data set's input size and classes) without exchanging them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from fedapp.data.registry import DatasetInfo
from fedapp.models.arch import SupernetConfig, load_supernet
from fedapp.models.cache import VariantCache, load_cache
from fedapp.models.counter import count
from fedapp.models.routing import Route, route
from fedapp.run.config import ConfigError
from fedapp.run.pieces import FeastSpaceSpec

#: Anchors validated each evaluation round when the run config names none.
DEFAULT_ANCHORS = 5


@dataclass
class ModelSpace:
    """Supernet configuration, cache of operating points, and memoised routes by budget."""

    config: SupernetConfig
    cache: VariantCache
    full_params: int
    _routes: dict[float, Route] = field(default_factory=dict, repr=False)

    def route(self, budget: float) -> Route:
        """The routed envelope of a budget (BudgetError below the smallest variant)."""
        if budget not in self._routes:
            self._routes[budget] = route(self.cache, budget)
        return self._routes[budget]

    def anchors(self, spec: str) -> list[int]:
        """Cache indices validated every evaluation round: listed, or evenly spaced."""
        if spec:
            indices = sorted({int(p) for p in spec.split(",")})
            if indices[-1] >= len(self.cache):
                raise ConfigError(
                    f"run config 'feast-space.anchor-variants' = {spec!r}: the cache has only "
                    f"{len(self.cache)} variants (indices 0..{len(self.cache) - 1})"
                )
            return indices
        count_ = min(DEFAULT_ANCHORS, len(self.cache))
        return sorted({round(float(x)) for x in np.linspace(0, len(self.cache) - 1, count_)})


@lru_cache(maxsize=4)
def _space(supernet: str, cache: str, info: DatasetInfo) -> ModelSpace:
    config = load_supernet(
        supernet,
        in_channels=info.channels,
        image_size=info.image_size,
        num_classes=info.num_classes,
    )
    variants = load_cache(cache, config=config)
    return ModelSpace(config, variants, count(config, config.max_arch()).params)


def model_space(spec: FeastSpaceSpec, info: DatasetInfo) -> ModelSpace:
    """The FEAST model space of a run; ConfigError where a budget could fall below the cache's
    smallest variant (the budget floor these methods declare: a client below it could train
    nothing)."""
    space = _space(spec.supernet, spec.variant_cache, info)
    smallest = space.cache.min_macs
    if max(spec.budget_min, spec.budget_floor) < smallest:
        raise ConfigError(
            f"run config 'budget-min' = {spec.budget_min:,.0f} MACs (with 'budget-floor' = "
            f"{spec.budget_floor:,.0f}) lets budgets fall below the smallest variant of cache "
            f"'{spec.variant_cache}' ({smallest:,} MACs on {info.name}): no client there could "
            f"train anything; set budget-min or budget-floor >= {smallest}"
        )
    space.anchors(spec.anchor_variants)
    return space
