"""`fedapp compare`: validation before any run, the tables and plot from real runs, and the
command itself with the real `flwr run` (every process it starts is stopped)."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
from local_grid import run_local
from processes import BIN_DIR, flower_env, pids_mentioning

from fedapp.compare import (
    COMPARISONS_DIR,
    EFFICIENCY_FILE,
    PLOT_FILE,
    POINTS_FILE,
    REPORT_FILE,
    TABLE_FILE,
    collect_summaries,
    load_comparison,
    method_row,
    parse_assignment,
    write_outputs,
)
from fedapp.config import ConfigError, parse_run_config


def _comparison_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mine.toml"
    path.write_text(text)
    return str(path)


def test_bad_comparisons_fail_before_any_run(tmp_path: Path) -> None:
    bad = _comparison_file(
        tmp_path,
        'preset = "fedavg-digits"\nstrategies = ["fedavg", "fedsgdx"]\n'
        "[overrides.fedavg]\nlocal-epochs = 3\nnum-clients = 7\n",
    )
    with pytest.raises(ConfigError) as err:
        load_comparison(bad)
    message = str(err.value)
    assert "unknown strategy 'fedsgdx'" in message
    assert "[overrides.fedavg] sets num-clients" in message  # the protocol is shared
    with pytest.raises(ConfigError, match="learning-rate"):
        load_comparison("smoke-digits", sets=["learning-rate=-1"])
    with pytest.raises(ConfigError, match="no comparison 'nope'"):
        load_comparison("nope")


@pytest.mark.parametrize("name", sorted(p.stem for p in COMPARISONS_DIR.glob("*.toml")))
def test_shipped_comparisons_are_valid(name: str) -> None:
    comparison = load_comparison(name)  # parses every strategy's complete run config
    assert comparison.description and len(comparison.strategies) >= 2
    shared = {
        key: {
            parse_run_config(comparison.run_config(s)).as_run_config()[key]
            for s in comparison.strategies
        }
        for key in ("seed", "dataset", "num-clients", "partitioner", "budget-min", "budget-max")
    }
    assert all(len(values) == 1 for values in shared.values()), shared


def test_shared_changes_apply_to_every_method() -> None:
    comparison = load_comparison("smoke-digits", sets=["seed=7", "partitioner=dirichlet"])
    configs = [parse_run_config(comparison.run_config(s)) for s in comparison.strategies]
    assert {c.seed for c in configs} == {7}
    assert {c.partitioner for c in configs} == {"dirichlet"}
    assert [c.strategy for c in configs] == list(comparison.strategies)
    assert configs[1].variant_cache == "feast-small-digits"  # a method knob stays per method
    assert parse_assignment('dataset="digits"') == ("dataset", "digits")
    assert parse_assignment("fraction-train=0.5") == ("fraction-train", 0.5)


def test_table_plot_and_scores_from_real_runs(tmp_path: Path) -> None:
    comparison = load_comparison("smoke-digits", sets=["num-server-rounds=1"])
    for strategy in comparison.strategies:
        config = comparison.run_config(strategy) | {
            "out-dir": str(tmp_path),
            "run-name": f"{strategy}/run",
        }
        run_local(config, num_nodes=4)
    summaries = collect_summaries(tmp_path, comparison.strategies)
    assert set(summaries) == {"fedavg", "feast"}

    result = write_outputs(tmp_path, comparison, summaries)
    for name in (TABLE_FILE, POINTS_FILE, EFFICIENCY_FILE, REPORT_FILE, PLOT_FILE):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = {r["method"]: r for r in csv.DictReader((tmp_path / TABLE_FILE).open())}
    feast, fedavg = summaries["feast"], summaries["fedavg"]
    assert float(rows["feast"]["population_accuracy"]) == pytest.approx(
        feast["population_accuracy"]
    )
    assert rows["fedavg"]["population_accuracy"] == ""  # one model: no operating points
    comm = feast["comm"]
    payload = (comm["bytes_down_total"] + comm["bytes_up_total"]) / comm["client_rounds"] / 2**20
    assert float(rows["feast"]["payload_mb_per_client_round"]) == pytest.approx(payload)
    assert int(rows["feast"]["operating_points"]) == len(feast["variants"])
    points = list(csv.DictReader((tmp_path / POINTS_FILE).open()))
    assert {p["method"] for p in points} == {"feast"}
    scores = {r["method"]: r for r in result["efficiency"]}
    assert set(scores) == {"feast", "fedavg"}
    best = max(scores, key=lambda m: summaries[m]["test_accuracy"])
    assert scores[best]["PQS"] >= 0.7  # the most accurate method gets the accuracy share
    assert min(s["CES"] for s in scores.values()) == pytest.approx(1.0)
    assert all(s["RES"] is not None and s["RES"] <= 1.0 for s in scores.values())
    assert fedavg["resources"]["cpu_percent_mean"] > 0  # metered on the clients
    assert "| fedavg |" in (tmp_path / REPORT_FILE).read_text()


def test_compare_command_with_flwr_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = flower_env(tmp_path / "home", OMP_NUM_THREADS="1")
    try:
        result = subprocess.run(
            [str(BIN_DIR / "fedapp"), "compare", "smoke-digits", "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:  # compare stops the SuperLinks it started; make sure of it
        leftovers = pids_mentioning(str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not leftovers
    rows = list(csv.DictReader((out / TABLE_FILE).open()))
    assert [r["method"] for r in rows] == ["fedavg", "feast"]
    for strategy in ("fedavg", "feast"):
        summary = json.loads((out / strategy / "run" / "summary.json").read_text())
        assert summary["rounds"] == 2
    assert "| feast |" in result.stdout


def test_min_macs_counts_only_points_some_client_trained(tmp_path: Path) -> None:
    summary = {
        "test_accuracy": 0.9,
        "variants": [
            {"index": 0, "macs": 1e6, "params": 10, "accuracy": 0.1, "trained": False},
            {"index": 1, "macs": 4e6, "params": 40, "accuracy": 0.8, "trained": True},
            {"index": 2, "macs": 9e6, "params": 90, "accuracy": 0.9, "trained": True},
        ],
    }
    row = method_row("heterofl", summary)
    assert row["operating_points"] == 3 and row["trained_points"] == 2
    assert row["min_macs"] == 4e6 and row["max_macs"] == 9e6
    # summaries written before `trained` existed: every point counts
    older = {
        "test_accuracy": 0.9,
        "variants": [{k: x for k, x in v.items() if k != "trained"} for v in summary["variants"]],
    }
    assert method_row("heterofl", older)["min_macs"] == 1e6
    comparison = load_comparison("smoke-digits")
    write_outputs(tmp_path, comparison, {"feast": summary})
    points = list(csv.DictReader((tmp_path / POINTS_FILE).open()))
    assert [p["trained"] for p in points] == ["False", "True", "True"]
