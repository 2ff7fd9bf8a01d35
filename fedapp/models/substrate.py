"""The run's ResNet18 substrate for the weight-sharing baselines (HeteroFL, ScaleFL, FIARSE).

The substrate is a configuration of the elastic ResNet family (``conf/supernets/resnet18-*.yaml``)
sized for the data set like FEAST's supernet (``fedapp.run.run_models.substrate_config``), so server
and clients derive identical tensor shapes from the run config alone. A baseline's width level is
the architecture "every position at one width multiplier, full depth"; its tensors are leading
slices of the full model's.
"""

from __future__ import annotations

import math

from fedapp.models.arch import Arch, SupernetConfig


def width_arch(config: SupernetConfig, rate: float) -> Arch:
    """All stages (and the stem) at width multiplier ``rate``, every block present."""
    matches = [
        i for i, m in enumerate(config.width_multipliers) if math.isclose(m, rate, abs_tol=1e-9)
    ]
    if not matches:
        choices = ", ".join(f"{m:g}" for m in config.width_multipliers)
        raise ValueError(f"width multiplier {rate:g} is not one of {config.name}'s: {choices}")
    s = config.num_stages
    return Arch(
        d=(config.max_extra_blocks,) * s,
        e=(config.expand_ratios[-1],) * s,
        w=(matches[0],) * (s + 1),
    )
