"""A finished run's files as one object to work with: ``load_run(path)``.

A run folder holds summary.json, metrics.jsonl and whichever CSVs its method writes (see
``fedapp.evaluation.results`` and the strategies); :func:`load_run` reads them into pandas
DataFrames under fixed names, so a notebook or script need not know which method wrote which
file. ``fedapp show <run-dir>`` prints the same facts (:func:`describe`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedapp.data.extras import DATA, needs_extra
from fedapp.evaluation.accounting import CLIENT_WORK_FILE, COMMUNICATION_FILE, FLEET_FILE
from fedapp.evaluation.fleet_time import FLEET_SECONDS, FLEET_TOTAL, kept_round_seconds
from fedapp.evaluation.intervals import (
    HIGH,
    LOW,
    SUMMARY_SUFFIX,
    format_accuracy,
)
from fedapp.evaluation.labels import LABELS_FILE
from fedapp.evaluation.operating_points import POPULATION_FILE, VARIANTS_FILE
from fedapp.evaluation.results import (
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    read_json,
    read_jsonl,
    read_text_whole,
    unreadable,
)
from fedapp.methods.common.evaluators import CLIENTS_FILE
from fedapp.run.config import APP_DIR, ConfigError, fused_run_config, parse_saved_config
from fedapp.run.context import run_context
from fedapp.run.fleet import RunFleet

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunResults:
    """One run's results; a table the run's method does not write is None."""

    run_dir: Path
    summary: dict[str, Any]  # summary.json (with intervals, also for summaries that predate them)
    config: dict[str, Any] | None  # config.json: the resolved run config
    #: metrics.jsonl: one row per round, column ``round`` first; ``fleet-seconds`` and
    #: ``fleet-seconds-total`` computed from the run's files where it predates the clock
    #: (``fleet_from_files``)
    metrics: pd.DataFrame
    points: pd.DataFrame | None  # variants.csv: every operating point's test accuracy
    population: pd.DataFrame | None  # population.csv: each client's served and best point
    communication: pd.DataFrame | None  # communication.csv: every accepted client-round
    client_work: pd.DataFrame | None  # client_work.csv: each client-round's device, time, memory
    clients: pd.DataFrame | None  # clients.csv: client-held models' test accuracies
    labels: pd.DataFrame | None  # labels.csv: examples per client (index) and class (columns)
    fleet: pd.DataFrame | None  # fleet.csv: each valid client-round's class, fleet seconds, outcome
    fleet_from_files: bool = False  # the fleet columns were computed here (a run kept from before)

    @property
    def fleet_hours(self) -> float | None:
        """The run's length on its fleet (None where it cannot be known)."""
        if FLEET_TOTAL not in self.metrics or self.metrics.empty:
            return None
        return float(self.metrics[FLEET_TOTAL].iloc[-1]) / 3600.0

    @property
    def strategy(self) -> str:
        return str(self.summary["strategy"])

    @property
    def test_accuracy(self) -> float:
        return float(self.summary["test_accuracy"])

    @property
    def test_interval(self) -> tuple[float, float] | None:
        """The test accuracy's 95 % interval, None where the run could not give one."""
        return _interval(self.summary, "test_accuracy")


def load_run(path: str | Path) -> RunResults:
    """Every result file of the run in ``path`` (a folder with summary.json); ValueError naming
    the folder when it is none, RunFileError (a ValueError) naming a file that is torn or
    corrupt."""
    with needs_extra(DATA, "loading a run's tables"):
        import pandas as pd

    run_dir = Path(path).expanduser()
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: no such folder (give a run's folder, <out-dir>/<run-name>)")
    if not (run_dir / SUMMARY_FILE).is_file():
        raise ValueError(
            f"{run_dir} has no {SUMMARY_FILE}: not the folder of a finished run "
            "(give <out-dir>/<run-name>; an interrupted run gets its summary when resumed)"
        )
    rows, from_files = timed_rounds(run_dir)
    metrics = pd.DataFrame(rows)
    if "round" in metrics:
        metrics = metrics[["round", *sorted(c for c in metrics if c != "round")]]
        metrics = metrics.sort_values("round", ignore_index=True)
    config_path = run_dir / CONFIG_FILE
    return RunResults(
        run_dir=run_dir,
        summary=read_json(run_dir / SUMMARY_FILE),
        config=read_json(config_path) if config_path.is_file() else None,
        metrics=metrics,
        points=_csv(run_dir / VARIANTS_FILE),
        population=_csv(run_dir / POPULATION_FILE),
        communication=_csv(run_dir / COMMUNICATION_FILE),
        client_work=_csv(run_dir / CLIENT_WORK_FILE),
        clients=_csv(run_dir / CLIENTS_FILE),
        labels=_csv(run_dir / LABELS_FILE, index_col="partition"),
        fleet=_csv(run_dir / FLEET_FILE),
        fleet_from_files=from_files,
    )


def timed_rounds(run_dir: Path) -> tuple[list[dict[str, Any]], bool]:
    """metrics.jsonl's rows of a finished run, each with ``fleet-seconds`` and
    ``fleet-seconds-total``; for a run from before the clock they are computed from its files
    on the default fleet under wait-for-all (fedapp.evaluation.fleet_time), and the second
    value says so. A run whose files cannot give them keeps its rows as they are."""
    rows = read_jsonl(run_dir / METRICS_FILE)
    if not rows or all(FLEET_SECONDS in r for r in rows):
        return rows, False
    seconds = _kept_fleet_seconds(run_dir, rows)
    if seconds is None:
        return rows, False
    total = 0.0
    timed = []
    for row in sorted(rows, key=lambda r: int(r["round"])):
        total += seconds[int(row["round"])]
        timed.append(row | {FLEET_SECONDS: seconds[int(row["round"])], FLEET_TOTAL: total})
    return timed, True


def _kept_fleet_seconds(run_dir: Path, rows: list[dict[str, Any]]) -> dict[int, float] | None:
    """Round -> fleet seconds of a run from before the clock; None where its files (config,
    summary, communication.csv) cannot give them."""
    config_path, traffic_path = run_dir / CONFIG_FILE, run_dir / COMMUNICATION_FILE
    if not (config_path.is_file() and traffic_path.is_file()):
        return None
    try:
        run = run_context(parse_saved_config(read_json(config_path), fused_run_config(APP_DIR, {})))
        fleet = RunFleet(run.fleet, run.data.budgets, run.rounds.seed)
        summary = read_json(run_dir / SUMMARY_FILE)
        compute = {int(k): float(v) for k, v in summary["compute_proxy_by_client"].items()}
        with traffic_path.open(newline="") as handle:
            communication = list(csv.DictReader(handle))
        return kept_round_seconds(rows, communication, compute, fleet.devices)
    except (ConfigError, KeyError, TypeError, ValueError, IndexError):
        return None


def _csv(path: Path, index_col: str | None = None) -> pd.DataFrame | None:
    with needs_extra(DATA, "loading a run's tables"):
        import pandas as pd

    if not path.is_file():
        return None
    read_text_whole(path)  # a CSV cut short would otherwise read as a short last row
    try:
        return pd.read_csv(path, index_col=index_col)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as err:
        raise unreadable(path, err) from None


def _interval(summary: dict[str, Any], key: str) -> tuple[float, float] | None:
    stored = summary.get(key + SUMMARY_SUFFIX)
    return (float(stored[0]), float(stored[1])) if stored is not None else None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def describe(run: RunResults) -> tuple[dict[str, Any], str]:
    """What ``fedapp show`` prints: the run's headline figures and its operating points, as a
    JSON-able mapping and as text."""
    summary = run.summary
    population = _finite(summary.get("population_accuracy"))
    points = [
        {
            "index": int(p["index"]),
            "macs": int(p["macs"]),
            "params": p.get("params"),
            "accuracy": p.get("accuracy"),
            "ci95": [p[LOW], p[HIGH]] if p.get(LOW) is not None else None,
            "trained": p.get("trained", True),
        }
        for p in summary.get("variants", [])
    ]
    data: dict[str, Any] = {
        "run_dir": str(run.run_dir),
        "strategy": run.strategy,
        "dataset": summary.get("dataset"),
        "rounds": summary.get("rounds"),
        "best_round": summary.get("best_round"),
        "test_accuracy": run.test_accuracy,
        "test_accuracy_ci95": run.test_interval,
        "test_images": summary.get("test_images"),
        "population_accuracy": population,
        "population_accuracy_ci95": _interval(summary, "population_accuracy"),
        "clients": len(run.clients) if run.clients is not None else None,
        "work_by_device": summary.get("work_by_device", {}),
        "fleet": _fleet_facts(run),
        "points": points,
    }
    lines = [
        f"run          {run.run_dir}",
        f"strategy     {run.strategy} on {summary.get('dataset')}, {summary.get('rounds')} rounds "
        f"(best validation round {summary.get('best_round')})",
        f"test         {format_accuracy(run.test_accuracy, run.test_interval)}"
        + (f" on {summary['test_images']:,} images" if "test_images" in summary else ""),
    ]
    if population is not None:
        interval = _interval(summary, "population_accuracy")
        lines.append(f"population   {format_accuracy(population, interval)} (largest affordable)")
    if run.clients is not None and "accuracy" in run.clients:
        lines.append(
            f"clients      {len(run.clients)} with models of their own, mean test accuracy "
            f"{100 * run.clients['accuracy'].mean():.2f}% (clients.csv)"
        )
    if data["fleet"] is not None:
        lines.append(_fleet_line(data["fleet"]))
    for device, work in data["work_by_device"].items():
        lines.append(
            f"work         {device}: {work['client_rounds']} client-rounds, "
            f"{work['seconds_mean']:.1f} s each on average (longest {work['seconds_max']:.1f} s), "
            f"peak memory {work['peak_rss_mb_max']:,.0f} MB"
        )
    if points:
        lines += ["", f"{'point':>5} {'MACs':>13} {'params':>11}  test accuracy [95 % interval]"]
        for p in points:
            accuracy = _finite(p["accuracy"])
            text = format_accuracy(accuracy, p["ci95"]) if accuracy is not None else "-"
            params = f"{p['params']:>11,}" if isinstance(p["params"], int) else f"{'-':>11}"
            untrained = "" if p["trained"] else "  (no client trained it directly)"
            lines.append(f"{p['index']:>5} {p['macs']:>13,} {params}  {text}{untrained}")
    return data, "\n".join(lines)


def _fleet_facts(run: RunResults) -> dict[str, Any] | None:
    """The run's fleet, policy, hours on it and replies its policy dropped (summary.json's
    ``fleet``, or the defaults for a run computed from its files); None where unknown."""
    hours = run.fleet_hours
    if hours is None:
        return None
    stored = run.summary.get("fleet", {})
    return {
        "hours": hours,
        "file": stored.get("file", "default"),
        "policy": stored.get("policy", "wait-for-all"),
        "clock": stored.get("clock", "virtual"),
        "clients_late": stored.get("clients_late", 0),
        "clients_surplus": stored.get("clients_surplus", 0),
        "from_files": run.fleet_from_files,
    }


def _fleet_line(fleet: dict[str, Any]) -> str:
    clock = "measured rounds" if fleet["clock"] == "wall" else f"fleet {fleet['file']!r}"
    lost = f", {fleet['clients_late']} late and {fleet['clients_surplus']} surplus replies dropped"
    origin = " (computed from the run's files)" if fleet["from_files"] else ""
    return f"fleet        {fleet['hours']:.3f} hours on {clock}, {fleet['policy']}{lost}{origin}"
