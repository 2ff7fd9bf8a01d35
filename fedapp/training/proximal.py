"""The proximal pull of a model towards an anchor (Ditto's personal models, FedProx's local
update): mu * (w - anchor) added to every gradient before each step, the gradient of
mu / 2 * ||w - anchor||^2."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def add_proximal_term(
    optimizer: torch.optim.Optimizer, anchor: Sequence[torch.Tensor], mu: float
) -> None:
    """Before every step of ``optimizer``, add mu * (w - anchor) to each parameter's gradient
    (``anchor``: one tensor per parameter, in parameter order)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(params) != len(anchor):
        raise ValueError(f"{len(params)} parameters but {len(anchor)} anchor tensors")

    def pull(*_: object) -> None:
        with torch.no_grad():
            for param, target in zip(params, anchor, strict=True):
                if param.grad is not None:
                    param.grad.add_(param - target, alpha=mu)

    optimizer.register_step_pre_hook(pull)
