"""Ditto's settings (``ditto.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from fedapp.sections import Section, at_least, setting


@dataclass(frozen=True)
class DittoSettings(Section):
    name = "ditto"
    former_keys: ClassVar[Mapping[str, str]] = {"ditto-lambda": "lambda"}

    #: Proximal weight pulling each personal model towards the global one.
    lambda_: float = setting(at_least(0))
