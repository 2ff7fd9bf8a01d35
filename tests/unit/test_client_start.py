"""What a deployed ClientApp process pays before it trains: every message starts a fresh one.

- importing the ClientApp and a trainer loads neither Hugging Face ``datasets`` nor
  ``flwr_datasets``, torchvision, matplotlib, scikit-learn or mlxtend (seconds on a board);
- a client's shard is cached on disk, so a later process reads it without loading the data set;
- with the data-set facts the server sends, a device with ``data-path`` never loads the run's set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from local_grid import preset_overrides, run_config

from fedapp.data import registry
from fedapp.run.config import parse_run_config
from fedapp.run.context import data_layout, piece
from fedapp.run.federated_data import (
    _cached_shard,
    adopt_data_facts,
    client_shard,
    data_facts,
    dataset_info,
    population,
    shard_cache_path,
)
from fedapp.run.pieces import DataSource

HEAVY = ("datasets", "flwr_datasets", "torchvision", "matplotlib", "sklearn", "mlxtend")
REPO = Path(__file__).resolve().parents[2]


def test_clientapp_and_trainers_import_no_data_or_plotting_libraries() -> None:
    probe = (
        "import sys, json, fedapp.apps.client_app, fedapp.methods.fedavg.client\n"
        "import fedapp.methods.feast.client\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


def _cfg(tmp_path: Path, **extra):
    return parse_run_config(
        run_config(**preset_overrides("fedavg-digits") | {"out_dir": str(tmp_path)} | extra)
    )


def test_a_cached_shard_is_read_back_without_loading_the_data_set(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, seed=11)
    path = shard_cache_path(data_layout(cfg), 2)
    assert not path.exists()
    computed = client_shard(data_layout(cfg), 2)
    assert path.exists() and "digits-seed11-iid-n4-p2" in path.name

    _cached_shard.cache_clear()  # as a fresh ClientApp process
    population.cache_clear()
    registry._load_cached.cache_clear()
    again = client_shard(data_layout(cfg), 2)
    assert population.cache_info().misses == 0 and registry._load_cached.cache_info().misses == 0
    np.testing.assert_array_equal(again.images, computed.images)
    np.testing.assert_array_equal(again.labels, computed.labels)
    # any key that shapes the split names another file
    assert shard_cache_path(data_layout(_cfg(tmp_path, seed=11, validation_size=150)), 2) != path


def test_a_device_with_its_own_data_never_loads_the_run_data_set(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    facts = data_facts(
        dataset_info(piece(DataSource, cfg))
    )  # what the server sends with QUERY and TRAIN
    digits = registry.load_dataset("digits").train
    own = tmp_path / "own.npz"
    np.savez(own, x_train=digits.images[:40, 0], y_train=digits.labels[:40])

    population.cache_clear()
    registry._load_cached.cache_clear()
    adopt_data_facts(piece(DataSource, cfg), facts)
    shard = client_shard(data_layout(cfg), 0, str(own))
    assert len(shard.labels) == 40
    assert registry._load_cached.cache_info().currsize == 1  # the device's own file, nothing else
    assert population.cache_info().misses == 0
    assert (
        dataset_info(piece(DataSource, cfg)) == population(data_layout(cfg)).info
    )  # the facts sent are the data set's
