"""FIARSE's importance-aware masks: magnitude top-k, sized by MACs or parameters, and the biased
gradient.

Importance is parameter magnitude. The masked tensors are the parameters of every convolution and
linear layer (weights, and biases where a layer has one, as the authors mask them); batch-norm
parameters and statistics are never masked. A sub-model keeps the values with ``|w| >= t``, with
one threshold per masked tensor. A budget ``B`` gives the fraction ``f = min(1, B / full MACs)``
of the full model, and two conventions say what ``f`` is a fraction of (``measure``):

* ``"macs"`` (fedapp): each masked value costs, per example, the MACs its layer spends on it (a
  convolution weight one multiply-accumulate per output position ``Hout * Wout``, a linear weight
  one, a bias none), and the mask keeps values whose *effective MACs* (per layer, dense MACs times
  kept fraction, summed) stay <= ``f * full MACs``: it never costs more than the budget;
* ``"params"`` (the FEAST authors' FIARSE port, after the authors' ``--model-size``): the mask
  keeps ``int(f * N)`` of the ``N`` masked values, whatever they cost.

and two rules say where the kept values are chosen (``topk``):

* ``"global"`` (the authors' ``generate_mask``): one ranking over every masked value, one
  threshold for all (a tie at the cut is dropped whole, so ``|w| >= t`` keeps exactly that run);
* ``"layerwise"`` (the authors' ``fiarse_layerwise``): one ranking per top-level group (stem,
  each stage, head), each keeping ``f`` of its own MACs or values.

**The classifier is never fully masked.** With one global ranking, the head's values compete with
every convolution's, and whether any survives a small budget depends on the initialisation
(Kaiming fan-out convolutions against PyTorch's default linear init keep none at the smallest
budgets). So each classifier tensor keeps at least its own top ``max(1, int(f * numel))`` values
(the share a layer-wise top-k would give it). Where the ranking alone keeps fewer, these values
are set aside first and (global rule) the shared ranking fills the rest of the budget, so the
mask still fits ``f``; where it keeps that many already, the mask is the authors' unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedapp.models.arch import SupernetConfig
from fedapp.models.elastic_resnet import ElasticResNet

State = Mapping[str, np.ndarray]
#: What a budget's fraction counts: effective MACs or masked values.
MEASURES = ("macs", "params")
#: Where kept values are ranked: over the whole model or per top-level group.
TOPK_RULES = ("global", "layerwise")
#: A mask: the threshold of every masked tensor (keep ``|w| >= t``).
Thresholds = dict[str, float]


def masked_names(model: nn.Module) -> list[str]:
    """State names of the masked tensors: every parameter of a convolution or linear layer."""
    return [
        f"{prefix}.{leaf}" if prefix else leaf
        for prefix, module in model.named_modules()
        if isinstance(module, nn.Conv2d | nn.Linear)
        for leaf, _ in module.named_parameters(recurse=False)
    ]


def classifier_names(model: nn.Module) -> list[str]:
    """State names of the classifier: the parameters of the model's last linear layer."""
    linear = [p for p, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linear:
        return []
    prefix = linear[-1]
    module = model.get_submodule(prefix)
    return [
        f"{prefix}.{leaf}" if prefix else leaf for leaf, _ in module.named_parameters(recurse=False)
    ]


def group_of(name: str) -> str:
    """The top-level group of a state name for the layer-wise rule: ``stages.<j>`` or the first
    component (``stem``, ``head``), like the authors' ``conv1, layer1..4, linear``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "stages" and len(parts) > 1 else parts[0]


@torch.no_grad()
def value_costs(model: nn.Module, example: torch.Tensor) -> dict[str, int]:
    """MACs per example that one value of each masked tensor costs (weights: output positions of
    their layer; biases: 0), read from one forward pass of ``example`` (a batch of one)."""
    positions: dict[str, int] = {}
    hooks = [
        module.register_forward_hook(
            lambda _m, _i, out, name=name: positions.__setitem__(
                name, int(np.prod(out.shape[2:])) if out.dim() > 2 else 1
            )
        )
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d | nn.Linear)
    ]
    was_training = model.training
    try:
        model.eval()(example)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    costs = {}
    for name in masked_names(model):
        layer, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        costs[name] = positions[layer] if leaf == "weight" else 0
    return costs


def mac_fraction(budget: float, full_macs: int) -> float:
    """The fraction of the full model a budget affords, capped at 1."""
    return min(1.0, float(budget) / float(full_macs))


@dataclass(frozen=True)
class Ranking:
    """Some masked values in descending magnitude, with the cumulative cost of the first k."""

    descending: np.ndarray
    cumulative: np.ndarray

    @classmethod
    def of(cls, magnitudes: list[np.ndarray], unit_costs: list[int]) -> Ranking:
        scores = np.concatenate(magnitudes)
        cost = np.concatenate(
            [np.full(m.size, c, np.int64) for m, c in zip(magnitudes, unit_costs, strict=True)]
        )
        order = np.argsort(-scores, kind="stable")
        return cls(scores[order], np.cumsum(cost[order]))

    @property
    def total(self) -> int:
        return int(self.cumulative[-1]) if len(self.cumulative) else 0

    def threshold(self, limit: float) -> float:
        """The threshold keeping the longest run whose cost is <= ``limit`` (inf: none)."""
        k = int(np.searchsorted(self.cumulative, limit, side="right"))
        if k < len(self.descending) and k > 0 and self.descending[k] == self.descending[k - 1]:
            # A tie at the cut: |w| >= t would keep all of it, so drop the tied values whole.
            k = int(np.searchsorted(-self.descending, -self.descending[k - 1], side="left"))
        return float(self.descending[k - 1]) if k > 0 else float("inf")


def _uniform(names: list[str], threshold: float | Mapping[str, float]) -> Mapping[str, float]:
    return dict.fromkeys(names, threshold) if isinstance(threshold, int | float) else threshold


@dataclass(frozen=True)
class MaskFamily:
    """All magnitude top-k masks of one global state under one convention.

    Built once per global state (one sort of the masked values per ranking); a mask is then a
    binary search per ranking. ``threshold(level)`` is the plain global top-k by effective MACs.
    """

    costs: dict[str, int]
    magnitudes: dict[str, np.ndarray]  # |w| of each masked tensor (flattened)
    by_macs: Ranking  # every masked value, cost = its MACs
    full_macs: int
    measure: str = "macs"
    topk: str = "global"
    classifier: tuple[str, ...] = ()
    rankings: tuple[tuple[tuple[str, ...], Ranking], ...] = ()  # (names, ranking in ``measure``)

    @classmethod
    def of(
        cls,
        state: State,
        costs: Mapping[str, int],
        *,
        measure: str = "macs",
        topk: str = "global",
        classifier: tuple[str, ...] | list[str] = (),
    ) -> MaskFamily:
        if measure not in MEASURES or topk not in TOPK_RULES:
            raise ValueError(
                f"mask measure {measure!r} / top-k {topk!r}: {MEASURES} / {TOPK_RULES}"
            )
        magnitudes = {n: np.abs(np.asarray(state[n], np.float32)).ravel() for n in costs}
        names = list(magnitudes)
        by_macs = Ranking.of([magnitudes[n] for n in names], [costs[n] for n in names])
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(group_of(n) if topk == "layerwise" else "", []).append(n)
        unit = (lambda n: costs[n]) if measure == "macs" else (lambda n: 1)
        rankings = tuple(
            (
                tuple(g),
                by_macs  # the global ranking by MACs is the same sort: not sorted twice
                if topk == "global" and measure == "macs"
                else Ranking.of([magnitudes[n] for n in g], [unit(n) for n in g]),
            )
            for g in groups.values()
        )
        return cls(
            dict(costs),
            magnitudes,
            by_macs,
            by_macs.total,
            measure,
            topk,
            tuple(classifier),
            rankings,
        )

    def unit(self, name: str) -> int:
        """What one value of a tensor costs in the family's measure."""
        return self.costs[name] if self.measure == "macs" else 1

    def threshold(self, level_macs: float) -> float:
        """The plain global top-k whose effective MACs are <= ``level_macs`` (inf: none)."""
        return self.by_macs.threshold(level_macs)

    def mask(self, fraction: float) -> Thresholds:
        """The mask keeping ``fraction`` of the full model (in the family's measure and top-k
        rule), with the classifier's floor."""
        floor = {}
        for name in self.classifier:
            values = np.sort(self.magnitudes[name])[::-1]
            floor[name] = float(values[max(1, int(fraction * values.size)) - 1])
        thresholds = self._ranked(fraction, reserved=0)
        if all(thresholds[n] <= t for n, t in floor.items()):
            return thresholds  # the ranking alone keeps the classifier's share
        # Set the floor's values aside first; the ranking fills the rest of the budget.
        reserved = sum(
            int(np.count_nonzero(self.magnitudes[n] >= t)) * self.unit(n) for n, t in floor.items()
        )
        thresholds = self._ranked(fraction, reserved)
        return thresholds | {n: min(thresholds[n], t) for n, t in floor.items()}

    def _ranked(self, fraction: float, reserved: int) -> Thresholds:
        """Each ranking's threshold at ``fraction`` of its cost (less ``reserved`` if global)."""
        thresholds: Thresholds = {}
        for names, ranking in self.rankings:
            limit = fraction * ranking.total - (reserved if self.topk == "global" else 0)
            thresholds |= dict.fromkeys(names, ranking.threshold(limit))
        return thresholds

    def mask_for_budget(self, budget: float) -> Thresholds:
        """A client's mask: the fraction ``min(1, budget / full MACs)`` of the full model."""
        return self.mask(mac_fraction(budget, self.full_macs))

    def kept_counts(self, thresholds: float | Mapping[str, float]) -> dict[str, int]:
        """Number of kept values of each masked tensor (one threshold for all, or per tensor)."""
        t = _uniform(list(self.magnitudes), thresholds)
        return {n: int(np.count_nonzero(m >= t[n])) for n, m in self.magnitudes.items()}

    def effective_macs(self, thresholds: float | Mapping[str, float]) -> int:
        """Sum over layers of dense MACs x kept fraction (= kept values x their cost)."""
        return sum(k * self.costs[n] for n, k in self.kept_counts(thresholds).items())

    def kept_values(self, thresholds: float | Mapping[str, float]) -> int:
        """Masked-tensor values the mask keeps."""
        return sum(self.kept_counts(thresholds).values())

    def kept_fraction(self, thresholds: float | Mapping[str, float]) -> float:
        """Kept share of the masked values (the authors' ``generate_mask`` return value)."""
        return self.kept_values(thresholds) / sum(m.size for m in self.magnitudes.values())


def apply_mask(
    state: State, names: list[str] | set[str], thresholds: float | Mapping[str, float]
) -> dict[str, np.ndarray]:
    """A copy of ``state`` with the masked tensors' values below their threshold set to zero."""
    t = _uniform(list(names), thresholds)
    return {
        n: np.where(np.abs(v) >= t[n], v, np.zeros_like(v)) if n in t else v.copy()
        for n, v in state.items()
    }


class ThresholdMask(torch.autograd.Function):
    """``m = 1[s >= t]`` for scores ``s = |w|``, with FIARSE's threshold-controlled gradient.

    Backward treats ``m`` as the surrogate ``(s - t) / (s + t)`` on kept entries only:
    ``dm/ds = 2t / (s + t)^2 * m`` (nan/inf become 0). Through ``w * m(|w|)`` a kept weight's
    gradient is ``g * (1 + 2t|w| / (|w| + t)^2)``: 1.5x at the threshold, -> 1x far above it,
    so weights near the cut are pushed harder; masked weights get exactly zero.
    """

    @staticmethod
    def forward(ctx, scores: torch.Tensor, threshold: float) -> torch.Tensor:  # type: ignore[override]
        mask = (scores >= threshold).to(scores.dtype)
        ctx.save_for_backward(scores, mask)
        ctx.threshold = threshold
        return mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        scores, mask = ctx.saved_tensors
        t = ctx.threshold
        slope = torch.nan_to_num(2 * t / (scores + t) ** 2, nan=0.0, posinf=0.0, neginf=0.0)
        return grad * slope * mask, None


def masked_weight(weight: torch.Tensor, threshold: float) -> torch.Tensor:
    """``w * m(|w|)``: what a masked layer computes with; gradients follow FIARSE's rule."""
    return weight * ThresholdMask.apply(weight.abs(), threshold)


def masked_parameters(
    model: nn.Module, names: list[str] | set[str], thresholds: float | Mapping[str, float]
) -> dict[str, torch.Tensor]:
    """The model's parameters with the named ones masked (one threshold for all, or per tensor),
    for ``torch.func.functional_call``."""
    t = _uniform(list(names), thresholds)
    return {n: masked_weight(p, t[n]) if n in t else p for n, p in model.named_parameters()}


def full_model(config: SupernetConfig, seed: int = 0) -> ElasticResNet:
    """The whole substrate at full width and depth (seeded init; clients load over it)."""
    return ElasticResNet(config, seed=seed)
