"""``fedapp extract``: a new operating point cut from a finished FEAST run, without retraining."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from digits_runs import DIGITS_FEAST
from local_grid import run_config, run_local

from fedapp.models.arch import parse_arch
from fedapp.tools.cli import main


@pytest.fixture(scope="module")
def feast_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    config = run_config(
        **DIGITS_FEAST, num_clients=4, num_server_rounds=2, out_dir=str(out), run_name="feast"
    )
    run_local(config, num_nodes=4)
    return out / "feast"


def test_extracts_a_variant_under_the_limit_and_tests_it(
    feast_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extract", str(feast_run), "--macs", "1.5e6", "--seed", "1", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["macs"] <= 1.5e6 and first["params"] > 0
    parse_arch(first["arch"])  # a valid architecture string of the space
    assert 0.0 <= first["test_accuracy"] <= 1.0 and first["test_loss"] > 0
    # deterministic: the same seed gives the same variant and the same accuracy
    assert main(["extract", str(feast_run), "--macs", "1.5e6", "--seed", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == first


def test_refuses_limits_below_the_cache_and_runs_without_a_supernet(
    feast_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extract", str(feast_run), "--macs", "1e3"]) == 2
    assert "below the smallest variant" in capsys.readouterr().err
    assert main(["extract", str(tmp_path), "--macs", "1e6"]) == 2
    assert "no config.json" in capsys.readouterr().err
    fedavg = json.loads((feast_run / "config.json").read_text()) | {"strategy": "fedavg"}
    (tmp_path / "config.json").write_text(json.dumps(fedavg))
    (tmp_path / "model_best.pt").write_bytes(b"")
    assert main(["extract", str(tmp_path), "--macs", "1e6"]) == 2
    assert "needs a FEAST supernet" in capsys.readouterr().err
