"""The one method table: every row's halves exist, and the lists users read agree with it."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from local_grid import run_config

from fedapp.method_table import (
    METHOD_NAMES,
    METHODS,
    NoClientEvaluator,
    client_evaluator,
    client_trainer,
    settings_class,
    strategy_class,
)
from fedapp.methods.common.strategy import HeterogeneousStrategy
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.sections import Section

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _commented_names(key: str) -> list[str]:
    """The names listed in pyproject's comment on a run-config key (continuation lines too)."""
    lines = PYPROJECT.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key} ="))
    text = lines[start].split("#", 1)[1]
    for line in lines[start + 1 :]:
        if not line.lstrip().startswith("#") or "=" in line.split("#")[0]:
            break
        text += " " + line.split("#", 1)[1]
    return re.findall(r"[a-z][a-z0-9:-]*", text.split(";")[-1] if key == "public-size" else text)


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_row_names_real_halves(name: str) -> None:
    assert issubclass(strategy_class(name), HeterogeneousStrategy)
    settings = settings_class(name)
    assert settings is None or issubclass(settings, Section)
    halves = [client_trainer(name)]
    if METHODS[name].evaluator is None:
        with pytest.raises(NoClientEvaluator):
            client_evaluator(name)
    else:
        halves.append(client_evaluator(name))
    for half in halves:  # a client half receives the run's context, never the whole config
        parameters = inspect.signature(half).parameters
        assert list(parameters) == ["message", "run", "node"]
        assert parameters["run"].annotation == "RunContext"


def test_pyproject_lists_exactly_the_table() -> None:
    assert sorted(_commented_names("strategy")) == sorted(METHOD_NAMES)
    needs = sorted(n for n in METHOD_NAMES if METHODS[n].needs_public_set)
    listed = _commented_names("public-size")
    assert sorted(listed[listed.index("for") + 1 :]) == needs


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_public_set_rule_follows_the_table(name: str) -> None:
    config = run_config(strategy=name, public_size=0)
    if METHODS[name].needs_public_set:
        with pytest.raises(ConfigError, match="public-size"):
            parse_run_config(config)
    else:
        assert parse_run_config(config).strategy == name


def test_unknown_strategy_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="must be one of 'fedavg', 'feast'"):
        parse_run_config(run_config(strategy="fedprox"))


def test_config_imports_no_method_code_and_no_torchvision() -> None:
    """Reading the run config may load the methods' settings sections, nothing else of theirs."""
    code = (
        "import sys, fedapp.run.config; "
        "print(sorted(m for m in sys.modules if m.startswith(('fedapp.methods.', 'torchvision'))"
        " and not m.endswith('.settings') and m.count('.') > 2))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
