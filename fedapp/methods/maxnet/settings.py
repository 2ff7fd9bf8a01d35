"""The SuperFedNAS / DeepFedNAS transfers' settings (``maxnet.*``): both train the FEAST
supernet with MaxNet weighting and differ in how the server samples subnets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedapp.sections import Section, fraction, one_of, setting

#: Draw subnets from the whole space or the affordable set; ``feast-transfer``: the FEAST
#: authors' SuperFedNAS transfer (global min, best-of-20 max).
SUBNET_SAMPLINGS = ("budget-constrained", "unconstrained", "feast-transfer")


@dataclass(frozen=True)
class MaxNetSettings(Section):
    name = "maxnet"

    subnet_sampling: str = setting(one_of(SUBNET_SAMPLINGS))
    decay_fraction: float = setting(fraction(True, 1, False))
    weight_examples: bool = setting()

    def cross_checks(self, strategy: str, run: Mapping[str, Any]) -> list[str]:
        if self.subnet_sampling == "feast-transfer" and strategy == "deepfednas":
            return [
                "'maxnet.subnet-sampling' = 'feast-transfer' is the FEAST authors' SuperFedNAS "
                "sampler (random architectures of the whole space); DeepFedNAS samples its "
                "cached path: use 'budget-constrained' or 'unconstrained'"
            ]
        return []
