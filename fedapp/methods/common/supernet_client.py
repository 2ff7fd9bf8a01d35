"""The supernet client half: local epochs of a co-training plan on a sub-supernet loaded from the
payload. FEAST trains its routed slice so (several passes); SuperFedNAS and DeepFedNAS train their
assigned subnet so (one pass)."""

from __future__ import annotations

import time

from flwr.app import Message, MetricRecord, RecordDict

from fedapp.methods.common.kept_modules import elastic_network
from fedapp.methods.common.local_round import local_sgd, train_local_epochs
from fedapp.models.arch import Arch
from fedapp.run.context import RunContext
from fedapp.run.feast_space import model_space
from fedapp.run.profiles import LocalNode
from fedapp.training.co_training import CoTrainingPlan, co_training_gradients
from fedapp.training.train_metrics import train_metrics
from fedapp.wire.messages import ARRAYS, METRICS
from fedapp.wire.records import load_into, to_record


def train_plan(
    message: Message,
    run: RunContext,
    node: LocalNode,
    bounds: Arch,
    plan: CoTrainingPlan,
    kd_weight: float,
) -> RecordDict:
    """Local epochs of ``plan`` on the sub-supernet ``bounds`` loaded from the payload (distilled
    passes weigh the teacher's KD by ``kd_weight``); the reply holds its whole tensor set, the
    loss, and the compute proxy (3 x forward MACs x examples)."""
    started = time.perf_counter()
    info = run.info
    space = model_space(run.feast_space, info)
    model = elastic_network(space.config, bounds)
    load_into(model, message.content[ARRAYS])
    generator, loader, optimizer = local_sgd(model, message, run, node)
    gradients = co_training_gradients(model, plan, generator, kd_weight)
    stats = train_local_epochs(model, loader, optimizer, gradients, run.training, generator)
    seconds = time.perf_counter() - started
    metrics = MetricRecord(
        train_metrics(len(loader.dataset), stats, seconds, stats.forward_macs)
        | {"passes": plan.num_passes}
    )
    return RecordDict({ARRAYS: to_record(model.state_dict()), METRICS: metrics})
