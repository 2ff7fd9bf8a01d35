"""FedKD-NAS server and Local-KD, its no-coordination ablation (ours).

The server holds the public set D_pub with its labels and, before round 1, fits the teacher and
keeps its logits P_T. The teacher never labels an image it was trained on: with
``fedkd-nas.teacher-folds`` K >= 2, D_pub is split into K folds and teacher k, trained on the other
folds, labels fold k (cross-fitting). With K = 1 one teacher is fitted to D_pub itself and
reproduces its labels, so Z~ carries nothing from the clients and FedKD-NAS equals Local-KD
(docs/methods/fedkd-nas.md). The global state is only logits: the smoothed target Z~
(and P_T), so checkpoints and resume need no model. Each round it broadcasts Z~ (Z~(0) = P_T;
nothing in round 1 when the teacher is off, ``fedkd-nas.teacher-beta`` = 0), receives every client's
logits on D_pub, and updates
    P_agg = aggregate(client logits)   (weighted by samples / mean / trimmed mean / median)
    Z     = beta * P_T + (1 - beta) * P_agg
    Z~    = gamma * Z~ + (1 - gamma) * Z.
Each round's metrics row says how Z~ moves with the clients: the top-1 agreement of Z~, P_agg and
P_T with the D_pub labels and with each other. Students live on the clients; evaluation asks them
(ClientHeldStrategy). Every client's NAS choice, rival, scores and reason per round go to
nas_choices.csv.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Message

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE
from fedapp.evaluation.results import write_csv
from fedapp.methods.common.client_held import ClientHeldStrategy
from fedapp.methods.common.evaluators import ClientModels
from fedapp.methods.common.reply_validation import (
    ArraySpec,
    ComputeFloor,
    InvalidReply,
    ValidReply,
)
from fedapp.methods.common.strategy import State
from fedapp.methods.fedkd_nas.keys import (
    NAS_HOLDOUT_ACCURACY,
    NAS_MACS,
    NAS_MULTIPLIER,
    NAS_REASON,
    NAS_REASONS,
    NAS_RIVAL_ACCURACY,
    NAS_RIVAL_MULTIPLIER,
    NAS_RIVAL_SCORE,
    NAS_RIVAL_STEPS,
    NAS_SCORE,
    NAS_STEPS,
    NAS_SWITCHED,
    NAS_WARM_START,
    NO_RIVAL,
    TARGET,
)
from fedapp.methods.fedkd_nas.nas import feasible_candidates, memory_budget
from fedapp.methods.fedkd_nas.settings import FedKDNASSettings
from fedapp.models.families import affordable
from fedapp.models.zoo import build_model
from fedapp.random_streams import Stream, stream_rng
from fedapp.run.context import RunContext
from fedapp.run.federated_data import public_images, server_set
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.run.run_models import run_candidates
from fedapp.training.distillation import predict_logits
from fedapp.training.logit_fusion import aggregate_logits, fuse_with_teacher, smooth
from fedapp.training.loops import (
    eval_loader,
    evaluate,
    seed_local_work,
    sgd,
    train_loader,
    train_supervised,
)
from fedapp.wire.messages import ACCURACY, LOGITS, MULTIPLIER

TEACHER = "teacher"  # global state: P_T, the teacher's logits on D_pub
NAS_CHOICES_FILE = "nas_choices.csv"
#: The reply metrics nas_choices.csv keeps as they are (the student and rival by name, the
#: reason by word, beside them).
NAS_METRICS = (
    NAS_MACS,
    NAS_SCORE,
    NAS_HOLDOUT_ACCURACY,
    NAS_STEPS,
    NAS_SWITCHED,
    NAS_WARM_START,
    NAS_RIVAL_SCORE,
    NAS_RIVAL_ACCURACY,
    NAS_RIVAL_STEPS,
)


def teacher_folds(size: int, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(indices a teacher trains on, indices it labels) per teacher. K >= 2: a seeded split into
    K folds, teacher k trains on all but fold k and labels fold k, so no image is labelled by a
    teacher that saw it. K = 1: one teacher trained on and labelling all (no cross-fitting)."""
    everything = np.arange(size)
    if folds == 1:
        return [(everything, everything)]
    order = stream_rng(seed, Stream.TEACHER_FOLDS).permutation(size)
    parts = np.array_split(order, folds)
    return [
        (np.sort(np.concatenate(parts[:k] + parts[k + 1 :])), np.sort(parts[k]))
        for k in range(folds)
    ]


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Share of rows whose arg-max agrees (``b`` may be labels instead of logits)."""
    b_top = b if b.ndim == 1 else b.argmax(axis=1)
    return float(np.mean(a.argmax(axis=1) == b_top))


def exchange_metrics(
    labels: np.ndarray,
    teacher: np.ndarray | None,
    aggregated: np.ndarray,
    target: np.ndarray,
    previous: np.ndarray | None,
) -> dict[str, float]:
    """How the new Z~ relates to the D_pub labels, to the clients (P_agg) and to the teacher."""
    metrics = {
        "target-label-agreement": top1_agreement(target, labels),
        "target-clients-agreement": top1_agreement(target, aggregated),
        "clients-label-agreement": top1_agreement(aggregated, labels),
    }
    if teacher is not None:
        metrics |= {
            "teacher-label-agreement": top1_agreement(teacher, labels),
            "target-teacher-agreement": top1_agreement(target, teacher),
        }
    if previous is not None:
        metrics["target-top1-changed"] = 1.0 - top1_agreement(target, previous)
    return metrics


class FedKDNASStrategy(ClientHeldStrategy):
    """Logit exchange on the public set with teacher fusion and EMA; clients choose by NAS."""

    trains_whole_shard = False  # a client scores its candidates on a held-out part of it

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.settings = run.section(FedKDNASSettings)
        self.candidates = run_candidates(self.run.family, self.info)
        self.public_labels = server_set(self.run.data, "public").labels
        self.public_shape = (len(self.public_labels), self.info.num_classes)
        self.teachers: list[torch.nn.Module] = []
        self.nas_rows: list[dict[str, Any]] = []
        self.exchange: dict[str, float] = {}  # this round's agreement metrics
        self._choices: dict[int, dict[str, Any]] = {}  # node id -> its reply's NAS choice
        #: Every evaluation names the student it measured; the test adds the teacher and choices.
        self.evaluator = ClientModels(
            run,
            nodes,
            self.last_grid,
            required={MULTIPLIER},
            read=self.read_evaluation,
            extra_report=self.nas_report,
        )

    def accounts(self) -> dict[str, Any]:
        """The base's records and every client-round's NAS choice (summary.json counts them)."""
        return super().accounts() | {"nas_rows": [dict(r) for r in self.nas_rows]}

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        super().restore_accounts(accounts)
        self.nas_rows = [dict(r) for r in accounts["nas_rows"]]

    @property
    def uses_teacher(self) -> bool:
        return self.settings.teacher_beta > 0

    def ineligibility(self, profile: NodeProfile) -> str | None:
        if affordable(self.candidates, profile.budget, memory_budget(self.run)):
            return None
        return f"budget {profile.budget:.0f} MACs affords no candidate within the memory budget"

    def _train_teacher(self, data: ImageArrays, fold: int) -> torch.nn.Module:
        """One teacher, trained on labelled public images (seeded per fold)."""
        name = self.settings.teacher_model or self.candidates[-1].name
        generator = seed_local_work(self.run.rounds.seed, Stream.TEACHER_TRAINING, fold)
        teacher = build_model(name, self.info)
        loader = train_loader(data, self.info, self.run.training.batch_size, generator)
        optimizer = sgd(
            teacher,
            self.run.rounds.learning_rate,
            self.run.training.momentum,
            self.run.training.weight_decay,
        )
        train_supervised(teacher, loader, optimizer, self.settings.teacher_epochs, self.device)
        return teacher

    def initial_state(self) -> State:
        """{} without a teacher; else P_T (each fold labelled by the teacher that did not see
        it) and Z~(0) = P_T."""
        if not self.uses_teacher:
            return {}
        public = server_set(self.run.data, "public")
        logits = np.zeros(self.public_shape, np.float32)
        self.teachers = []
        folds = teacher_folds(len(public.labels), self.settings.teacher_folds, self.run.rounds.seed)
        for fold, (trained_on, labelled) in enumerate(folds):
            teacher = self._train_teacher(_subset(public, trained_on), fold)
            images = _subset(public_images(self.run.data), labelled)
            logits[labelled] = predict_logits(teacher, images, self.info, self.device)
            self.teachers.append(teacher)
        return {TEACHER: logits, TARGET: logits.copy()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return {TARGET: global_state[TARGET]} if TARGET in global_state else {}

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of the cheapest candidate the node can train (its student is one)."""
        feasible = feasible_candidates(self.run, self.info, profile.budget)
        return self.training_floor(min(c.macs for c in feasible))

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        return {LOGITS: ArraySpec(self.public_shape, "float32")}

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        self._log_choices(server_round, replies)
        aggregated = aggregate_logits(
            [r.arrays[LOGITS] for r in replies],
            [r.weight for r in replies],
            self.settings.logit_aggregation,
            self.settings.trim_fraction,
        )
        teacher = global_state.get(TEACHER)
        fused = fuse_with_teacher(aggregated, teacher, self.settings.teacher_beta)
        previous = global_state.get(TARGET)
        target = smooth(previous, fused, self.settings.ema_gamma)
        self.exchange = exchange_metrics(self.public_labels, teacher, aggregated, target, previous)
        return ({TEACHER: teacher} if teacher is not None else {}) | {TARGET: target}

    def aggregate_round(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[State | None, dict[str, float | int] | None]:
        """The base's aggregation, plus this round's agreement metrics of Z~ in its row."""
        self.exchange = {}
        state, metrics = super().aggregate_round(server_round, replies)
        return state, (None if metrics is None else metrics | self.exchange)

    def candidate_name(self, multiplier: float) -> str:
        """The family candidate a client reported by its multiplier (metrics carry no strings)."""
        for candidate in self.candidates:
            if candidate.multiplier == float(multiplier):
                return candidate.name
        raise InvalidReply(f"multiplier {multiplier!r} names no candidate of the family")

    #: Every reply names its student, rival and reason, and the NAS figures nas_choices.csv keeps.
    reply_metrics = frozenset({NAS_MULTIPLIER, NAS_REASON, NAS_RIVAL_MULTIPLIER, *NAS_METRICS})

    def read_reply(self, reply: ValidReply) -> None:
        """The NAS choice a reply names, read while it is checked: an unknown student, rival or
        reason drops the reply."""
        metrics = reply.metrics
        reason, rival = metrics[NAS_REASON], metrics[NAS_RIVAL_MULTIPLIER]
        if reason not in range(len(NAS_REASONS)):
            raise InvalidReply(f"metric {NAS_REASON} = {reason!r} names no reason")
        self._choices[reply.node_id] = {
            "candidate": self.candidate_name(metrics[NAS_MULTIPLIER]),
            "reason": NAS_REASONS[int(reason)],
            "rival": self.candidate_name(rival) if rival != NO_RIVAL else "",
        } | {key: metrics[key] for key in NAS_METRICS}

    def read_evaluation(self, row: dict[str, Any]) -> dict[str, Any]:
        """Each client's row names its student."""
        return row | {"candidate": self.candidate_name(row[MULTIPLIER])}

    def _log_choices(self, server_round: int, replies: list[ValidReply]) -> None:
        for reply in replies:
            profile = self.nodes.profiles[reply.node_id]
            self.nas_rows.append(
                {
                    "round": server_round,
                    "partition": profile.partition_id,
                    "budget": profile.budget,
                }
                | self._choices.pop(reply.node_id)
            )

    def teacher_test(self, data: ImageArrays) -> dict[str, float] | None:
        """The teachers' mean test accuracy and loss (one teacher per fold)."""
        if not self.teachers:
            return None
        loader = eval_loader(data, self.info, EVAL_BATCH_SIZE)
        results = [evaluate(t, loader, self.device) for t in self.teachers]
        return {key: float(np.mean([r[key] for r in results])) for key in results[0]}

    def nas_report(self, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """Beside the clients' mean test figures: the teacher's test accuracy and the NAS log."""
        write_csv(run_dir / NAS_CHOICES_FILE, self.nas_rows)
        teacher = self.teacher_test(data)
        return {
            "teacher_test_accuracy": teacher[ACCURACY] if teacher else None,
            "nas_switches": int(sum(row[NAS_SWITCHED] for row in self.nas_rows)),
            "nas_choices": {
                name: int(np.sum([row["candidate"] == name for row in self.nas_rows]))
                for name in (c.name for c in self.candidates)
            },
        }


def _subset(data: ImageArrays, indices: np.ndarray) -> ImageArrays:
    return ImageArrays(data.images[indices], data.labels[indices])
