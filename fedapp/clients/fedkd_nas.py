"""FedKD-NAS and Local-KD clients: pick an architecture, train CE + alpha * KD, share only logits.

Every round the NAS controller (fedapp.clients.nas) picks the student from the feasible
candidates; it trains on the private shard (less the controller's hold-out) with, per private
batch, one batch of public images whose targets are the server's smoothed logits Z~ (paper:
L = CE + alpha * KD). FedKD-NAS then uploads the student's logits on the whole public set.
Local-KD (ours, the no-coordination ablation) receives the teacher's logits once, keeps them in
the node's state and never uploads anything.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict
from torch import nn
from torch.utils.data import DataLoader

from fedapp.clients.evaluation_reply import candidate_costs, evaluation_reply, no_model_reply
from fedapp.clients.nas import (
    NasHistory,
    choose,
    feasible_candidates,
    holdout_split,
    keep_weights,
    record,
    warm_start,
)
from fedapp.config import RunConfig
from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE
from fedapp.federated_data import dataset_info, public_images
from fedapp.messages import ARRAYS, CONFIG, LEARNING_RATE, LOGITS, METRICS, SERVER_ROUND, TARGET
from fedapp.models.families import build_candidate, describe
from fedapp.profiles import LocalNode
from fedapp.records import from_record, load_state, to_record
from fedapp.training.distillation import endless, kd_loss, predict_logits, target_loader
from fedapp.training.loops import (
    TrainStats,
    backward,
    eval_loader,
    evaluate,
    resolve_device,
    seed_local_work,
    sgd,
    train_epochs,
    train_loader,
    train_supervised,
)
from fedapp.training.train_metrics import train_metrics


def train_with_kd(
    model: nn.Module,
    private: DataLoader,
    public: Iterator[tuple[torch.Tensor, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
    alpha: float,
    temperature: float,
) -> tuple[TrainStats, int]:
    """CE on each private batch + alpha * KD on one public batch; (stats, public images seen).

    Both batches go through one forward pass, so BN sees private and public images together.
    """
    public_seen = 0

    def loss_of(x: torch.Tensor, y: torch.Tensor, _: torch.Tensor, __: float) -> torch.Tensor:
        nonlocal public_seen
        xp, target = next(public)
        xp, target = xp.to(device), target.to(device)
        public_seen += len(xp)
        logits = model(torch.cat([x, xp]))
        ce = nn.functional.cross_entropy(logits[: len(x)], y)
        return ce + alpha * kd_loss(logits[len(x) :], target, temperature)

    stats = train_epochs(model, private, optimizer, backward(loss_of), epochs=epochs, device=device)
    return stats, public_seen


def local_round(
    message: Message, cfg: RunConfig, node: LocalNode, target: np.ndarray | None
) -> tuple[nn.Module, dict[str, float | int]]:
    """Choose, warm-start, train (with KD when there is a target) and score this round's
    student; returns it and the reply metrics (the choice and its score included)."""
    info = dataset_info(cfg)
    server_round = int(message.content[CONFIG][SERVER_ROUND])
    lr = float(message.content[CONFIG][LEARNING_RATE])
    device = resolve_device(cfg.device)
    history = NasHistory.load(node.state)
    choice = choose(
        feasible_candidates(cfg, info, node.budget),
        history,
        node.budget,
        cfg.nas_lambda,
        cfg.nas_margin,
    )
    name = choice.candidate.name
    generator = seed_local_work(cfg.seed, server_round, node.partition_id)
    model = build_candidate(name, info)
    kept = warm_start(node.state, name)
    if kept is not None:
        load_state(model, kept)
    train_part, holdout = holdout_split(
        node.shard(cfg), cfg.nas_holdout, cfg.seed, node.partition_id
    )
    private = train_loader(train_part, info, cfg.batch_size, generator)
    optimizer = sgd(model, lr, cfg.momentum, cfg.weight_decay)
    if target is None:
        stats, public_seen = (
            train_supervised(model, private, optimizer, cfg.local_epochs, device),
            0,
        )
    else:
        public = target_loader(public_images(cfg), target, info, cfg.batch_size, generator)
        stats, public_seen = train_with_kd(
            model,
            private,
            endless(public),
            optimizer,
            cfg.local_epochs,
            device,
            cfg.kd_alpha,
            cfg.kd_temperature,
        )
    accuracy = evaluate(model, eval_loader(holdout, info, EVAL_BATCH_SIZE), device)["accuracy"]
    record(history, name, accuracy)
    keep_weights(node.state, history, name, model.state_dict(), cfg.nas_keep)
    history.save(node.state)
    macs = choice.candidate.macs
    forward_macs = macs * (stats.examples + public_seen)
    metrics = train_metrics(len(private.dataset), stats, stats.seconds, forward_macs) | {
        "nas-multiplier": choice.candidate.multiplier,
        "nas-macs": macs,
        "nas-score": choice.score,
        "nas-switched": int(choice.switched),
        "nas-warm-start": int(kept is not None),
        "nas-holdout-accuracy": accuracy,
    }
    return model, metrics


def train(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """FedKD-NAS: distil from the broadcast Z~ (none in a teacherless round 1), upload logits."""
    arrays = from_record(message.content[ARRAYS])
    model, metrics = local_round(message, cfg, node, arrays.get(TARGET))
    info = dataset_info(cfg)
    logits = predict_logits(model, public_images(cfg), info, resolve_device(cfg.device))
    return RecordDict({ARRAYS: to_record({LOGITS: logits}), METRICS: MetricRecord(metrics)})


def evaluate_student(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """Client evaluator: this node's current student (its last choice) on the named split. A
    node that was never sampled has no student and answers with zero examples (the server drops
    it)."""
    history = NasHistory.load(node.state)
    weights = warm_start(node.state, history.incumbent) if history.incumbent else None
    if weights is None:
        return no_model_reply()
    info = dataset_info(cfg)
    model = build_candidate(history.incumbent, info)
    load_state(model, weights)
    costs = candidate_costs(describe(history.incumbent, info, cfg.batch_size))
    return evaluation_reply(model, message, cfg, info, costs)
