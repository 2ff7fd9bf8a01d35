"""FEAST client: local multi-variant co-training on the routed sub-supernet (paper Alg. 2).

Per mini-batch, one mixed batch (Mixup or CutMix) is reused for every pass. The local largest
affordable variant trains first on the supervised loss and its detached softmax becomes the
teacher; then the cache-wide smallest variant and a random intermediate one (redrawn every
mini-batch) train on (1 - rho) * supervised + rho * KD. Gradients of all passes add up, their
norm is clipped, and one SGD step follows. The client returns its whole routed tensor set.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from flwr.app import Message, MetricRecord, RecordDict

from fedapp.clients.reply_metrics import train_metrics
from fedapp.clients.training import (
    Gradients,
    StepOutcome,
    local_sgd,
    train_local_epochs,
)
from fedapp.config import RunConfig
from fedapp.data.transforms import mixed_cross_entropy
from fedapp.feast_space import ModelSpace, model_space
from fedapp.federated_data import population
from fedapp.messages import ARRAYS, CONFIG, METRICS, load_into, to_record
from fedapp.models.arch import Arch
from fedapp.models.cache import Variant
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.models.routing import envelope
from fedapp.profiles import LocalNode


@dataclass(frozen=True)
class Pass:
    """One variant trained on a mini-batch; ``distil`` adds KD from the batch's teacher."""

    variant: Variant
    distil: bool
    teacher: bool = False


@dataclass(frozen=True)
class CoTrainingPlan:
    """Which variants a client trains, by the training rule and its affordable set."""

    smallest: Variant  # cache-wide a_min
    largest: Variant  # largest affordable a_max
    intermediates: tuple[Variant, ...]  # affordable, MACs strictly between the two
    rule: str

    @classmethod
    def single(cls, variant: Variant) -> CoTrainingPlan:
        """Plain supervised training of one variant: one pass per mini-batch, no KD."""
        return cls(variant, variant, (), "max")

    @property
    def num_passes(self) -> int:
        """Variants trained per mini-batch (1, 2 or 3)."""
        if self.rule in ("min", "max") or self.largest == self.smallest:
            return 1
        return 3 if self.rule == "full" and self.intermediates else 2

    def passes(self, generator: torch.Generator) -> list[Pass]:
        """This mini-batch's passes in order (the teacher first); draws the random one."""
        low, high = Pass(self.smallest, False), Pass(self.largest, False)
        if self.rule == "min" or self.largest == self.smallest:
            return [low]
        if self.rule == "max":
            return [high]
        if self.rule == "min-max":
            return [high, low]
        passes = [Pass(self.largest, False, teacher=True), Pass(self.smallest, True)]
        if self.rule == "full" and self.intermediates:
            pick = int(torch.randint(len(self.intermediates), (1,), generator=generator))
            passes.append(Pass(self.intermediates[pick], True))
        return passes


def plan_for(space: ModelSpace, affordable: Sequence[int], rule: str) -> CoTrainingPlan:
    """The plan of a client with the given affordable cache indices."""
    variants = space.cache.variants
    smallest, largest = variants[0], variants[max(affordable)]
    between = tuple(
        variants[i]
        for i in sorted(affordable)
        if smallest.nominal_macs < variants[i].nominal_macs < largest.nominal_macs
    )
    return CoTrainingPlan(smallest, largest, between, rule)


def co_training_gradients(
    model: ElasticResNet, plan: CoTrainingPlan, generator: torch.Generator, kd_weight: float
) -> Gradients:
    """Every pass of the plan on one (mixed) mini-batch, accumulating gradients; reports the
    first pass's supervised loss and the forward MACs of all passes."""

    def gradients(x: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float) -> StepOutcome:
        teacher: torch.Tensor | None = None
        first_loss, macs = 0.0, 0
        for index, step in enumerate(plan.passes(generator)):
            model.activate(step.variant.arch)
            logits = model(x)
            loss = mixed_cross_entropy(logits, y_a, y_b, lam)
            if index == 0:
                first_loss = loss.item()
            if step.distil:
                if teacher is None:
                    raise RuntimeError("a distilled pass needs the teacher pass before it")
                kd = -(teacher * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()
                loss = (1 - kd_weight) * loss + kd_weight * kd
            loss.backward()
            if step.teacher:
                teacher = torch.softmax(logits.detach(), dim=1)
            macs += step.variant.macs
        return StepOutcome(first_loss, macs)

    return gradients


def train(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """One round: rebuild the routed sub-supernet from the payload, co-train, send it back."""
    space = model_space(cfg, population(cfg).info)
    config = message.content[CONFIG]
    affordable = [int(i) for i in config["affordable"]]
    plan = plan_for(space, affordable, cfg.training_rule)
    bounds = (
        envelope(space.config, [space.cache.variants[i].arch for i in affordable])
        if bool(config["routed"])
        else space.config.max_arch()
    )
    return train_plan(message, cfg, node, bounds, plan)


def train_plan(
    message: Message, cfg: RunConfig, node: LocalNode, bounds: Arch, plan: CoTrainingPlan
) -> RecordDict:
    """Local epochs of ``plan`` on the sub-supernet ``bounds`` loaded from the payload; the reply
    holds its whole tensor set, the loss, and the compute proxy (3 x forward MACs x examples)."""
    started = time.perf_counter()
    info = population(cfg).info
    space = model_space(cfg, info)
    model = ElasticResNet(space.config, bounds)
    load_into(model, message.content[ARRAYS])
    generator, loader, optimizer = local_sgd(model, message, cfg, node, info)
    gradients = co_training_gradients(model, plan, generator, cfg.kd_weight)
    stats = train_local_epochs(model, loader, optimizer, gradients, cfg, generator)
    seconds = time.perf_counter() - started
    metrics = MetricRecord(
        train_metrics(len(loader.dataset), stats, seconds, stats.forward_macs)
        | {"passes": plan.num_passes}
    )
    return RecordDict({ARRAYS: to_record(model.state_dict()), METRICS: metrics})
