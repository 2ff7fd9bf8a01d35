"""FIARSE's settings (``fiarse.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.models.masks import MEASURES, TOPK_RULES
from fedapp.sections import Section, at_least, one_of, setting


@dataclass(frozen=True)
class FiarseSettings(Section):
    name = "fiarse"

    grid_points: int = setting(at_least(2))
    budget: str = setting(one_of(MEASURES))
    topk: str = setting(one_of(TOPK_RULES))
