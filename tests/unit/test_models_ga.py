"""DeepFedNAS fitness (reproduces the reference cache's columns) and the vectorised GA."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedapp.models.arch import Arch, load_supernet
from fedapp.models.fitness import INFEASIBLE_MACS, INFEASIBLE_RHO, fitness_terms
from fedapp.models.ga import GAParams, search, smallest_macs

REFERENCE_CSV = Path(__file__).resolve().parents[1] / "data" / "feast_cache_cifar100_reference.csv"
FAST = GAParams(population=48, generations=30)


def test_fitness_reproduces_the_reference_cache_columns() -> None:
    """The authors' fitness sees their counter's middle channels (the nominal rule)."""
    config = load_supernet("feast-cifar100", num_classes=10).nominal()
    with REFERENCE_CSV.open() as handle:
        rows = list(csv.DictReader(handle))
    genes = np.array(
        [
            config.genes(Arch(*(tuple(json.loads(r[k])) for k in ("d", "e", "w_indices"))))
            for r in rows
        ]
    )
    terms = fitness_terms(config, genes, mac_limit=1e12, rho0=1.0)
    for column, values in (
        ("fitness_score", terms.fitness),
        ("effectiveness", terms.effectiveness),
        ("entropy", terms.entropy),
    ):
        expected = np.array([float(r[column]) for r in rows])
        np.testing.assert_allclose(values, expected, rtol=1e-9, err_msg=column)


def test_infeasible_architectures_score_the_penalties() -> None:
    config = load_supernet("feast-cifar100")
    genes = np.array([config.genes(config.max_arch())])
    assert fitness_terms(config, genes, 1e6, 1.0).fitness[0] == INFEASIBLE_MACS
    assert fitness_terms(config, genes, 1e12, 0.0).fitness[0] == INFEASIBLE_RHO


def test_search_respects_the_limit_and_is_deterministic_for_a_seed() -> None:
    config = load_supernet("feast-cifar100")
    a = search(config, 25e6, 0.40, seed=42, params=FAST)
    b = search(config, 25e6, 0.40, seed=42, params=FAST)
    c = search(config, 25e6, 0.40, seed=43, params=FAST)
    assert a == b and a.seed == 42
    for r in (a, c):
        assert r.macs <= 25e6 and r.effectiveness <= 0.40 and r.fitness > 0


def test_search_improves_on_its_initial_population() -> None:
    config = load_supernet("feast-cifar100")
    start = search(config, 300e6, 0.31, seed=0, params=GAParams(population=48, generations=0))
    evolved = search(config, 300e6, 0.31, seed=0, params=GAParams(population=48, generations=60))
    assert evolved.fitness >= start.fitness


def test_limit_below_the_smallest_architecture_is_refused() -> None:
    config = load_supernet("feast-cifar100")
    floor = smallest_macs(config)
    with pytest.raises(ValueError, match="below the smallest architecture"):
        search(config, floor - 1, 0.4, seed=0, params=FAST)
    assert search(config, floor, 0.4, seed=0, params=FAST).macs == floor
