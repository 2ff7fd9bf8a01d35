"""FIARSE's settings (``fiarse.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from fedapp.models.masks import MEASURES, TOPK_RULES
from fedapp.sections import Section, at_least, one_of, setting


@dataclass(frozen=True)
class FiarseSettings(Section):
    name = "fiarse"
    former_keys: ClassVar[Mapping[str, str]] = {
        "fiarse-grid-points": "grid-points",
        "fiarse-budget": "budget",
        "fiarse-topk": "topk",
    }

    grid_points: int = setting(at_least(2))
    budget: str = setting(one_of(MEASURES))
    topk: str = setting(one_of(TOPK_RULES))
