"""FedKD-NAS's settings (``fedkd-nas.*``): the client NAS controller, the public-set
distillation and the server's teacher and fusion. Local-KD, its ablation, reads them too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedapp.models.zoo import model_names
from fedapp.sections import Section, at_least, fraction, one_of, positive, setting
from fedapp.training.logit_fusion import LOGIT_AGGREGATIONS

#: Score candidates on a private hold-out (its labels) or on a public hold-out against the
#: broadcast target (Z~ or P_T; the global distribution).
NAS_SCORE_SETS = ("private", "public")


@dataclass(frozen=True)
class FedKDNASSettings(Section):
    name = "fedkd-nas"

    # the client's NAS controller
    lambda_: float = setting(at_least(0))
    margin: float = setting(at_least(0))
    keep: int = setting(at_least(1))
    holdout: float = setting(fraction(True, 0.5, False))
    memory_mb: float = setting(at_least(0))
    duel_every: int = setting(at_least(0))
    warmup_steps: int = setting(at_least(0))
    score_on: str = setting(one_of(NAS_SCORE_SETS))
    public_holdout: float = setting(fraction(True, 0.5, False))
    # the client's distillation on the public set
    kd_weight: float = setting(at_least(0))
    kd_temperature: float = setting(positive())
    kd_steps: int = setting(at_least(0))
    # the server's teacher and logit fusion
    teacher_beta: float = setting(fraction(False, 1, False))
    ema_gamma: float = setting(fraction(False, 1, True))
    logit_aggregation: str = setting(one_of(LOGIT_AGGREGATIONS))
    trim_fraction: float = setting(fraction(False, 0.5, True))
    teacher_epochs: int = setting(at_least(0))
    teacher_model: str = setting(
        (
            lambda v: v == "" or v in model_names(),
            lambda: (
                "empty (the family's largest candidate) or a model name: "
                + ", ".join(model_names())
            ),
        )
    )
    teacher_folds: int = setting(at_least(1))

    def cross_checks(self, strategy: str, run: Mapping[str, Any]) -> list[str]:
        problems = []
        public = run["public-size"]
        if self.teacher_folds > max(public, 1):
            problems.append(
                f"'fedkd-nas.teacher-folds' = {self.teacher_folds} is larger than 'public-size' "
                f"= {public}: every fold needs at least one public image, so allowed is 1 to "
                "public-size"
            )
        if self.score_on == "public" and self.teacher_beta == 0:
            problems.append(
                "'fedkd-nas.score-on' = 'public' (the default) scores candidates against the "
                "teacher's or the fused logits, but 'fedkd-nas.teacher-beta' = 0 sends none in "
                "round 1 (none ever to Local-KD): set teacher-beta > 0 or score-on = 'private'"
            )
        return problems
