"""The toy method's run-config section, ``[tool.flwr.app.config.toy]``."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, at_least, fraction, setting


@dataclass(frozen=True)
class ToySettings(Section):
    name = "toy"

    server_lr: float = setting(fraction(True, 1, False))
    client_epochs: int = setting(at_least(1))
