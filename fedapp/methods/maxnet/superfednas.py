"""SuperFedNAS transfer (Khare et al.) on FEAST's supernet: the MaxNet-weighted sandwich over
random subnets of the whole space (fedapp.methods.maxnet.server holds the shared mechanism)."""

from __future__ import annotations

from fedapp.methods.maxnet.server import MaxNetStrategy, SpaceSampler


class SuperFedNasStrategy(MaxNetStrategy):
    """SuperFedNAS transfer: random subnets of the whole space."""

    method = "SuperFedNAS"
    sampler_type = SpaceSampler
