"""FEAST client: local multi-variant co-training on the routed sub-supernet (paper Alg. 2).

Per mini-batch, one mixed batch (Mixup or CutMix) is reused for every pass. The local largest
affordable variant trains first on the supervised loss and its detached softmax becomes the
teacher; then the cache-wide smallest variant and a random intermediate one (redrawn every
mini-batch) train on (1 - rho) * supervised + rho * KD. Gradients of all passes add up, their
norm is clipped, and one SGD step follows. The client returns its whole routed tensor set.
"""

from __future__ import annotations

import time

from flwr.app import Message, MetricRecord, RecordDict

from fedapp.clients.kept_modules import elastic_network
from fedapp.clients.local_round import local_sgd, train_local_epochs
from fedapp.config import RunConfig
from fedapp.feast_space import model_space
from fedapp.federated_data import dataset_info
from fedapp.messages import AFFORDABLE, ARRAYS, CONFIG, METRICS, ROUTED
from fedapp.models.arch import Arch
from fedapp.models.routing import envelope
from fedapp.profiles import LocalNode
from fedapp.records import load_into, to_record
from fedapp.settings.feast import FeastSettings
from fedapp.training.co_training import CoTrainingPlan, co_training_gradients, plan_for
from fedapp.training.train_metrics import train_metrics


def train(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """One round: rebuild the routed sub-supernet from the payload, co-train, send it back."""
    space = model_space(cfg, dataset_info(cfg))
    config = message.content[CONFIG]
    affordable = [int(i) for i in config[AFFORDABLE]]
    plan = plan_for(space.cache, affordable, cfg.section(FeastSettings).training_rule)
    bounds = (
        envelope(space.config, [space.cache.variants[i].arch for i in affordable])
        if bool(config[ROUTED])
        else space.config.max_arch()
    )
    return train_plan(message, cfg, node, bounds, plan)


def train_plan(
    message: Message, cfg: RunConfig, node: LocalNode, bounds: Arch, plan: CoTrainingPlan
) -> RecordDict:
    """Local epochs of ``plan`` on the sub-supernet ``bounds`` loaded from the payload; the reply
    holds its whole tensor set, the loss, and the compute proxy (3 x forward MACs x examples)."""
    started = time.perf_counter()
    info = dataset_info(cfg)
    space = model_space(cfg, info)
    model = elastic_network(space.config, bounds)
    load_into(model, message.content[ARRAYS])
    generator, loader, optimizer = local_sgd(model, message, cfg, node, info)
    gradients = co_training_gradients(model, plan, generator, cfg.section(FeastSettings).kd_weight)
    stats = train_local_epochs(model, loader, optimizer, gradients, cfg, generator)
    seconds = time.perf_counter() - started
    metrics = MetricRecord(
        train_metrics(len(loader.dataset), stats, seconds, stats.forward_macs)
        | {"passes": plan.num_passes}
    )
    return RecordDict({ARRAYS: to_record(model.state_dict()), METRICS: metrics})
