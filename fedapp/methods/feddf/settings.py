"""FedDF's settings (``feddf.*``): the server's ensemble distillation on the public set."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from fedapp.sections import Section, at_least, positive, setting


@dataclass(frozen=True)
class FedDFSettings(Section):
    name = "feddf"
    former_keys: ClassVar[Mapping[str, str]] = {
        "distill-steps": "distill-steps",
        "distill-eval-every": "distill-eval-every",
        "distill-patience": "distill-patience",
        "distill-batch-size": "distill-batch-size",
        "distill-lr": "distill-lr",
        "distill-grad-clip": "distill-grad-clip",
        "kd-temperature": "kd-temperature",
    }

    distill_steps: int = setting(at_least(1))
    distill_eval_every: int = setting(at_least(1))
    distill_patience: int = setting(at_least(1))
    distill_batch_size: int = setting(at_least(1))
    distill_lr: float = setting(positive())
    distill_grad_clip: float = setting(positive())
    kd_temperature: float = setting(positive())
