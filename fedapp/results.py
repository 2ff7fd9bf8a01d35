"""A finished run's files as one object to work with: ``load_run(path)``.

A run folder holds summary.json, metrics.jsonl and whichever CSVs its method writes (see
``fedapp.evaluation.results`` and the strategies); :func:`load_run` reads them into pandas
DataFrames under fixed names, so a notebook or script need not know which method wrote which
file. ``fedapp show <run-dir>`` prints the same facts (:func:`describe`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedapp.data.extras import DATA, needs_extra
from fedapp.evaluation.accounting import CLIENT_WORK_FILE, COMMUNICATION_FILE
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

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunResults:
    """One run's results; a table the run's method does not write is None."""

    run_dir: Path
    summary: dict[str, Any]  # summary.json (with intervals, also for summaries that predate them)
    config: dict[str, Any] | None  # config.json: the resolved run config
    metrics: pd.DataFrame  # metrics.jsonl: one row per round, column ``round`` first
    points: pd.DataFrame | None  # variants.csv: every operating point's test accuracy
    population: pd.DataFrame | None  # population.csv: each client's served and best point
    communication: pd.DataFrame | None  # communication.csv: every accepted client-round
    client_work: pd.DataFrame | None  # client_work.csv: each client-round's device, time, memory
    clients: pd.DataFrame | None  # clients.csv: client-held models' test accuracies
    labels: pd.DataFrame | None  # labels.csv: examples per client (index) and class (columns)

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
    metrics_path = run_dir / METRICS_FILE
    metrics = pd.DataFrame(read_jsonl(metrics_path))
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
    )


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
