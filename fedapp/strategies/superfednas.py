"""SuperFedNAS transfer (Khare et al.) on FEAST's supernet: the MaxNet-weighted sandwich over
random subnets of the whole space (fedapp.strategies.maxnet holds the shared mechanism)."""

from __future__ import annotations

from fedapp.strategies.maxnet import MaxNetStrategy, SpaceSampler


class SuperFedNasStrategy(MaxNetStrategy):
    """SuperFedNAS transfer: random subnets of the whole space."""

    method = "SuperFedNAS"
    sampler_type = SpaceSampler
