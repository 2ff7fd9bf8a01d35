"""95 % Wilson score intervals of test accuracies: the formula against published values and an
independent inversion of the score test, its edges and errors, what a run's files and summary
carry, and the accuracy axis of the plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from local_grid import preset_overrides, run_config, run_local

from fedapp.evaluation.intervals import (
    Z95,
    format_accuracy,
    format_measured,
    format_row,
    summary_intervals,
    wilson_interval,
    with_interval,
)
from fedapp.evaluation.operating_points import (
    POPULATION_FILE,
    VARIANTS_FILE,
    VARIANTS_PLOT_FILE,
    operating_point_report,
)
from fedapp.evaluation.plots import accuracy_axis_limits, plot_methods_accuracy_vs_macs

scipy_optimize = pytest.importorskip("scipy.optimize")
scipy_stats = pytest.importorskip("scipy.stats")


def _score_test_bounds(accuracy: float, n: int) -> tuple[float, float]:
    """The interval as its definition states it, solved numerically: every p that the two-sided
    5 % score test |p̂ - p| / sqrt(p (1 - p) / n) <= z does not reject (no closed form used)."""
    z = scipy_stats.norm.ppf(0.975)

    def excess(p: float) -> float:
        return abs(accuracy - p) / math.sqrt(p * (1 - p) / n) - z

    tiny = 1e-12  # the test statistic is undefined at p = 0 and p = 1 themselves
    inside = min(max(accuracy, tiny), 1 - tiny)
    low = 0.0 if accuracy == 0 else scipy_optimize.brentq(excess, tiny, inside, xtol=1e-15)
    high = 1.0 if accuracy == 1 else scipy_optimize.brentq(excess, inside, 1 - tiny, xtol=1e-15)
    return low, high


def test_z_is_the_normal_quantile() -> None:
    assert scipy_stats.norm.ppf(0.975) == pytest.approx(Z95, abs=1e-12)


@pytest.mark.parametrize(
    ("correct", "n", "expected"),
    [
        (900, 1000, (0.8798, 0.9171)),
        # Newcombe (1998), Stat. Med. 17:857, Table I, method 3 (score, no continuity correction)
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0, 0.1611)),
        (1, 29, (0.0061, 0.1718)),
    ],
)
def test_known_values(correct: int, n: int, expected: tuple[float, float]) -> None:
    low, high = wilson_interval(correct / n, n)
    assert (round(low, 4), round(high, 4)) == expected


@pytest.mark.parametrize("n", [1, 7, 50, 400, 1000, 10_000])
@pytest.mark.parametrize("accuracy", [0.0, 0.02, 0.31, 0.5, 0.9, 0.969, 0.999, 1.0])
def test_equals_the_inverted_score_test(accuracy: float, n: int) -> None:
    assert wilson_interval(accuracy, n) == pytest.approx(_score_test_bounds(accuracy, n), abs=1e-9)


def test_edges_stay_in_the_unit_interval_and_do_not_collapse() -> None:
    n = 300
    low, high = wilson_interval(0.0, n)
    assert low == 0.0 and high == pytest.approx(Z95**2 / (n + Z95**2))
    low, high = wilson_interval(1.0, n)
    assert high == 1.0 and low == pytest.approx(n / (n + Z95**2))
    assert wilson_interval(1, 10) == wilson_interval(1.0, 10)  # 1 is a fraction, not a count
    # symmetric under p -> 1 - p; narrower with more images; contains the estimate
    for p in (0.03, 0.4, 0.87):
        low, high = wilson_interval(p, n)
        mirror = wilson_interval(1 - p, n)
        assert (low, high) == pytest.approx((1 - mirror[1], 1 - mirror[0]))
        assert low < p < high
        assert wilson_interval(p, 4 * n)[1] - wilson_interval(p, 4 * n)[0] < high - low
    assert wilson_interval(0.5, np.int64(100)) == wilson_interval(0.5, 100)  # numpy counts too


@pytest.mark.parametrize(
    ("accuracy", "n", "message"),
    [
        (0.5, 0, "n >= 1"),
        (0.5, -3, "n >= 1"),
        (0.5, 2.5, "n >= 1"),
        (0.5, True, "n >= 1"),
        (-0.01, 10, r"\[0, 1\]"),
        (1.01, 10, r"\[0, 1\]"),
        (900, 1000, r"fraction in \[0, 1\], got 900"),  # a count of correct images is refused
        (float("nan"), 10, r"\[0, 1\]"),
    ],
)
def test_bad_input_is_a_clear_value_error(accuracy: float, n: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wilson_interval(accuracy, n)


def test_coverage_of_an_accuracy_and_of_a_mean_over_models() -> None:
    """About 95 % of simulated test sets give an interval holding the true accuracy; for the mean
    accuracy of several models on the same images at least as many (the intervals module's
    argument for population accuracy)."""
    rng = np.random.default_rng(0)
    n, trials, truth = 400, 4000, 0.9
    correct = rng.binomial(n, truth, size=trials)
    covered = [wilson_interval(c / n, n) for c in correct]
    share = np.mean([lo <= truth <= hi for lo, hi in covered])
    assert 0.93 < share < 0.97
    # three models whose errors overlap partly: each image's correctness per model
    truths = (0.95, 0.9, 0.8)
    hits = 0
    for _ in range(1000):
        shared = rng.random(n)
        own = rng.random((len(truths), n))
        mixed = np.where(rng.random((len(truths), n)) < 0.5, shared, own)
        mean = float(np.mean([(mixed[i] < t).mean() for i, t in enumerate(truths)]))
        low, high = wilson_interval(mean, n)
        hits += low <= np.mean(truths) <= high
    assert hits / 1000 >= 0.95


def test_rows_summaries_and_console_text() -> None:
    row = with_interval({"partition": 3, "accuracy": 0.9, "loss": 0.3, "num-examples": 1000})
    assert (round(row["ci95_low"], 4), round(row["ci95_high"], 4)) == (0.8798, 0.9171)
    assert list(row)[:4] == ["partition", "accuracy", "loss", "num-examples"]  # appended
    assert with_interval({"accuracy": 0.9}, n=1000)["ci95_low"] == row["ci95_low"]
    assert format_row(row) == "90.00% [87.98, 91.71]" == format_measured(0.9, 1000)
    assert format_accuracy(0.9, None) == "90.00%"  # a figure without an interval stays readable
    assert format_measured(float("nan"), 10) == "nan%"  # no client answered: no interval
    summary = {
        "test_accuracy": 0.969,
        "population_accuracy": 0.9,
        "population_accuracy_best_affordable": 0.95,  # chosen on the test set: none
        "global_test_accuracy": 0.5,
        "teacher_test_accuracy": None,
        "best_val_accuracy": 0.97,  # validation, not test
        "test_loss": 0.2,
    }
    added = summary_intervals(summary, 1000)
    assert set(added) == {
        "test_images",
        "test_accuracy_ci95",
        "population_accuracy_ci95",
        "global_test_accuracy_ci95",
    }
    assert added["test_images"] == 1000
    assert added["test_accuracy_ci95"] == list(wilson_interval(0.969, 1000))
    assert "test_accuracy_ci95" not in summary_intervals({"test_accuracy": float("nan")}, 10)


def _point(index: int, macs: int, correct: int, n: int) -> dict:
    """An evaluate_points row (as the evaluator writes it) of ``correct`` right out of ``n``."""
    return with_interval(
        {
            "index": index,
            "macs": macs,
            "nominal_macs": macs,
            "params": 10 * macs,
            "accuracy": correct / n,
            "loss": 0.5,
            "images": n,
        },
        n=n,
    )


def test_operating_point_files_carry_intervals(tmp_path: Path) -> None:
    n = 300
    variants = [_point(0, 1_000, 240, n), _point(1, 5_000, 270, n), _point(2, 9_000, 282, n)]
    budgets = {0: 2_000.0, 1: 6_000.0, 2: 20_000.0, 3: 6_000.0}
    served = {0: 0, 1: 1, 2: 2, 3: 1}
    summary = operating_point_report(tmp_path, "t", variants, served, budgets, trained={1, 2})
    assert summary["test_images"] == n
    assert summary["test_accuracy_ci95"] == list(wilson_interval(282 / n, n))
    population = (240 + 270 + 282 + 270) / (4 * n)
    assert summary["population_accuracy"] == pytest.approx(population)
    assert summary["population_accuracy_ci95"] == list(wilson_interval(population, n))
    assert "population_accuracy_best_affordable_ci95" not in summary
    assert [v["ci95_low"] for v in summary["variants"]] == [v["ci95_low"] for v in variants]
    with (tmp_path / VARIANTS_FILE).open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:7] == [
        "index",
        "macs",
        "nominal_macs",
        "params",
        "accuracy",
        "ci95_low",
        "ci95_high",
    ]
    for row, expected in zip(rows, variants, strict=True):
        low, high = wilson_interval(expected["accuracy"], n)
        assert float(row["ci95_low"]) == pytest.approx(low)
        assert float(row["ci95_high"]) == pytest.approx(high)
    with (tmp_path / POPULATION_FILE).open() as f:
        clients = list(csv.DictReader(f))
    # each client's served point brings its own interval
    assert [float(c["ci95_high"]) for c in clients] == pytest.approx(
        [wilson_interval(variants[int(c["variant"])]["accuracy"], n)[1] for c in clients]
    )
    assert (tmp_path / VARIANTS_PLOT_FILE).stat().st_size > 0


def test_accuracy_axis_shows_every_interval_with_margin(tmp_path: Path) -> None:
    # MNIST-like: points within a point of each other, intervals about +-1.1
    assert accuracy_axis_limits([(95.41, 97.66), (95.6, 97.8), (96.2, 98.2)]) == (90.0, 100.0)
    assert accuracy_axis_limits([(61.5, 66.0), (70.0, 74.0)]) == (55.0, 80.0)
    assert accuracy_axis_limits([(1.0, 12.0)]) == (0.0, 15.0)  # never below 0
    assert accuracy_axis_limits([(99.1, 100.0)]) == (95.0, 100.0)  # never above 100
    assert accuracy_axis_limits([]) == (0.0, 100.0)
    nan = float("nan")  # a mean over no answering client
    assert accuracy_axis_limits([(nan, nan), (90.0, 92.0)]) == (85.0, 95.0)
    # points without an interval still plot (no error bars for them)
    old = [{"index": 0, "macs": 1e6, "params": 10, "accuracy": 0.9}]
    new = [_point(0, 2_000_000, 280, 300)]
    path = plot_methods_accuracy_vs_macs(
        tmp_path / "m.png", {"a": old, "b": new}, {"c": 0.8, "d": 0.7}, "t", {"c": (0.75, 0.85)}
    )
    assert path.stat().st_size > 0


def test_client_rows_of_a_real_ditto_run_carry_intervals(tmp_path: Path) -> None:
    """personal.csv (Ditto; clients.csv of FedMD/FedDistill/FedKD-NAS comes from the same
    client evaluation) and summary.json of a real one-round run."""
    config = run_config(
        **preset_overrides("fedavg-digits")
        | {
            "strategy": "ditto",
            "num_server_rounds": 1,
            "fraction_train": 1.0,
            "out_dir": str(tmp_path),
            "run_name": "ditto",
        }
    )
    summary, _ = run_local(config, num_nodes=4)
    run_dir = tmp_path / "ditto"
    with (run_dir / "personal.csv").open() as f:
        personal = list(csv.DictReader(f))
    assert len(personal) == 4
    for row in personal:
        low, high = wilson_interval(float(row["accuracy"]), int(row["num-examples"]))
        assert float(row["ci95_low"]) == pytest.approx(low)
        assert float(row["ci95_high"]) == pytest.approx(high)
    stored = json.loads((run_dir / "summary.json").read_text())
    assert stored["test_images"] == 300 == int(personal[0]["num-examples"])  # the preset's split
    for key in ("test_accuracy", "global_test_accuracy"):
        assert stored[key + "_ci95"] == pytest.approx(list(wilson_interval(stored[key], 300)))
    assert summary["test_accuracy_ci95"] == stored["test_accuracy_ci95"]
