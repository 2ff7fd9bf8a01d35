"""FedDF's settings (``feddf.*``): the server's ensemble distillation on the public set."""

from __future__ import annotations

from dataclasses import dataclass

from fedapp.sections import Section, at_least, positive, setting


@dataclass(frozen=True)
class FedDFSettings(Section):
    name = "feddf"

    distill_steps: int = setting(at_least(1))
    distill_eval_every: int = setting(at_least(1))
    distill_patience: int = setting(at_least(1))
    distill_batch_size: int = setting(at_least(1))
    distill_lr: float = setting(positive())
    distill_grad_clip: float = setting(positive())
    kd_temperature: float = setting(positive())
