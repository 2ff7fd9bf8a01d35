"""ScaleFL client (Ilhan, Su, Liu, CVPR 2023): one depth-width level with early exits, trained on
cross-entropy at every exit plus self-distillation from the level's deepest exit.

The loss is the reference ``KDLoss`` weighting: exit j of L (1-based) weighs j, the deepest exit
weighs L and carries only its cross-entropy, and the sum is divided by L(L+1)/2. Each shallower
exit adds ``gamma * T^2 * KL(softmax(z_L / T) || softmax(z_j / T))`` averaged over batch and
classes (``nn.KLDivLoss()``'s default 'mean'), with the teacher NOT detached, so the distillation
gradient also reaches the deepest exit. Distillation switches on after a quarter of the rounds.
``scalefl.kd-form = "feast"`` gives the FEAST authors' port instead: the KL summed over classes
and averaged over the batch ('batchmean', i.e. ``num_classes`` times stronger), a detached
teacher, and distillation from the first round.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from flwr.app import Message, MetricRecord, RecordDict

from fedapp.data.transforms import mixed_cross_entropy
from fedapp.methods.common.local_round import local_sgd, train_local_epochs
from fedapp.methods.scalefl.keys import LEVEL
from fedapp.methods.scalefl.settings import ScaleFLSettings
from fedapp.models.early_exits import level_costs, level_model
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.run.run_models import substrate_config
from fedapp.training.loops import backward
from fedapp.training.train_metrics import train_metrics
from fedapp.wire.messages import ARRAYS, CONFIG, METRICS, SERVER_ROUND
from fedapp.wire.records import load_into, to_record

#: Distillation is active in rounds after this fraction of the run (reference: ``gamma_active``).
KD_START_FRACTION = 0.25


def kd_active(server_round: int, num_rounds: int, form: str = "official") -> bool:
    """Whether distillation is on this round: from round 1 in the FEAST port, else after a
    quarter of the rounds."""
    return form == "feast" or server_round > KD_START_FRACTION * num_rounds


def self_distillation_loss(
    outputs: list[torch.Tensor],
    y_a: torch.Tensor,
    y_b: torch.Tensor,
    lam: float,
    *,
    gamma: float,
    temperature: float,
    form: str = "official",
) -> torch.Tensor:
    """ScaleFL's local loss over a level's exits (shallow to deep) on a (possibly mixed) batch;
    ``form`` = "official" (mean KL, teacher not detached) or "feast" (batchmean, detached)."""
    depth = len(outputs)
    teacher = outputs[-1]
    total = depth * mixed_cross_entropy(teacher, y_a, y_b, lam)
    if gamma:
        source = teacher.detach() if form == "feast" else teacher
        teacher_log_p = F.log_softmax(source / temperature, dim=1)
    for j, logits in enumerate(outputs[:-1], start=1):
        term = mixed_cross_entropy(logits, y_a, y_b, lam)
        if gamma:
            student_log_p = F.log_softmax(logits / temperature, dim=1)
            pointwise = teacher_log_p.exp() * (teacher_log_p - student_log_p)
            kl = pointwise.sum(dim=1).mean() if form == "feast" else pointwise.mean()
            term = term + gamma * temperature**2 * kl
        total = total + j * term
    return total / (depth * (depth + 1) / 2)


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round: rebuild the level sent, train every exit, send the level back."""
    started = time.perf_counter()
    info = run.info
    config = message.content[CONFIG]
    level = int(config[LEVEL])
    substrate = substrate_config(run.substrate, info)
    scalefl = run.section(ScaleFLSettings)
    model = level_model(substrate, level, scalefl.exit_convs)
    load_into(model, message.content[ARRAYS])
    generator, loader, optimizer = local_sgd(model, message, run, node)
    server_round = int(config[SERVER_ROUND])
    form = scalefl.kd_form
    gamma = (
        scalefl.kd_weight if kd_active(server_round, run.rounds.num_server_rounds, form) else 0.0
    )

    def loss_of(x: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float) -> torch.Tensor:
        outputs = model.exit_logits(x)
        return self_distillation_loss(
            outputs, y_a, y_b, lam, gamma=gamma, temperature=scalefl.kd_temperature, form=form
        )

    stats = train_local_epochs(model, loader, optimizer, backward(loss_of), run.training, generator)
    level_macs = level_costs(substrate, scalefl.exit_convs)[level].macs
    seconds = time.perf_counter() - started
    metrics = MetricRecord(
        train_metrics(len(loader.dataset), stats, seconds, level_macs * stats.examples)
        | {LEVEL: level}
    )
    return RecordDict({ARRAYS: to_record(model.state_dict()), METRICS: metrics})
