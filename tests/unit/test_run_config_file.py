"""fedapp.tools.launcher.write_run_config writes TOML that `flwr run --run-config` reads back as
given: method sections (a dict or dotted keys), quoted strings, floats, bools; what a run config
cannot hold is refused before a file exists."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedapp.tools.launcher import write_run_config


def test_method_sections_and_every_value_type_survive_flowers_parser(tmp_path: Path) -> None:
    config = {
        "strategy": "fedkd-nas",
        "run-name": 'a "quoted" \\ name',
        "weight-decay": 1e-4,
        "budget-max": 8.2e7,
        "num-clients": 4,
        "resume": True,
        "fedkd-nas": {"teacher-epochs": 20, "teacher-model": ""},
        "feast": {"training-rule": "full"},
        "fiarse.grid-points": 3,
    }
    path = write_run_config(tmp_path / "run.toml", config)
    text = path.read_text()
    assert "{" not in text  # no Python/JSON dict literal: method settings are TOML tables
    tomllib.loads(text)
    assert parse_config_args([str(path)]) == {
        "strategy": "fedkd-nas",
        "run-name": 'a "quoted" \\ name',
        "weight-decay": 1e-4,
        "budget-max": 8.2e7,
        "num-clients": 4,
        "resume": True,
        "fedkd-nas.teacher-epochs": 20,
        "fedkd-nas.teacher-model": "",
        "feast.training-rule": "full",
        "fiarse.grid-points": 3,
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"feast-space": {"anchor-variants": [0, 9]}}, "needs to be of type"),
        ({"fiarse": 3, "fiarse.grid-points": 3}, "both a value and a section"),
    ],
)
def test_what_a_run_config_cannot_hold_is_refused(
    tmp_path: Path, config: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        write_run_config(tmp_path / "run.toml", config)
    assert not (tmp_path / "run.toml").exists()
