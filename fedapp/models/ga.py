"""Genetic search for the fittest architecture under a MAC limit: how FEAST builds its variant
cache and its post-hoc extractions.

The whole population is one integer matrix (rows: individuals, columns: d, e-index, w-index), so a
generation is a handful of numpy operations: tournament selection, single-point crossover,
per-gene mutation, repair of over-budget children and elitism. The search is deterministic for a
seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapp.models.arch import Arch, SupernetConfig
from fedapp.models.counter import count_population
from fedapp.models.fitness import fitness_terms


@dataclass(frozen=True)
class GAParams:
    """GA settings; the defaults are the ones the FEAST cache was built with."""

    population: int = 256
    generations: int = 512
    mutation: float = 0.3  # probability that a gene is redrawn
    tournament: int = 3
    elites: int = 2

    def __post_init__(self) -> None:
        if self.population < 2 or self.generations < 0 or not 0 <= self.mutation <= 1:
            raise ValueError(f"invalid GA settings {self}")
        if not 1 <= self.elites < self.population or self.tournament < 1:
            raise ValueError(f"invalid GA settings {self}")


@dataclass(frozen=True)
class SearchResult:
    """The fittest architecture found and its fitness terms."""

    arch: Arch
    macs: int
    params: int
    fitness: float
    entropy: float
    effectiveness: float
    mac_limit: float
    rho0: float
    seed: int


def smallest_macs(config: SupernetConfig) -> int:
    """MACs of the cheapest architecture in the space (all genes zero)."""
    macs, _ = count_population(config, np.zeros((1, config.num_genes), dtype=np.int64))
    return int(macs[0])


def _repair(
    config: SupernetConfig,
    genes: np.ndarray,
    mac_limit: float,
    rng: np.random.Generator,
    fallback: np.ndarray | None = None,
    rounds: int = 2,
) -> np.ndarray:
    """Make every row fit the MAC limit by shrinking one random gene at a time.

    Without ``fallback`` it shrinks until everything fits (the all-zero row always does); with one,
    rows still over budget after ``rounds`` shrinks take the fallback row (a feasible parent).
    """
    macs, _ = count_population(config, genes)
    bad = np.flatnonzero(macs > mac_limit)
    step = 0
    while bad.size and (fallback is None or step < rounds):
        rows = genes[bad]
        cols = (rng.random(rows.shape) * (rows > 0)).argmax(axis=1)
        picked = np.arange(bad.size)
        rows[picked, cols] = (rng.random(bad.size) * rows[picked, cols]).astype(np.int64)
        genes[bad] = rows
        macs, _ = count_population(config, rows)
        bad = bad[macs > mac_limit]
        step += 1
    if bad.size and fallback is not None:
        genes[bad] = fallback[bad]
    return genes


def search(
    config: SupernetConfig,
    mac_limit: float,
    rho0: float,
    seed: int,
    params: GAParams | None = None,
) -> SearchResult:
    """Run the GA once and return the fittest architecture within ``mac_limit``.

    It searches on the supernet's nominal counter (:meth:`SupernetConfig.nominal`): MAC limits,
    fitness and the result's MACs are those of the published figures, as in the FEAST authors'
    search, and a cache built from it is affordable by the same rule.
    """
    params = GAParams() if params is None else params
    config = config.nominal()
    floor = smallest_macs(config)
    if mac_limit < floor:
        raise ValueError(
            f"MAC limit {mac_limit:,.0f} is below the smallest architecture of "
            f"{config.name} ({floor:,} MACs)"
        )
    rng = np.random.default_rng(seed)
    high = config.gene_high
    n_genes = config.num_genes
    pop = _repair(
        config, (rng.random((params.population, n_genes)) * high).astype(np.int64), mac_limit, rng
    )
    n_children = params.population - params.elites
    positions = np.arange(n_genes)
    for _ in range(params.generations):
        fit = fitness_terms(config, pop, mac_limit, rho0).fitness
        elites = pop[np.argsort(-fit, kind="stable")[: params.elites]]
        contenders = rng.integers(0, params.population, size=(2, n_children, params.tournament))
        winners = np.take_along_axis(contenders, fit[contenders].argmax(axis=2)[..., None], axis=2)[
            ..., 0
        ]
        mother, father = pop[winners[0]], pop[winners[1]]
        cut = rng.integers(1, n_genes, size=n_children)
        children = np.where(positions[None, :] < cut[:, None], mother, father)
        mutate = rng.random(children.shape) < params.mutation
        redraw = (rng.random(children.shape) * high).astype(np.int64)
        children = _repair(
            config, np.where(mutate, redraw, children), mac_limit, rng, fallback=mother
        )
        pop = np.concatenate([elites, children])
    terms = fitness_terms(config, pop, mac_limit, rho0)
    best = int(np.argmax(terms.fitness))
    return SearchResult(
        arch=config.arch_from_genes(pop[best]),
        macs=int(terms.macs[best]),
        params=int(terms.params[best]),
        fitness=float(terms.fitness[best]),
        entropy=float(terms.entropy[best]),
        effectiveness=float(terms.effectiveness[best]),
        mac_limit=float(mac_limit),
        rho0=float(rho0),
        seed=int(seed),
    )
