"""The run config: defaults from pyproject, typing, and a clear message for each user error."""

from __future__ import annotations

import tomllib

import pytest
from flwr.common.config import flatten_dict
from local_grid import APP_DIR, run_config

from fedapp.method_table import METHODS, settings_class, settings_classes
from fedapp.methods.fedkd_nas.settings import FedKDNASSettings
from fedapp.methods.fiarse.settings import FiarseSettings
from fedapp.run.config import (
    ConfigError,
    config_differences,
    fused_run_config,
    parse_run_config,
    parse_saved_config,
    protocol_keys,
    replace,
)
from fedapp.run.pieces import SHARED_SECTIONS


def test_every_field_has_a_pyproject_default_and_nothing_else() -> None:
    pyproject = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    declared = set(flatten_dict(pyproject["tool"]["flwr"]["app"]["config"]))
    assert declared == set(parse_run_config(run_config()).as_run_config())


def test_each_section_is_a_pyproject_table_of_dotted_keys() -> None:
    pyproject = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    tables = {
        k for k, v in pyproject["tool"]["flwr"]["app"]["config"].items() if isinstance(v, dict)
    }
    assert tables == {kind.name for kind in (*SHARED_SECTIONS, *settings_classes())}
    cfg = parse_run_config(run_config(fiarse__grid_points=5, fedkd_nas__lambda=0.25))
    assert cfg.section(FiarseSettings).grid_points == 5
    assert cfg.section(FedKDNASSettings).lambda_ == 0.25
    assert cfg.as_run_config()["fedkd-nas.lambda"] == 0.25


def test_a_run_folder_keeps_only_the_sections_its_run_reads() -> None:
    """config.json holds the run-wide keys, the shared sections and the method's own: a method
    added later neither changes it nor stops it resuming or being read back."""
    cfg = parse_run_config(run_config(strategy="ditto", ditto__lambda=0.5))
    saved = cfg.as_saved_config()
    assert saved["ditto.lambda"] == 0.5 and "feast-space.supernet" in saved
    assert not any(k.startswith(("feast.", "fiarse.", "flwr-")) for k in saved)
    assert config_differences(saved, cfg) == {}
    assert parse_saved_config(saved, run_config()) == cfg
    changed = saved | {"ditto.lambda": 0.25}
    assert config_differences(changed, cfg) == {"ditto.lambda": (0.25, 0.5)}
    with pytest.raises(ConfigError, match=r"'ditto\.lambda' is missing"):
        parse_saved_config({k: v for k, v in saved.items() if k != "ditto.lambda"}, run_config())


def test_shared_ideas_keep_one_name_in_every_section() -> None:
    """A distillation weight is ``kd-weight`` and its temperature ``kd-temperature`` wherever a
    method has one."""
    keys = parse_run_config(run_config()).as_run_config()
    for section in ("feast", "scalefl", "fedkd-nas", "feddistill"):
        assert f"{section}.kd-weight" in keys
    for section in ("scalefl", "fedkd-nas", "feddf"):
        assert f"{section}.kd-temperature" in keys
    leaves = {key.split(".")[1] for key in keys if "." in key}
    assert not {"kd-alpha", "kd-gamma", "weight", "temperature", "alpha"} & leaves


def test_every_method_reads_the_section_its_row_names() -> None:
    cfg = parse_run_config(run_config())
    assert {type(section) for section in cfg.sections} == {*SHARED_SECTIONS, *settings_classes()}
    for name in METHODS:
        kind = settings_class(name)
        assert kind is None or isinstance(cfg.section(kind), kind)


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


def test_an_unknown_key_is_reported() -> None:
    with pytest.raises(ConfigError, match=r"'fiarse\.grid-pionts' is unknown"):
        fused_run_config(APP_DIR, {"fiarse": {"grid-pionts": 3}})


def test_protocol_keys_are_derived_from_the_fields() -> None:
    keys = protocol_keys()
    assert {"seed", "dataset", "partitioner", "num-server-rounds", "eval-every"} <= keys
    assert not {"learning-rate", "model", "out-dir", "strategy"} & keys
    assert not [k for k in keys if "." in k]  # a method's own settings never define the protocol


def test_replace_revalidates() -> None:
    cfg = parse_run_config(run_config())
    assert replace(cfg, seed=7).seed == 7
    with pytest.raises(ConfigError):
        replace(cfg, gamma=-1.0)
