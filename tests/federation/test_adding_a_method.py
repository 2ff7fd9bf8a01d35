"""Adding a method takes its row in the method table and one folder, its two halves and its settings
section (tests/support/toy_method/), nothing else: the real ServerApp and ClientApp run it and the
run config validates its keys like any shipped method's."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from local_grid import run_config, run_local

from fedapp import method_table
from fedapp.method_table import Method
from fedapp.run.config import ConfigError, parse_run_config

TOY = Method(
    "toy",
    "toy_method.server:ToyStrategy",
    "toy_method.client:train",
    settings="toy_method.settings:ToySettings",
)
#: The section's defaults, which a new method adds to pyproject.toml as
#: ``[tool.flwr.app.config.toy]``: Flower's run config carries them, for every run, as dotted keys.
TOY_DEFAULTS = {"toy.server-lr": 1.0, "toy.client-epochs": 1}


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(method_table.METHODS, TOY.name, TOY)


def _config(tmp_path, strategy: str, **toy: Any) -> dict[str, Any]:
    config = run_config(
        strategy="fedavg",
        dataset="digits",
        num_server_rounds=2,
        num_clients=4,
        fraction_train=1.0,
        local_epochs=1,
        eval_every=1,
        validation_size=200,
        test_size=300,
        calibration_size=50,
        batch_size=16,
        partitioner="iid",
        out_dir=str(tmp_path),
        run_name=strategy + "".join(f"-{k}{v}" for k, v in toy.items()),
    )
    toy_keys = {f"toy.{k.replace('_', '-')}": v for k, v in toy.items()}
    return config | TOY_DEFAULTS | toy_keys | {"strategy": strategy}


def _final(tmp_path, config: dict[str, Any]) -> dict[str, np.ndarray]:
    run_local(config, num_nodes=4)
    state = torch.load(tmp_path / config["run-name"] / "model_final.pt", weights_only=True)
    return {k: v.numpy() for k, v in state.items()}


def test_a_toy_method_runs_through_the_apps_with_its_own_settings(tmp_path, toy_registered) -> None:
    fedavg = _final(tmp_path, _config(tmp_path, "fedavg"))
    toy_as_fedavg = _final(tmp_path, _config(tmp_path, "toy", server_lr=1.0))
    for name, value in fedavg.items():  # rate 1, the run's epochs: FedAvg, bit for bit
        np.testing.assert_array_equal(toy_as_fedavg[name], value)
    slower = _final(tmp_path, _config(tmp_path, "toy", server_lr=0.5))
    moved = [
        n for n, v in fedavg.items() if v.dtype.kind == "f" and not np.array_equal(slower[n], v)
    ]
    assert moved, "toy.server-lr = 0.5 changed no weight: the server half did not read it"
    longer = _final(tmp_path, _config(tmp_path, "toy", client_epochs=2))
    assert any(not np.array_equal(longer[n], v) for n, v in fedavg.items() if v.dtype.kind == "f")


def test_a_toy_method_settings_are_checked_like_any_other(tmp_path, toy_registered) -> None:
    cfg = parse_run_config(_config(tmp_path, "toy", server_lr=0.25))
    assert cfg.as_run_config()["toy.server-lr"] == 0.25
    with pytest.raises(ConfigError, match=r"'toy\.server-lr' = 1\.5 is not allowed: must be in"):
        parse_run_config(_config(tmp_path, "toy", server_lr=1.5))
    config = _config(tmp_path, "toy")
    del config["toy.client-epochs"]
    with pytest.raises(ConfigError, match=r"'toy\.client-epochs' is missing"):
        parse_run_config(config)


def test_without_its_row_the_toy_is_unknown(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"'strategy' = 'toy' is not allowed"):
        parse_run_config(_config(tmp_path, "toy"))
