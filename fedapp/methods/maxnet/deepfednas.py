"""DeepFedNAS transfer on FEAST's supernet: the MaxNet-weighted sandwich over subnets along the
cached Pareto path (fedapp.methods.maxnet.server holds the shared mechanism)."""

from __future__ import annotations

from fedapp.methods.maxnet.server import MaxNetStrategy, PathSampler


class DeepFedNasStrategy(MaxNetStrategy):
    """DeepFedNAS transfer: subnets along the cached Pareto path."""

    method = "DeepFedNAS"
    sampler_type = PathSampler
