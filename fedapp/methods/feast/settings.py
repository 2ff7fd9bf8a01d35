"""FEAST's co-training settings (``feast.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, fraction, one_of, setting

#: FEAST's training rule and its ablations (paper Table 6): which variants train per mini-batch.
TRAINING_RULES = ("full", "min-max-kd", "min-max", "max", "min")


@dataclass(frozen=True)
class FeastSettings(Section):
    name = "feast"

    training_rule: str = setting(one_of(TRAINING_RULES))
    #: rho_kd: weight of the distillation from the client's largest variant.
    kd_weight: float = setting(fraction(False, 1, False))
    #: Send each client only the routed slice covering its affordable variants (false: the
    #: whole supernet).
    routing: bool = setting()
