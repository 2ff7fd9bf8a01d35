"""`fedapp compare`: validation before any run, and the tables and plot from real runs made
in-process (the command itself, with the real `flwr run`: tests/system/test_compare_command.py)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from local_grid import run_local

from fedapp.evaluation.intervals import wilson_interval
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.pieces import FeastSpaceSection
from fedapp.tools.compare import (
    COMPARISONS_DIR,
    EFFICIENCY_FILE,
    FLEET_PLOT_FILE,
    PLOT_FILE,
    POINTS_FILE,
    REPORT_FILE,
    ROUNDS_PLOT_FILE,
    SEEDS_PLOT_FILE,
    TABLE_FILE,
    collect_summaries,
    load_comparison,
    mean_std_rows,
    method_row,
    parse_assignment,
    run_dir_of,
    seed_dir,
    validation_curve,
    write_outputs,
    write_seed_outputs,
)


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


def test_a_method_runs_under_labels_each_with_its_overrides(tmp_path: Path) -> None:
    path = _comparison_file(
        tmp_path,
        'preset = "fedavg-digits"\nstrategies = ["fedavg", "fedavg-long"]\n'
        '[labels]\nfedavg-long = "fedavg"\n[overrides.fedavg-long]\nlocal-epochs = 7\n',
    )
    comparison = load_comparison(path)
    base, labelled = (parse_run_config(comparison.run_config(s)) for s in comparison.strategies)
    assert (base.strategy, labelled.strategy) == ("fedavg", "fedavg")
    assert (base.local_epochs, labelled.local_epochs) != (7, 7) and labelled.local_epochs == 7
    assert run_dir_of(tmp_path, "fedavg-long") == tmp_path / "fedavg-long" / "run"
    bad = _comparison_file(
        tmp_path,
        'preset = "fedavg-digits"\nstrategies = ["fedavg", "x"]\n'
        '[labels]\nx = "fedsgdx"\nfeast = "fedavg"\n',
    )
    with pytest.raises(ConfigError) as err:
        load_comparison(bad)
    assert "[labels] x = 'fedsgdx': not a method" in str(err.value)
    assert "[labels] feast: a method's name, not a label" in str(err.value)


def test_shared_changes_apply_to_every_method() -> None:
    comparison = load_comparison("smoke-digits", sets=["seed=7", "partitioner=dirichlet"])
    configs = [parse_run_config(comparison.run_config(s)) for s in comparison.strategies]
    assert {c.seed for c in configs} == {7}
    assert {c.partitioner for c in configs} == {"dirichlet"}
    assert [c.strategy for c in configs] == list(comparison.strategies)
    # a method knob stays per method
    assert configs[1].section(FeastSpaceSection).variant_cache == "feast-small-digits"
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
    assert (tmp_path / ROUNDS_PLOT_FILE).read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / FLEET_PLOT_FILE).read_bytes()[:4] == b"\x89PNG"
    # one validated round each: the curves the rounds plot draws
    assert validation_curve(run_dir_of(tmp_path, "fedavg")) == [
        (1, pytest.approx(summaries["fedavg"]["best_val_accuracy"]))
    ]
    rows = {r["method"]: r for r in csv.DictReader((tmp_path / TABLE_FILE).open())}
    feast, fedavg = summaries["feast"], summaries["fedavg"]
    assert float(rows["feast"]["population_accuracy"]) == pytest.approx(
        feast["population_accuracy"]
    )
    assert rows["fedavg"]["population_accuracy"] == ""  # one model: no operating points
    # the fleet's time: the run's hours; the target (the lower final validation accuracy) is
    # reached by both at their one validated round
    assert result["target"] == pytest.approx(
        min(s["best_val_accuracy"] for s in summaries.values())
    )
    for name, summary in summaries.items():
        assert float(rows[name]["fleet_hours"]) == pytest.approx(summary["fleet"]["hours"])
        assert float(rows[name]["hours_to_target"]) == pytest.approx(summary["fleet"]["hours"])
        assert (rows[name]["updates_lost"], rows[name]["round_to_target"]) == ("0", "1")
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
    # every test accuracy with its 95 % interval from the test split's 300 images
    for name, summary in summaries.items():
        assert summary["test_images"] == 300
        expected = wilson_interval(summary["test_accuracy"], 300)
        assert summary["test_accuracy_ci95"] == pytest.approx(list(expected))
        low, high = (
            float(rows[name]["test_accuracy_ci95_low"]),
            rows[name]["test_accuracy_ci95_high"],
        )
        assert (low, float(high)) == pytest.approx(expected)
        cell = f"{100 * summary['test_accuracy']:.2f} % [{100 * low:.2f}, {100 * float(high):.2f}]"
        assert f"| {name} | {cell} |" in result["report"]
    assert feast["population_accuracy_ci95"] == pytest.approx(
        list(wilson_interval(feast["population_accuracy"], 300))
    )
    assert rows["fedavg"]["population_accuracy_ci95_low"] == ""
    for point, variant in zip(points, feast["variants"], strict=True):
        assert float(point["ci95_low"]) == pytest.approx(variant["ci95_low"])
        assert float(point["ci95_high"]) == pytest.approx(variant["ci95_high"])
        assert variant["ci95_low"] < variant["accuracy"] < variant["ci95_high"] or (
            variant["accuracy"] in (0.0, 1.0)
        )
    with (tmp_path / "feast" / "run" / "variants.csv").open() as f:
        assert {"ci95_low", "ci95_high"} <= set(next(csv.DictReader(f)))
    with (tmp_path / "feast" / "run" / "population.csv").open() as f:
        assert {"ci95_low", "ci95_high"} <= set(next(csv.DictReader(f)))
    assert {"Acc_ci95_low", "Acc_ci95_high"} <= set(result["efficiency"][0])
    trained = [v for v in feast["variants"] if v["trained"]]  # untrained points say nothing
    assert method_row("feast", feast)["frontier_rise"] == pytest.approx(
        max(trained, key=lambda v: v["macs"])["accuracy"]
        - min(trained, key=lambda v: v["macs"])["accuracy"]
    )


def test_mean_and_std_over_seeds() -> None:
    seed_a = [{"method": "a", "test_accuracy": 0.80, "test_loss": None, "wall": 10}]
    seed_b = [{"method": "a", "test_accuracy": 0.90, "test_loss": None, "wall": 14}]
    (row,) = mean_std_rows([seed_a, seed_b])
    assert row["seeds"] == 2 and row["test_loss"] is None  # no seed reports it
    assert row["test_accuracy"] == pytest.approx(0.85)
    assert row["test_accuracy_std"] == pytest.approx(0.0707107, rel=1e-5)  # sample std
    assert (row["wall"], row["wall_std"]) == (pytest.approx(12.0), pytest.approx(2.828427))


def test_several_seeds_from_real_runs(tmp_path: Path) -> None:
    comparison = load_comparison("smoke-digits", sets=["num-server-rounds=1", "seed=3"])
    assert comparison.seeds(2) == [3, 4]
    per_seed = {}
    for seed in comparison.seeds(2):
        seeded = comparison.with_seed(seed)
        folder = seed_dir(tmp_path, seed)
        for strategy in seeded.strategies:
            config = seeded.run_config(strategy)
            assert config["seed"] == seed
            run_local(config | {"out-dir": str(folder), "run-name": f"{strategy}/run"}, 4)
        per_seed[seed] = write_outputs(folder, seeded, collect_summaries(folder, seeded.strategies))
    result = write_seed_outputs(tmp_path, comparison, per_seed)
    accuracies = {
        seed: {r["method"]: r["test_accuracy"] for r in out["rows"]}
        for seed, out in per_seed.items()
    }
    rows = {r["method"]: r for r in csv.DictReader((tmp_path / TABLE_FILE).open())}
    for method in ("fedavg", "feast"):
        values = [accuracies[3][method], accuracies[4][method]]
        assert float(rows[method]["test_accuracy"]) == pytest.approx(sum(values) / 2)
        assert float(rows[method]["test_accuracy_std"]) == pytest.approx(
            abs(values[0] - values[1]) / 2**0.5
        )
        assert rows[method]["seeds"] == "2"
    assert (tmp_path / SEEDS_PLOT_FILE).stat().st_size > 0
    assert " ± " in result["report"] and "| fedavg | 2 |" in result["report"]
    # across seeds the spread is mean ± std; the seeds' own intervals are not averaged
    assert not any("ci95" in key for key in rows["feast"])
    assert "[" not in result["report"]


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
