"""The run config: defaults from pyproject, typing, and a clear message for each user error."""

from __future__ import annotations

import tomllib
from dataclasses import fields

import pytest
from local_grid import APP_DIR, run_config

from fedapp.config import ConfigError, RunConfig, key_of, parse_run_config, replace


def test_every_field_has_a_pyproject_default_and_nothing_else() -> None:
    pyproject = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    declared = set(pyproject["tool"]["flwr"]["app"]["config"])
    assert declared == {key_of(f.name) for f in fields(RunConfig)}


def test_defaults_parse() -> None:
    cfg = parse_run_config(run_config())
    assert cfg.strategy == "feast" and cfg.dataset == "mnist-5k"
    assert cfg.cohort_size == max(cfg.min_train_clients, int(cfg.fraction_train * cfg.num_clients))
    assert cfg.resolved_out_dir().is_absolute()


def test_int_is_accepted_where_a_float_is_expected() -> None:
    cfg = parse_run_config(run_config(learning_rate=1))
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"strategy": "fedsgd"}, "'strategy' = 'fedsgd' is not allowed: must be one of 'fedavg'"),
        (
            {"dataset": "imagenet"},
            "'dataset' = 'imagenet' is not allowed: must be one of 'mnist-5k'",
        ),
        ({"partitioner": "natural"}, "'partitioner' = 'natural' is not allowed: must be one of"),
        ({"gamma": -0.5}, "'gamma' = -0.5 is not allowed: must be >= 0"),
        ({"fraction_train": 0.0}, "'fraction-train' = 0.0 is not allowed: must be in (0, 1]"),
        ({"fraction_train": 1.5}, "'fraction-train' = 1.5 is not allowed: must be in (0, 1]"),
        ({"num_server_rounds": 0}, "'num-server-rounds' = 0 is not allowed: must be >= 1"),
        (
            {"min_train_clients": 11, "num_clients": 10},
            "'min-train-clients' = 11 asks for more clients per round than 'num-clients' = 10",
        ),
        (
            {"budget_min": 2e9, "budget_max": 1e9},
            "'budget-min' = 2e+09 is above 'budget-max' = 1e+09",
        ),
        ({"learning_rate": "fast"}, "'learning-rate' = 'fast': expected a float, got str"),
        ({"num_clients": 2.5}, "'num-clients' = 2.5: expected a int, got float"),
        ({"momentum": 1.0}, "'momentum' = 1.0 is not allowed: must be in [0, 1)"),
        (
            {"device": "tpu"},
            "'device' = 'tpu' is not allowed: must be one of 'auto', 'cpu', 'cuda'",
        ),
        ({"model": "vgg"}, "'model' = 'vgg' is not allowed: must be one of"),
        (
            {"budget_rng": "legacy"},
            "'budget-rng' = 'legacy' is not allowed: must be one of 'generator', 'authors'",
        ),
        ({"learning_rate": float("nan")}, "'learning-rate' = nan: must be a finite number"),
        ({"client_pool_size": -1}, "'client-pool-size' = -1 is not allowed: must be >= 0"),
    ],
)
def test_invalid_values_name_key_value_and_what_is_allowed(overrides, expected) -> None:
    with pytest.raises(ConfigError) as err:
        parse_run_config(run_config(**overrides))
    assert expected in str(err.value)


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        parse_run_config(run_config(gamma=-1.0, num_server_rounds=0))
    assert "'gamma'" in str(err.value) and "'num-server-rounds'" in str(err.value)


def test_missing_key_is_reported() -> None:
    config = run_config()
    del config["seed"]
    with pytest.raises(ConfigError, match="'seed' is missing"):
        parse_run_config(config)


def test_replace_revalidates() -> None:
    cfg = parse_run_config(run_config())
    assert replace(cfg, seed=7).seed == 7
    with pytest.raises(ConfigError):
        replace(cfg, gamma=-1.0)
