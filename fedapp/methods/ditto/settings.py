"""Ditto's settings (``ditto.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, at_least, setting


@dataclass(frozen=True)
class DittoSettings(Section):
    name = "ditto"

    #: Proximal weight pulling each personal model towards the global one.
    lambda_: float = setting(at_least(0))
