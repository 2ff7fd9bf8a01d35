"""The DeepFedNAS training-free fitness, for whole populations at once.

The fitness rewards "entropy" (log feature-map volume times summed log conv widths per stage) and
effectiveness ``rho = L / geometric-mean width``, and penalises unbalanced depths and channel
counts that shrink from one stage to the next. Architectures over the MAC limit score ``-1e9``,
those over the effectiveness ceiling ``rho0`` score ``-1e8``, so feasible ones always win.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.models.arch import SupernetConfig
from fedapp.models.counter import count_population, geometry

INFEASIBLE_MACS = -1e9
INFEASIBLE_RHO = -1e8


@dataclass(frozen=True)
class FitnessTerms:
    """Fitness and its parts for a population (arrays of length P)."""

    fitness: np.ndarray
    entropy: np.ndarray
    effectiveness: np.ndarray
    macs: np.ndarray
    params: np.ndarray


def fitness_terms(
    config: SupernetConfig, genes: np.ndarray, mac_limit: float, rho0: float
) -> FitnessTerms:
    """DeepFedNAS fitness of every architecture in ``genes`` under a MAC limit and ``rho0``."""
    g = geometry(config, genes)
    macs, params = count_population(config, genes)
    depth = g.depth.astype(np.float64)
    log = np.log
    # Log widths (cin * k^2) of a stage's convs: first block conv1, conv2, projection; then
    # conv1 and conv2 of each further block.
    log_first = log(9.0 * g.cin) + log(9.0 * g.mid) + log(g.cin.astype(np.float64))
    log_other = log(9.0 * g.cout) + log(9.0 * g.mid)
    stage_log_width = log_first + depth * log_other
    entropy = (log((g.size**2) * g.cout.astype(np.float64)) * stage_log_width).sum(axis=1)

    stem_log_width = np.log(float(config.in_channels * config.stem_kernel**2))
    layers = 1.0 + (3.0 + 2.0 * depth).sum(axis=1)
    mean_log_width = (stem_log_width + stage_log_width.sum(axis=1)) / layers
    effectiveness = layers / np.exp(mean_log_width)

    depth_penalty = 10.0 * np.exp(np.var(1.0 + depth, axis=1))
    channel_penalty = np.clip(g.cout[:, :-1] - g.cout[:, 1:], 0, None).sum(axis=1)
    fitness = entropy - depth_penalty + 1000.0 * effectiveness - channel_penalty
    fitness = np.where(effectiveness > rho0, INFEASIBLE_RHO, fitness)
    fitness = np.where(macs > mac_limit, INFEASIBLE_MACS, fitness)
    return FitnessTerms(
        fitness=fitness, entropy=entropy, effectiveness=effectiveness, macs=macs, params=params
    )
