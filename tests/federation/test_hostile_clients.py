"""Hostile clients cannot take a run over or stop it.

fedapp's own ClientApp, wrapped so that chosen partitions lie in chosen rounds
(tests/support/hostile_client.py), serves a whole run of the real ServerApp over the in-process
grid (every message through Flower's serialisation): 10^12 times its examples with random
weights, a list where a metric is one number, arrays of the wrong length, extra arrays, bytes
that are no array, FedKD-NAS replies without (or with garbled) NAS metrics, evaluations without
accuracy or claiming more images than the split has. Each run finishes, each lie is logged as a
drop and counted in metrics.jsonl, and the test accuracy stays inside the 95 % Wilson interval
of the same run with honest clients.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from digits_runs import DIGITS_FEDKD_NAS
from hostile_client import Lies, hostile_app
from local_grid import LocalGrid, preset_overrides, run_config, server_context

from fedapp.apps.client_app import app as client_app
from fedapp.apps.server_app import run_experiment
from fedapp.evaluation.intervals import wilson_interval
from fedapp.run.config import parse_run_config

FEDAVG = preset_overrides("fedavg-digits") | {
    "num_clients": 5,
    "fraction_train": 1.0,
    "num_server_rounds": 5,
}
FEDKD_NAS = DIGITS_FEDKD_NAS | {
    "strategy": "fedkd-nas",
    "num_server_rounds": 3,
    "local_epochs": 2,
    "fedkd_nas__teacher_epochs": 5,
}
#: Why the server drops each lie (words of its logged reason).
REASONS = {
    "inflated-examples": "more than the",
    "list-metric": "must be one number",
    "wrong-length": "expected float32",
    "extra-arrays": "unexpected ['padding']",
    "undecodable": "undecodable",
    "no-nas-metrics": "lacks the metrics",
    "unknown-multiplier": "names no",
    "no-accuracy": "lacks the metrics ['accuracy']",
    "inflated-evaluation": "more than the",
}


def _run(tmp_path: Path, overrides: dict[str, Any], name: str, lies: Lies) -> dict[str, Any]:
    config = run_config(**overrides | {"out_dir": str(tmp_path), "run_name": name})
    server_context(config)
    app = hostile_app(lies) if lies else client_app
    grid = LocalGrid(app, config, num_nodes=int(config["num-clients"]))
    return run_experiment(grid, parse_run_config(config))


def _rows(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]


def _assert_within_honest(hostile: dict[str, Any], honest: dict[str, Any]) -> None:
    low, high = wilson_interval(honest["test_accuracy"], honest["test_examples"])
    assert low <= hostile["test_accuracy"] <= high, (hostile["test_accuracy"], (low, high))


def _assert_logged(caplog: pytest.LogCaptureFixture, lies: Lies) -> None:
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    for partition, by_round in lies.items():
        for lie in by_round.values():
            assert any(
                REASONS[lie] in line and (f"partition {partition}" in line or "evaluation" in line)
                for line in dropped
            ), (lie, dropped)


def test_fedavg_run_survives_lying_clients(tmp_path, caplog) -> None:
    lies: Lies = {
        1: {1: "inflated-examples", 5: "undecodable"},
        2: {2: "list-metric"},
        3: {3: "wrong-length"},
        4: {4: "extra-arrays"},
    }
    honest = _run(tmp_path, FEDAVG, "honest", {})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        hostile = _run(tmp_path, FEDAVG, "hostile", lies)

    rows = _rows(tmp_path, "hostile")
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]  # the run finished
    assert [r["clients-dropped"] for r in rows] == [1, 1, 1, 1, 1]
    assert [r["clients-accepted"] for r in rows] == [4, 4, 4, 4, 4]
    assert all(r["num-examples"] < 10**6 for r in rows)  # no claimed examples counted
    _assert_logged(caplog, lies)
    _assert_within_honest(hostile, honest)


def test_fedkd_nas_run_survives_lying_clients(tmp_path, caplog) -> None:
    lies: Lies = {
        0: {1: "wrong-length", 3: "inflated-evaluation"},
        1: {1: "no-nas-metrics", 2: "extra-arrays"},
        2: {2: "unknown-multiplier", 3: "undecodable", 1: "no-accuracy"},
    }
    honest = _run(tmp_path, FEDKD_NAS, "honest", {})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        hostile = _run(tmp_path, FEDKD_NAS, "hostile", lies)

    rows = _rows(tmp_path, "hostile")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert [r["clients-dropped"] for r in rows] == [2, 2, 1]
    # the validation evaluations that lied were left out of the clients' mean
    assert [r["val-clients"] for r in rows] == [2, 3, 2]
    _assert_logged(caplog, lies)
    # the NAS log holds the accepted client-rounds only
    with (tmp_path / "hostile" / "nas_choices.csv").open() as f:
        assert sum(1 for _ in f) - 1 == 3 * 3 - 5
    assert hostile["test_clients"] == 3
    _assert_within_honest(hostile, honest)


def test_random_weights_that_pass_every_check_take_fedavg_over_but_not_flowers_krum(
    tmp_path,
) -> None:
    """A client sending random weights with its true example count is accepted by every check;
    the sample-weighted mean then breaks, Flower's Krum (one Byzantine client assumed) does not."""
    lies: Lies = {0: dict.fromkeys(range(1, 6), "noisy-weights")}
    krum = FEDAVG | {"strategy": "flwr:krum", "flwr_krum__num_malicious_nodes": 1}
    honest = _run(tmp_path, krum, "krum-honest", {})
    resisted = _run(tmp_path, krum, "krum-hostile", lies)
    broken = _run(tmp_path, FEDAVG, "fedavg-hostile", lies)

    assert all(r["clients-dropped"] == 0 for r in _rows(tmp_path, "krum-hostile"))
    _assert_within_honest(resisted, honest)
    low, _ = wilson_interval(honest["test_accuracy"], honest["test_examples"])
    assert broken["test_accuracy"] < low - 0.2
