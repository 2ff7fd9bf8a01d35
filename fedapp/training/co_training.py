"""FEAST's co-training plan (paper Alg. 2): which cached variants train on each mini-batch, and
their gradients with in-place distillation from the largest affordable one.

The SuperFedNAS/DeepFedNAS transfers train one assigned subnet through the same plan
(:meth:`CoTrainingPlan.single`); the server uses the plan to count a client's passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedapp.data.transforms import mixed_cross_entropy
from fedapp.models.cache import Variant, VariantCache
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.training.loops import Gradients, StepOutcome


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

    @property
    def trained(self) -> tuple[Variant, ...]:
        """Every variant some mini-batch of this plan trains (the random one drawn among the
        intermediates)."""
        if self.rule == "min" or self.largest == self.smallest:
            return (self.smallest,)
        if self.rule == "max":
            return (self.largest,)
        return (self.smallest, self.largest, *(self.intermediates if self.rule == "full" else ()))

    @property
    def draws_intermediate(self) -> bool:
        """Whether every mini-batch adds a random intermediate variant to the fixed passes."""
        return self.rule == "full" and bool(self.intermediates)

    def fixed_passes(self) -> list[Pass]:
        """The passes every mini-batch runs, in order (the teacher first)."""
        low, high = Pass(self.smallest, False), Pass(self.largest, False)
        if self.rule == "min" or self.largest == self.smallest:
            return [low]
        if self.rule == "max":
            return [high]
        if self.rule == "min-max":
            return [high, low]
        return [Pass(self.largest, False, teacher=True), Pass(self.smallest, True)]

    def passes(self, generator: torch.Generator) -> list[Pass]:
        """This mini-batch's passes in order (the teacher first); draws the random one."""
        passes = self.fixed_passes()
        if self.draws_intermediate:
            pick = int(torch.randint(len(self.intermediates), (1,), generator=generator))
            passes.append(Pass(self.intermediates[pick], True))
        return passes

    @property
    def least_forward_macs(self) -> int:
        """Forward MACs of one mini-batch's passes at the least (the random one at the
        cheapest intermediate): what the server can hold a client's reported work to."""
        fixed = sum(p.variant.macs for p in self.fixed_passes())
        return fixed + (min(v.macs for v in self.intermediates) if self.draws_intermediate else 0)


def plan_for(cache: VariantCache, affordable: Sequence[int], rule: str) -> CoTrainingPlan:
    """The plan of a client with the given affordable cache indices."""
    variants = cache.variants
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
