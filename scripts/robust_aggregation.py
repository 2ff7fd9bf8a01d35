"""Flower's robust aggregation rules against lying clients, on fedapp's toolbox.

Plain FedAvg and Flower's Krum, MultiKrum, FedTrimmedAvg, FedMedian and Bulyan (``flwr:<name>``),
each with every client honest and with one and two clients that send random weights (N(0, 10)
for every parameter) with their true example count in every round: fedapp's reply checks accept
such a reply (it has the right arrays, finite values and no more examples than its node holds),
so only the aggregation can resist it. The same weights claimed for 10^12 examples are dropped by
fedapp's checks under every strategy (tests/federation/test_hostile_clients.py).

Each run is the real ServerApp over the in-process grid (tests/support/local_grid.py: fedapp's
ClientApp, every message through Flower's serialisation), with the hostile partitions wrapped by
tests/support/hostile_client.py. A finished run is kept and skipped when the script runs again.
Prints (and writes as ``robustness.md`` in ``--out``) one row per strategy: test accuracy with
its 95 % Wilson interval per scenario, and the honest run's cost against FedAvg's.

    python scripts/robust_aggregation.py --out docs/results/runs/flower-robustness
    python scripts/robust_aggregation.py --out /tmp/r --rounds 2 --strategies flwr:krum  # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))

from hostile_client import hostile_app  # noqa: E402
from local_grid import LocalGrid, run_config, server_context  # noqa: E402

from fedapp.apps.client_app import app as client_app  # noqa: E402
from fedapp.apps.server_app import run_experiment  # noqa: E402
from fedapp.evaluation.intervals import format_measured  # noqa: E402
from fedapp.evaluation.results import SUMMARY_FILE, read_json  # noqa: E402
from fedapp.method_table import folder_name  # noqa: E402
from fedapp.run.config import parse_run_config  # noqa: E402

#: Fashion-MNIST, 12 clients of 1,000 training images each (IID), all in every round, so that
#: Bulyan's 4f + 3 = 11 replies hold for f = 2; LeNet5, one local epoch of SGD at 0.01.
PROTOCOL: dict[str, Any] = {
    "dataset": "fashion-mnist",
    "num_clients": 12,
    "fraction_train": 1.0,
    "client_pool_size": 12_000,
    "partitioner": "iid",
    "model": "lenet5-x1.0",
    "local_epochs": 1,
    "batch_size": 32,
    "learning_rate": 0.01,
    "lr_schedule": "constant",
    "validation_size": 1000,
    "eval_every": 5,
}
#: Each rule assumes at most two Byzantine clients a round (the most any scenario has).
STRATEGIES: dict[str, dict[str, Any]] = {
    "flwr:fedavg": {},
    "flwr:krum": {"flwr_krum__num_malicious_nodes": 2},
    "flwr:multikrum": {
        "flwr_multikrum__num_malicious_nodes": 2,
        "flwr_multikrum__num_nodes_to_select": 10,
    },
    "flwr:fedtrimmedavg": {"flwr_fedtrimmedavg__beta": 0.2},
    "flwr:fedmedian": {},
    "flwr:bulyan": {"flwr_bulyan__num_malicious_nodes": 2},
}
#: Scenario -> how many clients (partitions 0, 1, ...) lie in every round.
SCENARIOS = {"honest": 0, "1 liar": 1, "2 liars": 2}


def run_name(strategy: str, scenario: str) -> str:
    return f"{folder_name(strategy)}-{scenario.replace(' ', '-')}"


def run_one(out: Path, strategy: str, scenario: str, rounds: int) -> dict[str, Any]:
    """One run (or the kept summary of a finished one)."""
    name = run_name(strategy, scenario)
    if (out / name / SUMMARY_FILE).is_file():
        return read_json(out / name / SUMMARY_FILE)
    settings = PROTOCOL | STRATEGIES[strategy] | {"strategy": strategy}
    folder = {"num_server_rounds": rounds, "out_dir": str(out), "run_name": name}
    config = run_config(**settings | folder)
    server_context(config)
    liars = range(SCENARIOS[scenario])
    lies = {p: dict.fromkeys(range(1, rounds + 1), "noisy-weights") for p in liars}
    app = hostile_app(lies) if lies else client_app
    grid = LocalGrid(app, config, num_nodes=PROTOCOL["num_clients"])
    return run_experiment(grid, parse_run_config(config))


def kept_results(out: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Every finished run in ``out`` (this invocation's and earlier ones'), by strategy and
    scenario."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for strategy in STRATEGIES:
        for scenario in SCENARIOS:
            path = out / run_name(strategy, scenario) / SUMMARY_FILE
            if path.is_file():
                results.setdefault(strategy, {})[scenario] = read_json(path)
    return results


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """One row per strategy: each scenario's test accuracy [95 % interval], and the honest
    run's accuracy against FedAvg's honest one."""
    header = ["strategy", *SCENARIOS, "honest run vs FedAvg (points)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    fedavg = results.get("flwr:fedavg", {}).get("honest")
    for strategy, by_scenario in results.items():
        cells = [f"`{strategy}`"]
        for scenario in SCENARIOS:
            summary = by_scenario.get(scenario)
            cells.append(
                "-"
                if summary is None
                else format_measured(summary["test_accuracy"], summary["test_examples"])
            )
        honest = by_scenario.get("honest")
        cost = (
            f"{100 * (honest['test_accuracy'] - fedavg['test_accuracy']):+.2f}"
            if honest and fedavg
            else "-"
        )
        lines.append("| " + " | ".join([*cells, cost]) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs and table")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = [s for s in args.strategies.split(",") if s]
    unknown = sorted(set(chosen) - set(STRATEGIES))
    if unknown:
        parser.error(f"unknown strategies {unknown}; known: {', '.join(STRATEGIES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for strategy in chosen:
        for scenario in SCENARIOS:
            summary = run_one(args.out, strategy, scenario, args.rounds)
            print(f"{strategy} {scenario}: {summary['test_accuracy']:.4f}", flush=True)
    results = kept_results(args.out)
    text = table(results)
    print(text)
    (args.out / "robustness.md").write_text(text + "\n")
    (args.out / "robustness.json").write_text(
        json.dumps(
            {s: {k: v["test_accuracy"] for k, v in r.items()} for s, r in results.items()},
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
