"""HeteroFL's settings (``heterofl.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from fedapp.sections import Section, one_of, setting

#: Widths by budget, the authors' fixed equal proportions, or drawn anew each round.
HETEROFL_ASSIGNMENTS = ("budget", "proportion", "dynamic")


@dataclass(frozen=True)
class HeteroFLSettings(Section):
    name = "heterofl"
    former_keys: ClassVar[Mapping[str, str]] = {"heterofl-assignment": "assignment"}

    assignment: str = setting(one_of(HETEROFL_ASSIGNMENTS))
