"""HeteroFL's settings (``heterofl.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, one_of, setting

#: Widths by budget, the authors' fixed equal proportions, or drawn anew each round.
HETEROFL_ASSIGNMENTS = ("budget", "proportion", "dynamic")


@dataclass(frozen=True)
class HeteroFLSettings(Section):
    name = "heterofl"

    assignment: str = setting(one_of(HETEROFL_ASSIGNMENTS))
