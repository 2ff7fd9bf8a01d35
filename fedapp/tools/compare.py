"""``fedapp compare``: several strategies on identical data, budgets and seeds, side by side.

A comparison file (``conf/compare/<name>.toml``) names a preset for the shared run config, the
strategies, shared changes (``[run-config]``) and per-strategy method knobs
(``[overrides.<name>]``). A method may run more than once under labels of its own
(``[labels]``: ``fedavg-full = "fedavg"``), each with its overrides.
Overrides may not touch the protocol — data, partitions, budgets, cohorts, rounds, seed,
augmentation — so every method sees the same clients. Each strategy runs with the real
``flwr run`` in simulation; then one table (accuracy, population accuracy, operating points,
payload per client-round, compute proxy, client resources), the efficiency scores of FedKD-NAS
(PQS, CES, RES, UES, UES*) and one accuracy-vs-MACs plot with every method are written.
With ``--seeds N`` the whole comparison runs under N seeds (the configured seed and the N - 1
after it, each in ``seed-<s>/`` with its own tables); the top level then reports every column as
mean ± std over the seeds, with a plot of each method's mean test accuracy and its spread.
A single seed's tables give each accuracy its 95 % Wilson interval from the test images.
Everything is checked before the first run starts: a typo fails in a second, not after an hour.
A comparison run again into the same folder keeps the strategies that finished (if their run
config is the one it would use now: otherwise it stops) and resumes interrupted ones from their
last completed round.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from flwr.common.config import flatten_dict

from fedapp.evaluation.efficiency import MethodCosts, efficiency_scores
from fedapp.evaluation.fleet_time import FLEET_TOTAL, time_to_target, time_to_target_interval
from fedapp.evaluation.frontier import frontier_rise
from fedapp.evaluation.intervals import (
    HIGH,
    LOW,
    SUMMARY_SUFFIX,
    format_accuracy,
    row_interval,
    wilson_interval,
)
from fedapp.evaluation.plots import (
    plot_method_means,
    plot_methods_accuracy_vs_macs,
    plot_methods_rounds,
)
from fedapp.evaluation.results import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    read_json,
    read_jsonl,
    replace_text,
    write_csv,
)
from fedapp.method_table import METHOD_NAMES, folder_name
from fedapp.results import timed_rounds
from fedapp.run.config import (
    ConfigError,
    config_differences,
    describe_differences,
    fused_run_config,
    parse_run_config,
    protocol_keys,
)
from fedapp.tools.launcher import APP_DIR, run_app, write_run_config
from fedapp.tools.run_progress import RunProgress
from fedapp.wire.messages import SELECTION_KEY

COMPARISONS_DIR = APP_DIR / "conf" / "compare"
#: Keys that define the experiment every method must share; per-strategy overrides may not set them.
PROTOCOL_KEYS = protocol_keys()
TABLE_FILE = "comparison.csv"
POINTS_FILE = "operating_points.csv"
EFFICIENCY_FILE = "efficiency.csv"
REPORT_FILE = "comparison.md"
PLOT_FILE = "accuracy_vs_macs.png"
ROUNDS_PLOT_FILE = "validation_by_round.png"
FLEET_PLOT_FILE = "validation_by_fleet_hours.png"
SEEDS_PLOT_FILE = "accuracy_over_seeds.png"
#: Suffixes of the columns that hold an accuracy's 95 % interval, after the accuracy's own key.
CI_LOW, CI_HIGH = "_" + LOW, "_" + HIGH


@dataclass(frozen=True)
class Comparison:
    """What to run: one shared run config, the strategies and their method knobs."""

    name: str
    description: str
    strategies: tuple[str, ...]  # methods, or labels of ``labels``
    shared: dict[str, Any]
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # label -> the method it runs

    def run_config(self, strategy: str) -> dict[str, Any]:
        """The complete run config of one strategy or label (pyproject defaults, preset,
        changes)."""
        method = self.labels.get(strategy, strategy)
        values = self.shared | self.overrides.get(strategy, {}) | {"strategy": method}
        return fused_run_config(APP_DIR, values)

    def seeds(self, count: int) -> list[int]:
        """The configured seed and the ``count - 1`` after it."""
        first = int(self.run_config(self.strategies[0])["seed"])
        return list(range(first, first + count))

    def with_seed(self, seed: int) -> Comparison:
        """The same comparison under another seed (a protocol key: every method shares it)."""
        return replace(self, shared=self.shared | {"seed": seed})


def comparison_path(name: str) -> Path:
    """A comparison file by path, or by name under conf/compare."""
    path = Path(name)
    if path.suffix == ".toml" and path.exists():
        return path
    named = COMPARISONS_DIR / f"{name}.toml"
    if named.exists():
        return named
    known = ", ".join(sorted(p.stem for p in COMPARISONS_DIR.glob("*.toml")))
    raise ConfigError(f"no comparison {name!r}: give a .toml file or one of {known}")


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value`` with a TOML value (``seed=5``; strings may be quoted or bare)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. num-server-rounds=5")
    try:
        return key.strip(), tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return key.strip(), value.strip()


def load_comparison(
    name: str, sets: list[str] | None = None, only: list[str] | None = None
) -> Comparison:
    """Read and fully validate a comparison (every strategy's run config is parsed now)."""
    path = comparison_path(name)
    spec = tomllib.loads(path.read_text())
    unknown = set(spec) - {
        "description",
        "preset",
        "strategies",
        "run-config",
        "overrides",
        "labels",
    }
    if unknown:
        raise ConfigError(f"{path.name}: unknown tables/keys {sorted(unknown)}")
    shared: dict[str, Any] = {}
    if "preset" in spec:
        preset = APP_DIR / "conf" / f"{spec['preset']}.toml"
        if not preset.exists():
            raise ConfigError(f"{path.name}: preset {spec['preset']!r} is not in conf/")
        shared |= flatten_dict(tomllib.loads(preset.read_text()))
    shared |= flatten_dict(spec.get("run-config", {}))
    shared |= dict(parse_assignment(s) for s in sets or [])
    shared.pop("strategy", None)
    strategies = tuple(only or spec.get("strategies", []))
    if not strategies:
        raise ConfigError(f"{path.name}: no strategies to compare")
    labels = {str(k): v for k, v in spec.get("labels", {}).items()}
    problems = [
        f"[labels] {label} = {method!r}: not a method (known: {', '.join(METHOD_NAMES)})"
        for label, method in labels.items()
        if method not in METHOD_NAMES
    ]
    problems += [f"[labels] {label}: a method's name, not a label" for label in labels
                 if label in METHOD_NAMES]  # fmt: skip
    problems += [
        f"unknown strategy {s!r} (known: {', '.join(METHOD_NAMES)}, or a label of [labels])"
        for s in strategies
        if s not in METHOD_NAMES and s not in labels
    ]
    overrides = {name: flatten_dict(knobs) for name, knobs in spec.get("overrides", {}).items()}
    for strategy, knobs in overrides.items():
        protocol = sorted(PROTOCOL_KEYS & set(knobs))
        if protocol:
            problems.append(
                f"[overrides.{strategy}] sets {', '.join(protocol)}: these define the shared "
                "experiment; set them in [run-config] or with --set for every method"
            )
    comparison = Comparison(
        path.stem, spec.get("description", ""), strategies, shared, overrides, labels
    )
    if not problems:
        for strategy in strategies:
            try:
                parse_run_config(comparison.run_config(strategy))
            except ConfigError as err:
                problems.append(f"{strategy}: {err}")
    if problems:
        raise ConfigError(f"comparison {path.name} cannot run:\n  - " + "\n  - ".join(problems))
    return comparison


def run_dir_of(out_dir: Path, strategy: str) -> Path:
    """Where a comparison's run of one strategy writes its files."""
    return out_dir / folder_name(strategy) / "run"


def placed_run_config(comparison: Comparison, strategy: str, out_dir: Path) -> dict[str, Any]:
    """A strategy's run config, writing into ``run_dir_of(out_dir, strategy)``."""
    return comparison.run_config(strategy) | {
        "out-dir": str(out_dir),
        "run-name": f"{folder_name(strategy)}/run",
    }


def check_kept_runs(comparison: Comparison, out_dir: Path) -> None:
    """Stop, before anything runs, where a finished or interrupted run in ``out_dir`` was made
    with another run config than the comparison's now: keeping it would mix two experiments in
    one table, and running again would overwrite a finished run. Only the placement keys
    (``fedapp.run.config.PLACEMENT_KEYS``) may differ."""
    problems = []
    for strategy in comparison.strategies:
        run_dir = run_dir_of(out_dir, strategy)
        if not any((run_dir / f).exists() for f in (SUMMARY_FILE, CHECKPOINT_FILE)):
            continue
        if not (run_dir / CONFIG_FILE).exists():
            problems.append(f"{strategy}: {run_dir} has results but no {CONFIG_FILE}")
            continue
        differences = config_differences(
            read_json(run_dir / CONFIG_FILE),
            parse_run_config(placed_run_config(comparison, strategy, out_dir)),
        )
        if differences:
            changed = describe_differences(differences)
            problems.append(f"{strategy}: {run_dir} was run with another config: {changed}")
    if problems:
        raise ConfigError(
            f"comparison {comparison.name!r} cannot continue in {out_dir}:\n  - "
            + "\n  - ".join(problems)
            + "\ngive another --out, or remove a run's folder to run it again"
        )


def _accuracy_text(summary: dict[str, Any]) -> str:
    return format_accuracy(summary["test_accuracy"], _interval(summary, "test_accuracy"))


def run_comparison(
    comparison: Comparison, out_dir: Path, federation: str, timeout: float
) -> dict[str, dict[str, Any]]:
    """Run every strategy with ``flwr run``; return their summaries (failed runs are reported
    with their log and left out). A strategy whose run in ``out_dir`` finished is kept, one
    with a checkpoint but no summary (interrupted) continues from its last completed round
    (``resume = true``); either only with the same run config (:func:`check_kept_runs`)."""
    check_kept_runs(comparison, out_dir)
    summaries = {}
    for position, strategy in enumerate(comparison.strategies, start=1):
        head = f"[{position}/{len(comparison.strategies)}] {strategy}"
        workdir = out_dir / folder_name(strategy)
        workdir.mkdir(parents=True, exist_ok=True)
        summary_path = run_dir_of(out_dir, strategy) / SUMMARY_FILE
        if summary_path.exists():
            summaries[strategy] = read_json(run_dir_of(out_dir, strategy) / SUMMARY_FILE)
            text = _accuracy_text(summaries[strategy])
            print(f"{head}: already finished ({text}), kept", flush=True)
            continue
        config = placed_run_config(comparison, strategy, out_dir)
        if (run_dir_of(out_dir, strategy) / CHECKPOINT_FILE).exists():
            config["resume"] = True
            print(f"{head}: interrupted, resuming from its checkpoint ...", flush=True)
        else:
            print(f"{head} ...", flush=True)
        progress = RunProgress(run_dir_of(out_dir, strategy), config["num-server-rounds"])
        try:
            run_config = write_run_config(workdir / "run-config.toml", config)
            run_app(run_config, federation, workdir, timeout, watch=progress.update)
        finally:
            progress.close()
        if summary_path.exists():
            summaries[strategy] = read_json(run_dir_of(out_dir, strategy) / SUMMARY_FILE)
            print(f"    done in {summaries[strategy]['wall_seconds']:.0f} s", flush=True)
        else:
            print(f"    FAILED: no summary.json; see {workdir / 'flwr-run.log'}", flush=True)
    return summaries


def collect_summaries(out_dir: Path, strategies: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Summaries of runs a previous ``fedapp compare`` left in ``out_dir``."""
    found = {}
    for strategy in strategies:
        if (run_dir_of(out_dir, strategy) / SUMMARY_FILE).exists():
            found[strategy] = read_json(run_dir_of(out_dir, strategy) / SUMMARY_FILE)
    return found


def _optional(mapping: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping:
            return None
        mapping = mapping[key]
    value = mapping
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _interval(summary: dict[str, Any], key: str) -> tuple[float, float] | None:
    """The 95 % interval of a summary's accuracy (``<key>_ci95``); None where it has none (a
    missing teacher's accuracy, a mean over no answering client)."""
    stored = summary.get(key + SUMMARY_SUFFIX)
    return None if stored is None else (float(stored[0]), float(stored[1]))


def _with_bounds(key: str, value: Any, interval: tuple[float, float] | None) -> dict[str, Any]:
    """An accuracy column and its interval's two columns (None where unknown)."""
    low, high = interval or (None, None)
    return {key: value, key + CI_LOW: low, key + CI_HIGH: high}


def method_row(strategy: str, summary: dict[str, Any]) -> dict[str, Any]:
    """One line of the comparison table from a run's summary.json; test and population accuracy
    each with the bounds of its 95 % interval (``..._ci95_low``, ``..._ci95_high``)."""
    comm = summary.get("comm", {})
    rounds = comm.get("client_rounds") or 0
    traffic = (comm.get("bytes_down_total") or 0.0) + (comm.get("bytes_up_total") or 0.0)
    variants = summary.get("variants", [])
    # Points no client trained directly say nothing about what the method reaches at that cost.
    trained = [v for v in variants if v.get("trained", True)]
    compute = _optional(summary, "compute_proxy_total_macs")
    rise = frontier_rise(trained)
    return {
        "method": strategy,
        **_with_bounds(
            "test_accuracy", summary["test_accuracy"], _interval(summary, "test_accuracy")
        ),
        "test_loss": summary.get("test_loss"),
        **_with_bounds(
            "population_accuracy",
            summary.get("population_accuracy"),
            _interval(summary, "population_accuracy"),
        ),
        "operating_points": len(variants),
        "trained_points": len(trained),
        "min_macs": min((v["macs"] for v in trained), default=None),
        "max_macs": max((v["macs"] for v in variants), default=None),
        # how the trained points rise from the cheapest to the costliest, and in rank order
        "frontier_rise": rise.rise if rise else None,
        "frontier_spearman": rise.spearman if rise and math.isfinite(rise.spearman) else None,
        "payload_mb_per_client_round": traffic / rounds / 2**20 if rounds else None,
        "params_per_client_round": comm.get("mean_params_per_client_round"),
        "compute_proxy_tmacs": compute / 1e12 if compute else None,
        "comm_mb_per_client": _optional(summary, "resources", "comm_mb_per_client"),
        "cpu_percent": _optional(summary, "resources", "cpu_percent_mean"),
        "memory_mb": _optional(summary, "resources", "peak_rss_mb_mean"),
        "wall_seconds": summary.get("wall_seconds"),
    }


def efficiency_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Acc, Loss, Comm, CPU, Mem and the composite scores of the methods that report them."""
    usable = [r for r in rows if r["test_loss"] is not None and r["comm_mb_per_client"]]
    if len(usable) < 2:
        return []
    costs = {
        r["method"]: MethodCosts(
            r["test_accuracy"],
            r["test_loss"],
            r["comm_mb_per_client"],
            r["cpu_percent"],
            r["memory_mb"],
        )
        for r in usable
    }
    scores = efficiency_scores(costs)
    bounds = {
        r["method"]: (r.get("test_accuracy" + CI_LOW), r.get("test_accuracy" + CI_HIGH))
        for r in rows
    }
    return [
        {
            "method": name,
            "Acc": c.accuracy,
            "Acc" + CI_LOW: bounds[name][0],
            "Acc" + CI_HIGH: bounds[name][1],
            "Loss": c.loss,
            "Comm (MB)": c.comm_mb,
            "CPU (%)": c.cpu_percent,
            "Mem (MB)": c.memory_mb,
            **scores[name],
        }
        for name, c in costs.items()
    ]


def _cell(value: Any, key: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if key in {"test_accuracy", "population_accuracy", "Acc"}:
        return f"{100 * value:.2f} %"
    if key == "frontier_rise":
        return f"{100 * value:+.2f} pt"
    if key in {"min_macs", "max_macs"}:
        return f"{value / 1e6:.2f}M"
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def _is_bound(key: str) -> bool:
    return key.endswith((CI_LOW, CI_HIGH))


def _bounds_text(row: dict[str, Any], key: str) -> str:
    """`` [95.41, 97.66]``: the interval of an accuracy cell, where the row has one."""
    low, high = row.get(key + CI_LOW), row.get(key + CI_HIGH)
    if row[key] is None or low is None or high is None:
        return ""
    return f" [{100 * low:.2f}, {100 * high:.2f}]"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Rows of equal keys as a GitHub markdown table; an accuracy's interval columns are shown
    in its cell, ``96.70 % [95.41, 97.66]``."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if not _is_bound(k)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += [
        "| " + " | ".join(_cell(r[k], k) + _bounds_text(r, k) for k in keys) + " |" for r in rows
    ]
    return "\n".join(lines)


def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(round, validation accuracy) of every validated round of a run (none where its
    metrics.jsonl is missing)."""
    path = run_dir / METRICS_FILE
    rows = read_jsonl(path) if path.is_file() else []
    return [(int(r["round"]), float(r[SELECTION_KEY])) for r in rows if SELECTION_KEY in r]


def fleet_progress(out_dir: Path, strategies: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each finished run's rounds with their fleet time (computed from the files of a run
    from before the clock, fedapp.results.timed_rounds)."""
    progress = {}
    for strategy in strategies:
        run_dir = run_dir_of(out_dir, strategy)
        if (run_dir / METRICS_FILE).is_file():
            progress[strategy] = timed_rounds(run_dir)[0]
    return progress


def default_target(progress: dict[str, list[dict[str, Any]]]) -> float | None:
    """The lowest of the methods' final validation accuracies: an accuracy every method
    reached, so that each has a time to it."""
    finals = [
        next(r[SELECTION_KEY] for r in reversed(rows) if SELECTION_KEY in r)
        for rows in progress.values()
        if any(SELECTION_KEY in r for r in rows)
    ]
    return min(finals) if finals else None


def fleet_columns(rows: list[dict[str, Any]], target: float | None, images: int) -> dict[str, Any]:
    """A method's fleet hours, the updates its round policy lost, and the round and fleet
    hours at which its validation accuracy first reached ``target``, with the hours at which
    the 95 % interval of its validation accuracy (on ``images`` images) first reached it with
    its upper bound (``_early``) and its lower bound (``_late``)."""
    timed = [r for r in rows if FLEET_TOTAL in r]
    lost = sum(int(r.get("clients-late", 0)) + int(r.get("clients-surplus", 0)) for r in rows)
    reached, (early, late) = None, (None, None)
    if target is not None:
        reached = time_to_target(timed, target, SELECTION_KEY)
        early, late = time_to_target_interval(timed, target, SELECTION_KEY, images)
    return {
        "fleet_hours": timed[-1][FLEET_TOTAL] / 3600 if timed else None,
        "updates_lost": lost,
        "round_to_target": reached[0] if reached else None,
        "hours_to_target": reached[1] / 3600 if reached else None,
        "hours_to_target_early": early / 3600 if early is not None else None,
        "hours_to_target_late": late / 3600 if late is not None else None,
    }


def write_outputs(
    out_dir: Path,
    comparison: Comparison,
    summaries: dict[str, dict[str, Any]],
    target: float | None = None,
) -> dict[str, Any]:
    """The comparison table, operating points, efficiency scores, plots and a markdown report;
    the time to ``target`` validation accuracy (default: the lowest final one)."""
    progress = fleet_progress(out_dir, [s for s in comparison.strategies if s in summaries])
    target = default_target(progress) if target is None else target
    images = int(comparison.run_config(comparison.strategies[0])["validation-size"])
    rows = [
        method_row(s, summaries[s]) | fleet_columns(progress.get(s, []), target, images)
        for s in comparison.strategies
        if s in summaries
    ]
    if not rows:
        raise ConfigError(f"no run of comparison {comparison.name!r} produced a summary")
    write_csv(out_dir / TABLE_FILE, rows)
    points = [
        {
            "method": s,
            **{k: v[k] for k in ("index", "macs", "params", "accuracy")},
            **dict(zip((LOW, HIGH), row_interval(v) or (None, None), strict=True)),
            "trained": v.get("trained", True),
        }
        for s in summaries
        for v in summaries[s].get("variants", [])
    ]
    if points:
        write_csv(out_dir / POINTS_FILE, points)
    single = [s for s in summaries if not summaries[s].get("variants")]
    plot_methods_accuracy_vs_macs(
        out_dir / PLOT_FILE,
        {s: summaries[s].get("variants", []) for s in summaries},
        {s: summaries[s]["test_accuracy"] for s in single},
        f"{comparison.name}: test accuracy of every operating point (95 % intervals)",
        {s: _interval(summaries[s], "test_accuracy") for s in single},
    )
    plot_methods_rounds(
        out_dir / ROUNDS_PLOT_FILE,
        {s: validation_curve(run_dir_of(out_dir, s)) for s in summaries},
        f"{comparison.name}: validation accuracy by round",
    )
    timed = {
        s: [r for r in rows if SELECTION_KEY in r]
        for s, rows in progress.items()
        if all(FLEET_TOTAL in r for r in rows)
    }
    plot_methods_rounds(
        out_dir / FLEET_PLOT_FILE,
        {s: [(r[FLEET_TOTAL] / 3600, r[SELECTION_KEY]) for r in rows] for s, rows in timed.items()},
        f"{comparison.name}: validation accuracy against the fleet's time (95 % intervals)",
        x_label="fleet hours",
        target=target,
        bands={
            s: [wilson_interval(r[SELECTION_KEY], images) for r in rows]
            for s, rows in timed.items()
        },
    )
    efficiency = efficiency_rows(rows)
    if efficiency:
        write_csv(out_dir / EFFICIENCY_FILE, efficiency)
    report = f"# Comparison {comparison.name}\n\n{comparison.description}\n\n"
    report += markdown_table(rows) + "\n"
    if any(r["test_accuracy" + CI_LOW] is not None for r in rows):
        report += (
            "\nIn brackets: the 95 % Wilson score interval of each accuracy, from the number of "
            "test images it was measured on.\n"
        )
    if target is not None:
        report += (
            "\nFleet time: each round lasts as long as the replies its policy waits for on the "
            f"fleet, plus the server's own work (`{FLEET_PLOT_FILE}`). Hours and round to "
            "target: the first validated round whose validation accuracy reaches "
            f"{100 * target:.2f} % (the validation cadence bounds it); early and late: the "
            "first at which the 95 % interval of its validation accuracy reaches the target "
            "with its upper and with its lower bound; updates lost: replies dropped as late or "
            "surplus by the round policy.\n"
        )
    if efficiency:
        report += "\n## Efficiency (FedKD-NAS scores)\n\n" + markdown_table(efficiency) + "\n"
    replace_text(out_dir / REPORT_FILE, report)
    return {
        "rows": rows,
        "efficiency": efficiency,
        "report": report,
        "target": target,
        "out_dir": str(out_dir),
    }


def seed_dir(out_dir: Path, seed: int) -> Path:
    return out_dir / f"seed-{seed}"


def mean_std_rows(per_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per method (in first-seen order): the number of seeds and, per column, the mean and the
    sample standard deviation over the seeds that report a number (0 for one seed; None where
    none does), so every method's row has the same columns."""
    everything = [row for rows in per_seed for row in rows]
    methods = list(dict.fromkeys(row["method"] for row in everything))
    # Across seeds the spread is the std; a seed's own interval bounds are not averaged.
    keys = [
        k
        for k in dict.fromkeys(k for row in everything for k in row)
        if k != "method" and not _is_bound(k)
    ]
    result = []
    for method in methods:
        rows = [row for row in everything if row["method"] == method]
        merged: dict[str, Any] = {"method": method, "seeds": len(rows)}
        for key in keys:
            values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
            merged[key] = statistics.fmean(values) if values else None
            merged[key + "_std"] = (
                (statistics.stdev(values) if len(values) > 1 else 0.0) if values else None
            )
        result.append(merged)
    return result


def mean_std_table(rows: list[dict[str, Any]]) -> str:
    """The mean ± std rows as a markdown table, one column per measured quantity."""
    if not rows:
        return ""
    keys = [k for k in rows[0] if not k.endswith("_std") and k not in {"method", "seeds"}]
    lines = [
        "| method | seeds | " + " | ".join(keys) + " |",
        "|" + "---|" * (len(keys) + 2),
    ]
    for row in rows:
        cells = []
        for key in keys:
            if row[key] is None:
                cells.append("-")
                continue
            mean, std = _cell(row[key], key), _cell(row[key + "_std"], key)
            unit = " %" if mean.endswith(" %") else ""
            cells.append(f"{mean.removesuffix(' %')} ± {std.removesuffix(' %')}{unit}")
        lines.append(f"| {row['method']} | {row['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_seed_outputs(
    out_dir: Path, comparison: Comparison, per_seed: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """Mean ± std over seeds of the comparison table and the efficiency scores (each seed's
    scores are computed among that seed's runs), a plot and a markdown report."""
    seeds = sorted(per_seed)
    rows = mean_std_rows([per_seed[s]["rows"] for s in seeds])
    efficiency = mean_std_rows(
        [per_seed[s]["efficiency"] for s in seeds if per_seed[s]["efficiency"]]
    )
    write_csv(out_dir / TABLE_FILE, rows)
    if efficiency:
        write_csv(out_dir / EFFICIENCY_FILE, efficiency)
    plot_method_means(
        out_dir / SEEDS_PLOT_FILE,
        {r["method"]: (r["test_accuracy"], r["test_accuracy_std"]) for r in rows},
        f"{comparison.name}: test accuracy, mean ± std over seeds {', '.join(map(str, seeds))}",
    )
    report = f"# Comparison {comparison.name}, seeds {', '.join(map(str, seeds))}\n\n"
    report += f"{comparison.description}\n\nMean ± standard deviation over the seeds.\n\n"
    report += mean_std_table(rows) + "\n"
    if efficiency:
        report += "\n## Efficiency (FedKD-NAS scores)\n\n" + mean_std_table(efficiency) + "\n"
    replace_text(out_dir / REPORT_FILE, report)
    return {"rows": rows, "efficiency": efficiency, "report": report, "out_dir": str(out_dir)}


# ---- the command line (registered in fedapp.tools.cli) ----------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("comparison", help="conf/compare/<name>.toml name, or a .toml file")
    parser.add_argument(
        "--strategies", help="comma-separated subset of the file's strategies (or others)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a shared run-config key for every method (repeatable)",
    )
    parser.add_argument(
        "--out", default="", help="output folder (default ~/fedapp-runs/compare-<name>)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run everything under N seeds (the configured one and the N - 1 after it); "
        "tables give mean ± std",
    )
    parser.add_argument("--client-cpus", type=float, default=1.0, help="CPUs per simulated client")
    parser.add_argument("--client-gpus", type=float, default=0.0, help="GPUs per simulated client")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per run")
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="validation accuracy in [0, 1] to time every method to (default: the lowest of "
        "the methods' final validation accuracies)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the tables and plot from the runs already in the output folder",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    only = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    comparison = load_comparison(args.comparison, args.set, only)
    if args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: the number of seeds must be 1 or more")
    if not args.report_only and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "fedapp compare runs Flower's simulation engine (Ray), which this install lacks: "
            'pip install -e ".[simulation]" (--report-only needs only ".[data]")'
        )
    out_dir = Path(args.out or f"~/fedapp-runs/compare-{comparison.name}").expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.seeds == 1:
        return _run_one(args, comparison, out_dir)
    if not args.report_only:  # every seed's kept runs are checked before the first run
        for seed in comparison.seeds(args.seeds):
            check_kept_runs(comparison.with_seed(seed), seed_dir(out_dir, seed))
    per_seed = {}
    for seed in comparison.seeds(args.seeds):
        print(f"seed {seed}:", flush=True)
        folder = seed_dir(out_dir, seed)
        folder.mkdir(exist_ok=True)
        if args.report_only and not collect_summaries(folder, comparison.strategies):
            print(f"    no finished run in {folder}; left out", flush=True)
            continue
        per_seed[seed] = _run_one(args, comparison.with_seed(seed), folder)
    if not per_seed:
        raise ConfigError(f"no seed of comparison {comparison.name!r} has a finished run")
    return write_seed_outputs(out_dir, comparison, per_seed)


def _run_one(args: argparse.Namespace, comparison: Comparison, out_dir: Path) -> dict[str, Any]:
    """One seed: run (or with --report-only collect) every strategy, then its tables."""
    if args.report_only:
        summaries = collect_summaries(out_dir, comparison.strategies)
    else:
        clients = parse_run_config(comparison.run_config(comparison.strategies[0])).num_clients
        federation = (
            f"num-supernodes={clients} client-resources-num-cpus={args.client_cpus:g} "
            f"client-resources-num-gpus={args.client_gpus:g}"
        )
        summaries = run_comparison(comparison, out_dir, federation, args.timeout)
    return write_outputs(out_dir, comparison, summaries, args.target)
