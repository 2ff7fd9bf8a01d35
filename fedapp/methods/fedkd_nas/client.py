"""FedKD-NAS and Local-KD clients: pick an architecture, train CE + alpha * KD, share only logits.

Every round the NAS controller (fedapp.methods.fedkd_nas.nas) settles the student: the incumbent,
and in a duel round also a warm-started challenger trained on the same batches. Training is CE on
the private shard (less the controller's hold-out) + alpha * KD (``fedkd-nas.kd-weight``) on public
images whose targets are the server's smoothed logits Z~ (paper: L = CE + alpha * KD), with
``fedkd-nas.kd-steps`` public batches per local epoch whatever the shard's size (0: one per private
batch, so a small shard gets little KD: 28 images, two KD steps a round). FedKD-NAS then
uploads the student's logits on the whole public set. Local-KD (ours, the no-coordination ablation)
receives the teacher's logits once, keeps them in the node's state and never uploads anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict
from torch import nn

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE
from fedapp.methods.common.evaluation_reply import candidate_costs, evaluation_reply, no_model_reply
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
from fedapp.methods.fedkd_nas.nas import (
    Measured,
    NasHistory,
    challenger,
    decide,
    duel_due,
    feasible_candidates,
    holdout_split,
    incumbent,
    keep_weights,
    public_holdout,
    required_gain,
    score,
    warm_start,
)
from fedapp.methods.fedkd_nas.settings import FedKDNASSettings
from fedapp.models.families import Candidate, build_candidate, describe
from fedapp.random_streams import Stream
from fedapp.run.context import RunContext
from fedapp.run.federated_data import public_images
from fedapp.run.profiles import LocalNode
from fedapp.training.distillation import endless, kd_loss, predict_logits, target_loader
from fedapp.training.loops import (
    TrainStats,
    eval_loader,
    evaluate,
    resolve_device,
    seed_local_work,
    sgd,
    train_loader,
    train_supervised,
)
from fedapp.training.train_metrics import train_metrics
from fedapp.wire.messages import (
    ACCURACY,
    ARRAYS,
    CONFIG,
    LEARNING_RATE,
    LOGITS,
    METRICS,
    SERVER_ROUND,
)
from fedapp.wire.records import from_record, load_state, to_record


def kd_schedule(private_batches: int, kd_steps: int) -> list[tuple[bool, bool]]:
    """(takes a private batch, takes a public batch) for each optimizer step of one epoch.

    ``kd_steps`` = 0 pairs one public batch with every private batch (KD scales with the shard).
    Else the epoch has max(private batches, kd_steps) steps: every private batch once and exactly
    ``kd_steps`` public batches, each spread evenly, so the KD a client gets does not shrink with
    its shard.
    """
    if kd_steps == 0:
        return [(True, True)] * private_batches
    total = max(private_batches, kd_steps)
    private_at = {k * total // private_batches for k in range(private_batches)}
    public_at = {k * total // kd_steps for k in range(kd_steps)}
    return [(step in private_at, step in public_at) for step in range(total)]


def train_with_kd(
    model: nn.Module,
    private: Iterable[tuple[torch.Tensor, torch.Tensor]],
    public: Iterator[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
    alpha: float,
    temperature: float,
    kd_steps: int,
) -> tuple[TrainStats, int]:
    """CE on private batches + alpha * KD on public ones, scheduled by :func:`kd_schedule`;
    (stats, public images seen). Stats count private examples; the loss is the mean per step.

    A step with both batches runs one forward pass, so BN sees private and public images together.
    """
    start = time.perf_counter()
    model.to(device).train()
    batches_per_epoch = len(private)  # type: ignore[arg-type]
    loss_sum, examples, steps, public_seen = 0.0, 0, 0, 0
    for _ in range(epochs):
        batches = iter(private)
        for use_private, use_public in kd_schedule(batches_per_epoch, kd_steps):
            parts, loss = [], torch.zeros((), device=device)
            if use_private:
                x, y = next(batches)
                parts.append(x)
            if use_public:
                xp, target = next(public)
                parts.append(xp)
            logits = model(torch.cat(parts).to(device))
            if use_private:
                loss = nn.functional.cross_entropy(logits[: len(y)], y.to(device))
                examples += len(y)
            if use_public:
                kd = kd_loss(logits[len(logits) - len(xp) :], target.to(device), temperature)
                loss = loss + alpha * kd
                public_seen += len(xp)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            steps += 1
    seconds = time.perf_counter() - start
    return TrainStats(loss_sum / max(steps, 1), examples, steps, seconds), public_seen


@dataclass(frozen=True)
class Trained:
    """One candidate after this round's local training."""

    candidate: Candidate
    model: nn.Module
    measured: Measured
    stats: TrainStats
    public_seen: int  # public images in KD steps, warm-up included
    warm_start: bool  # started from kept weights


class RoundTrainer:
    """One client's round: the same batches, steps and KD target for every candidate it trains."""

    def __init__(
        self,
        run: RunContext,
        node: LocalNode,
        target: np.ndarray | None,
        server_round: int,
        lr: float,
    ) -> None:
        self.run, self.node, self.target = run, node, target
        self.nas = run.section(FedKDNASSettings)
        self.info = run.info
        self.round, self.lr = server_round, lr
        self.device = resolve_device(run.training.device)
        self.public = public_images(run.data)
        self.kd_rows: slice | np.ndarray = slice(None)  # the public images KD trains on
        self.kd_images = self.public
        if self.nas.score_on == "public" and target is not None:
            # the whole shard trains; scores are top-1 agreement with the target on public
            # images that no candidate distils on
            self.kd_rows, scored = public_holdout(
                len(self.public.labels), self.nas.public_holdout, run.training.seed
            )
            self.kd_images = ImageArrays(
                self.public.images[self.kd_rows], self.public.labels[self.kd_rows]
            )
            self.train_part = node.shard(run.data)
            self.holdout = ImageArrays(self.public.images[scored], target[scored].argmax(axis=1))
        else:
            self.train_part, self.holdout = holdout_split(
                node.shard(run.data), self.nas.holdout, run.training.seed, node.partition_id
            )

    def _seeded(self, stream: Stream) -> torch.Generator:
        return seed_local_work(self.run.training.seed, stream, self.round, self.node.partition_id)

    def kd_batches(self, target: np.ndarray, generator: torch.Generator) -> Iterator:
        """Endless shuffled (public image, target row) batches over the images KD may use."""
        loader = target_loader(
            self.kd_images, target[self.kd_rows], self.info, self.run.training.batch_size, generator
        )
        return endless(loader)

    def _optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return sgd(model, self.lr, self.run.training.momentum, self.run.training.weight_decay)

    def train(self, candidate: Candidate, warmup_target: np.ndarray | None = None) -> Trained:
        """Build (kept weights when there are), optionally warm up by KD on the public set
        towards ``warmup_target``, then the round's local training and the hold-out score."""
        run = self.run
        self._seeded(Stream.LOCAL_TRAINING)
        model = build_candidate(candidate.name, self.info)
        kept = warm_start(self.node.state, candidate.name)
        if kept is not None:
            load_state(model, kept)
        public_seen = 0
        if warmup_target is not None and self.nas.warmup_steps > 0:
            public = self.kd_batches(warmup_target, self._seeded(Stream.NAS_WARMUP))
            _, public_seen = train_with_kd(
                model,
                [],
                public,
                self._optimizer(model),
                1,
                self.device,
                1.0,
                self.nas.kd_temperature,
                self.nas.warmup_steps,
            )
        # the same batches for every candidate of this round
        generator = self._seeded(Stream.LOCAL_TRAINING)
        private = train_loader(self.train_part, self.info, run.training.batch_size, generator)
        optimizer = self._optimizer(model)
        if self.target is None:
            stats = train_supervised(
                model, private, optimizer, run.training.local_epochs, self.device
            )
        else:
            stats, seen = train_with_kd(
                model,
                private,
                self.kd_batches(self.target, generator),
                optimizer,
                run.training.local_epochs,
                self.device,
                self.nas.kd_weight,
                self.nas.kd_temperature,
                self.nas.kd_steps,
            )
            public_seen += seen
        loader = eval_loader(self.holdout, self.info, EVAL_BATCH_SIZE)
        accuracy = evaluate(model, loader, self.device)[ACCURACY]
        return Trained(
            candidate,
            model,
            Measured(accuracy, stats.steps, self.round),
            stats,
            public_seen,
            kept is not None,
        )

    def warmup_target(self, trained: Trained) -> np.ndarray:
        """What a challenger distils from before its duel: Z~ when there is one, else the
        incumbent's own logits on the public set."""
        if self.target is not None:
            return self.target
        return predict_logits(trained.model, self.public, self.info, self.device)


def local_round(
    message: Message, run: RunContext, node: LocalNode, target: np.ndarray | None
) -> tuple[nn.Module, dict[str, float | int]]:
    """Train the incumbent (and in a duel round a challenger), settle the student and keep what
    the controller learnt; returns the student and the reply metrics (choice, scores, reason)."""
    instructions = message.content[CONFIG]
    trainer = RoundTrainer(
        run, node, target, int(instructions[SERVER_ROUND]), float(instructions[LEARNING_RATE])
    )
    nas = run.section(FedKDNASSettings)
    history = NasHistory.load(node.state)
    feasible = feasible_candidates(run, trainer.info, node.budget)
    current, reason = incumbent(feasible, history)
    duel = duel_due(history, feasible, nas.duel_every)
    mine = trainer.train(current)
    runs = [mine]
    student, rival = mine, None
    student_score = score(current, mine.measured.accuracy, node.budget, nas.lambda_)
    rival_score = NO_RIVAL
    if duel:
        rival = trainer.train(challenger(feasible, current, history), trainer.warmup_target(mine))
        runs.append(rival)
        decision = decide(
            current,
            mine.measured,
            rival.candidate,
            rival.measured,
            node.budget,
            nas.lambda_,
            required_gain(nas.margin, len(trainer.holdout.labels)),
        )
        if decision.winner != current.name:
            student, rival = rival, mine
        student_score, rival_score, reason = decision.score, decision.rival_score, decision.reason
    for run in sorted(runs, key=lambda r: r is student):  # the student is kept last (most recent)
        history.measured[run.candidate.name] = run.measured
        keep_weights(
            node.state,
            history,
            run.candidate.name,
            run.model.state_dict(),
            nas.keep,
        )
    switched = history.incumbent not in ("", student.candidate.name)  # a first choice is none
    history.incumbent = student.candidate.name
    history.rounds_trained += 1
    history.save(node.state)
    examples = sum(r.stats.examples for r in runs)
    seconds = sum(r.stats.seconds for r in runs)
    forward_macs = sum(r.candidate.macs * (r.stats.examples + r.public_seen) for r in runs)
    stats = TrainStats(student.stats.loss, examples, sum(r.stats.steps for r in runs), seconds)
    metrics = train_metrics(len(trainer.train_part.labels), stats, seconds, forward_macs) | {
        NAS_MULTIPLIER: student.candidate.multiplier,
        NAS_MACS: student.candidate.macs,
        NAS_SCORE: student_score,
        NAS_SWITCHED: int(switched),
        NAS_WARM_START: int(student.warm_start),
        NAS_HOLDOUT_ACCURACY: student.measured.accuracy,
        NAS_STEPS: student.measured.steps,
        NAS_REASON: NAS_REASONS.index(reason),
        NAS_RIVAL_MULTIPLIER: rival.candidate.multiplier if rival else NO_RIVAL,
        NAS_RIVAL_SCORE: rival_score,
        NAS_RIVAL_STEPS: rival.measured.steps if rival else NO_RIVAL,
        NAS_RIVAL_ACCURACY: rival.measured.accuracy if rival else NO_RIVAL,
    }
    return student.model, metrics


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """FedKD-NAS: distil from the broadcast Z~ (none in a teacherless round 1), upload logits."""
    arrays = from_record(message.content[ARRAYS])
    model, metrics = local_round(message, run, node, arrays.get(TARGET))
    info = run.info
    logits = predict_logits(
        model, public_images(run.data), info, resolve_device(run.training.device)
    )
    return RecordDict({ARRAYS: to_record({LOGITS: logits}), METRICS: MetricRecord(metrics)})


def evaluate_student(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """Client evaluator: this node's current student (its last choice) on the named split. A
    node that was never sampled has no student and answers with zero examples (the server drops
    it)."""
    history = NasHistory.load(node.state)
    weights = warm_start(node.state, history.incumbent) if history.incumbent else None
    if weights is None:
        return no_model_reply()
    info = run.info
    model = build_candidate(history.incumbent, info)
    load_state(model, weights)
    costs = candidate_costs(describe(history.incumbent, info, run.training.batch_size))
    return evaluation_reply(model, message, run, costs)
