"""FedKD-NAS server (spec fedkd-nas.md) and Local-KD, its no-coordination ablation (ours).

The server holds the public set D_pub with its labels, pre-trains the teacher on it before round
1 and keeps the teacher's logits P_T. The global state is only logits: the smoothed target Z~
(and P_T), so checkpoints and resume need no model. Each round it broadcasts Z~ (Z~(0) = P_T;
nothing in round 1 when the teacher is off, teacher-beta = 0), receives every client's logits on
D_pub, and updates
    P_agg = aggregate(client logits)   (weighted by samples / mean / trimmed mean / median)
    Z     = beta * P_T + (1 - beta) * P_agg
    Z~    = gamma * Z~ + (1 - gamma) * Z.
Students live on the clients; evaluation asks them (ClientHeldStrategy). Every client's NAS
choice and score per round goes to nas_choices.csv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedapp.config import RunConfig
from fedapp.data.registry import ImageArrays
from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE
from fedapp.evaluation.results import write_csv
from fedapp.federated_data import public_images, server_set
from fedapp.messages import LOGITS, TARGET
from fedapp.models.families import affordable, family_candidates
from fedapp.models.zoo import build_model
from fedapp.profiles import NodeProfile, NodeRegistry
from fedapp.run_models import memory_budget, run_family
from fedapp.strategies.base import State
from fedapp.strategies.client_held import ClientHeldStrategy
from fedapp.strategies.reply_validation import ArraySpec, ValidReply
from fedapp.training.distillation import predict_logits
from fedapp.training.logit_fusion import aggregate_logits, fuse_with_teacher, smooth
from fedapp.training.loops import (
    eval_loader,
    evaluate,
    resolve_device,
    seed_local_work,
    sgd,
    train_loader,
    train_supervised,
)

TEACHER = "teacher"  # global state: P_T, the teacher's logits on D_pub
NAS_CHOICES_FILE = "nas_choices.csv"
NAS_METRICS = ("nas-multiplier", "nas-macs", "nas-score", "nas-switched", "nas-holdout-accuracy")


class FedKDNASStrategy(ClientHeldStrategy):
    """Logit exchange on the public set with teacher fusion and EMA; clients choose by NAS."""

    def __init__(self, cfg: RunConfig, nodes: NodeRegistry) -> None:
        super().__init__(cfg, nodes)
        self.candidates = family_candidates(run_family(cfg), self.info, cfg.batch_size)
        self.public_shape = (len(public_images(cfg).labels), self.info.num_classes)
        self.device = resolve_device(cfg.device)
        self.teacher: torch.nn.Module | None = None
        self.nas_rows: list[dict[str, Any]] = []

    def accounts(self) -> dict[str, Any]:
        """The base's records and every client-round's NAS choice (summary.json counts them)."""
        return super().accounts() | {"nas_rows": [dict(r) for r in self.nas_rows]}

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        super().restore_accounts(accounts)
        self.nas_rows = [dict(r) for r in accounts["nas_rows"]]

    @property
    def uses_teacher(self) -> bool:
        return self.cfg.teacher_beta > 0

    def ineligibility(self, profile: NodeProfile) -> str | None:
        if affordable(self.candidates, profile.budget, memory_budget(self.cfg)):
            return None
        return f"budget {profile.budget:.0f} MACs affords no candidate within the memory budget"

    def _train_teacher(self) -> torch.nn.Module:
        """The teacher, trained on the labelled public set (seeded)."""
        name = self.cfg.teacher_model or self.candidates[-1].name
        generator = seed_local_work(self.cfg.seed, 0)
        teacher = build_model(name, self.info)
        loader = train_loader(
            server_set(self.cfg, "public"), self.info, self.cfg.batch_size, generator
        )
        optimizer = sgd(teacher, self.cfg.learning_rate, self.cfg.momentum, self.cfg.weight_decay)
        train_supervised(teacher, loader, optimizer, self.cfg.teacher_epochs, self.device)
        return teacher

    def initial_state(self) -> State:
        """{} without a teacher; else P_T and Z~(0) = P_T."""
        if not self.uses_teacher:
            return {}
        self.teacher = self._train_teacher()
        logits = predict_logits(self.teacher, public_images(self.cfg), self.info, self.device)
        return {TEACHER: logits, TARGET: logits.copy()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return {TARGET: global_state[TARGET]} if TARGET in global_state else {}

    def expected_reply(self, profile: NodeProfile, payload: State) -> dict[str, ArraySpec]:
        return {LOGITS: ArraySpec(self.public_shape, "float32")}

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        self._log_choices(server_round, replies)
        aggregated = aggregate_logits(
            [r.arrays[LOGITS] for r in replies],
            [r.num_examples for r in replies],
            self.cfg.logit_aggregation,
            self.cfg.trim_fraction,
        )
        teacher = global_state.get(TEACHER)
        fused = fuse_with_teacher(aggregated, teacher, self.cfg.teacher_beta)
        target = smooth(global_state.get(TARGET), fused, self.cfg.ema_gamma)
        return ({TEACHER: teacher} if teacher is not None else {}) | {TARGET: target}

    def candidate_name(self, multiplier: float) -> str:
        """The family candidate a client reported by its multiplier (metrics carry no strings)."""
        return next(c.name for c in self.candidates if c.multiplier == float(multiplier))

    def client_mean(self, split: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """The clients' mean, each client's row naming its student."""
        mean, rows = super().client_mean(split)
        return mean, [row | {"candidate": self.candidate_name(row["multiplier"])} for row in rows]

    def _log_choices(self, server_round: int, replies: list[ValidReply]) -> None:
        for reply in replies:
            profile = self.nodes.profiles[reply.node_id]
            self.nas_rows.append(
                {
                    "round": server_round,
                    "partition": profile.partition_id,
                    "budget": profile.budget,
                    "candidate": self.candidate_name(reply.metrics["nas-multiplier"]),
                }
                | {key: reply.metrics[key] for key in NAS_METRICS}
            )

    def teacher_test(self, data: ImageArrays) -> dict[str, float] | None:
        if self.teacher is None:
            return None
        return evaluate(self.teacher, eval_loader(data, self.info, EVAL_BATCH_SIZE), self.device)

    def test_summary(self, state: State, data: ImageArrays, run_dir: Path) -> dict[str, Any]:
        """Mean client test accuracy and loss, the teacher's test accuracy, the NAS log."""
        summary = super().test_summary(state, data, run_dir)
        write_csv(run_dir / NAS_CHOICES_FILE, self.nas_rows)
        teacher = self.teacher_test(data)
        return summary | {
            "teacher_test_accuracy": teacher["accuracy"] if teacher else None,
            "nas_switches": int(sum(row["nas-switched"] for row in self.nas_rows)),
            "nas_choices": {
                name: int(np.sum([row["candidate"] == name for row in self.nas_rows]))
                for name in (c.name for c in self.candidates)
            },
        }
