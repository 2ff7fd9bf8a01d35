"""ScaleFL's settings (``scalefl.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, at_least, one_of, positive, setting

#: Self-distillation as in the authors' code, or as in the FEAST authors' port.
SCALEFL_KD_FORMS = ("official", "feast")


@dataclass(frozen=True)
class ScaleFLSettings(Section):
    name = "scalefl"

    exit_convs: int = setting(at_least(0))
    #: gamma: weight of the self-distillation between exits (0: cross-entropy at every exit).
    kd_weight: float = setting(at_least(0))
    kd_temperature: float = setting(positive())
    kd_form: str = setting(one_of(SCALEFL_KD_FORMS))
