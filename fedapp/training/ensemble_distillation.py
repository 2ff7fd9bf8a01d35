"""FedDF's server-side ensemble distillation (Lin et al., NeurIPS 2020; AVGLOGITS scheme).

The teacher is the mean of the logits of ALL models received in the round (all architectures),
on the server's unlabeled public images; each prototype's student starts from its FedAvg model
and follows the teacher with KL(softmax(teacher / T) || softmax(student / T)), Adam with a cosine
schedule stepped per batch, and gradient clipping. The student is validated every few steps on
labelled server-held data; distillation stops when ``patience`` steps brought no better
validation accuracy and returns the best student seen, the FedAvg start included (so
distillation never makes a prototype worse on validation).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.training.distillation import endless, kd_loss, predict_logits, target_loader


@dataclass(frozen=True)
class DistillSettings:
    """The knobs of one distillation (run-config keys distill-*)."""

    steps: int
    eval_every: int
    patience: int
    batch_size: int
    lr: float
    grad_clip: float
    temperature: float


@dataclass(frozen=True)
class DistillOutcome:
    """What a distillation did: steps taken and where its best validation was."""

    steps_run: int
    best_step: int  # 0: the starting (FedAvg) model stayed the best
    start_accuracy: float
    best_accuracy: float
    stopped_early: bool


def ensemble_logits(
    models: Sequence[nn.Module], images: ImageArrays, info: DatasetInfo, device: torch.device
) -> np.ndarray:
    """AVGLOGITS teacher: the uniform mean of every model's logits on the images, (M, C)."""
    if not models:
        raise ValueError("an ensemble needs at least one model")
    return np.mean([predict_logits(m, images, info, device) for m in models], axis=0)


def distil(
    student: nn.Module,
    images: ImageArrays,
    teacher: np.ndarray,
    info: DatasetInfo,
    settings: DistillSettings,
    validate: Callable[[nn.Module], float],
    generator: torch.Generator,
    device: torch.device,
) -> DistillOutcome:
    """Distil ``teacher`` logits into ``student`` in place; it ends holding its best-on-
    validation weights. ``validate`` returns the student's validation accuracy (higher is
    better); it is called at step 0 and every ``eval_every`` steps."""
    student.to(device)
    batches = endless(
        target_loader(images, teacher, info, settings.batch_size, generator, augment=False)
    )
    optimizer = torch.optim.Adam(student.parameters(), lr=settings.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=settings.steps)
    start = best = validate(student)
    best_step, best_state = 0, copy.deepcopy(student.state_dict())
    step = 0
    while step < settings.steps:
        student.train()
        x, target = next(batches)
        x, target = x.to(device), target.to(device)
        optimizer.zero_grad(set_to_none=True)
        kd_loss(student(x), target, settings.temperature).backward()
        nn.utils.clip_grad_norm_(student.parameters(), settings.grad_clip)
        optimizer.step()
        schedule.step()
        step += 1
        if step % settings.eval_every == 0 or step == settings.steps:
            accuracy = validate(student)
            if accuracy > best:
                best, best_step, best_state = accuracy, step, copy.deepcopy(student.state_dict())
            elif step - best_step >= settings.patience:
                break
    student.load_state_dict(best_state)
    return DistillOutcome(step, best_step, start, best, step < settings.steps)
