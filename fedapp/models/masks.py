"""FIARSE's importance-aware masks: magnitude top-k over a whole model, and the biased gradient.

Importance is parameter magnitude. The masked tensors are the parameters of every convolution and
linear layer (weights, and biases where a layer has one, as the authors mask them); batch-norm
parameters and statistics are never masked. A sub-model is one scalar threshold ``t`` shared by
every masked tensor: a value is kept when ``|w| >= t``. A budget picks ``t`` through MACs:

* each masked value costs, per example, the MACs its layer spends on it: a convolution weight
  one multiply-accumulate per output position (``Hout * Wout``), a linear weight one, a bias none.
  So a layer's *effective* MACs are its dense MACs times its kept fraction, computed per layer,
  and a mask's effective MACs are their sum (the full model's equal the analytic counter's);
* a MAC level ``L`` keeps the longest run of values in descending magnitude whose effective MACs
  stay <= ``L`` (a tie at the cut is dropped whole, so ``|w| >= t`` keeps exactly that run). A
  client with budget ``B`` gets ``L = min(B, full MACs)``: it keeps the fraction
  ``min(1, B / full MACs)`` of the full model's MACs (never more), and the parameters that buys.
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


def masked_names(model: nn.Module) -> list[str]:
    """State names of the masked tensors: every parameter of a convolution or linear layer."""
    return [
        f"{prefix}.{leaf}" if prefix else leaf
        for prefix, module in model.named_modules()
        if isinstance(module, nn.Conv2d | nn.Linear)
        for leaf, _ in module.named_parameters(recurse=False)
    ]


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
    """The fraction of the full model's MACs a budget affords, capped at 1."""
    return min(1.0, float(budget) / float(full_macs))


@dataclass(frozen=True)
class MaskFamily:
    """All magnitude top-k masks of one global state, indexed by MAC level.

    Built once per global state (one sort of every masked value); each threshold is then a binary
    search over the cumulative effective MACs of the values in descending magnitude.
    """

    costs: dict[str, int]
    magnitudes: dict[str, np.ndarray]  # |w| of each masked tensor (flattened)
    descending: np.ndarray  # every masked magnitude, largest first
    cumulative_macs: np.ndarray  # effective MACs of the first k+1 values of ``descending``
    full_macs: int

    @classmethod
    def of(cls, state: State, costs: Mapping[str, int]) -> MaskFamily:
        magnitudes = {n: np.abs(np.asarray(state[n], np.float32)).ravel() for n in costs}
        scores = np.concatenate(list(magnitudes.values()))
        cost = np.concatenate([np.full(v.size, costs[n], np.int64) for n, v in magnitudes.items()])
        order = np.argsort(-scores, kind="stable")
        cumulative = np.cumsum(cost[order])
        return cls(dict(costs), magnitudes, scores[order], cumulative, int(cumulative[-1]))

    def threshold(self, level_macs: float) -> float:
        """The largest-magnitude mask whose effective MACs are <= ``level_macs`` (inf: none)."""
        k = int(np.searchsorted(self.cumulative_macs, level_macs, side="right"))
        if k < len(self.descending) and k > 0 and self.descending[k] == self.descending[k - 1]:
            # A tie at the cut: |w| >= t would keep all of it, so drop the tied values whole.
            k = int(np.searchsorted(-self.descending, -self.descending[k - 1], side="left"))
        return float(self.descending[k - 1]) if k > 0 else float("inf")

    def threshold_for_budget(self, budget: float) -> float:
        """A client's threshold: it keeps ``mac_fraction(budget)`` of the full model's MACs."""
        return self.threshold(mac_fraction(budget, self.full_macs) * self.full_macs)

    def kept_counts(self, threshold: float) -> dict[str, int]:
        """Number of kept values of each masked tensor."""
        return {n: int(np.count_nonzero(m >= threshold)) for n, m in self.magnitudes.items()}

    def effective_macs(self, threshold: float) -> int:
        """Sum over layers of dense MACs x kept fraction (= kept values x their cost)."""
        return sum(k * self.costs[n] for n, k in self.kept_counts(threshold).items())

    def kept_values(self, threshold: float) -> int:
        """Masked-tensor values the mask keeps."""
        return sum(self.kept_counts(threshold).values())


def apply_mask(
    state: State, names: list[str] | set[str], threshold: float
) -> dict[str, np.ndarray]:
    """A copy of ``state`` with the masked tensors' values below the threshold set to zero."""
    names = set(names)
    return {
        n: np.where(np.abs(v) >= threshold, v, np.zeros_like(v)) if n in names else v.copy()
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
    model: nn.Module, names: list[str] | set[str], threshold: float
) -> dict[str, torch.Tensor]:
    """The model's parameters with the named ones masked, for ``torch.func.functional_call``."""
    names = set(names)
    return {
        n: masked_weight(p, threshold) if n in names else p for n, p in model.named_parameters()
    }


def full_model(config: SupernetConfig, seed: int = 0) -> ElasticResNet:
    """The whole substrate at full width and depth (seeded init; clients load over it)."""
    return ElasticResNet(config, seed=seed)
