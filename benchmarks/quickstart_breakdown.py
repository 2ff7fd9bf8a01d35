"""Where the quickstart's wall time goes: `flwr run` of conf/quickstart.toml in simulation.

Runs the real command (local SuperLink, Ray, 20 simulated nodes) with an isolated FLWR_HOME and
free ports, reads the per-phase timings the ServerApp records in summary.json, and prints how
the wall time splits into local training and everything else. Stops every process it started.

    python benchmarks/quickstart_breakdown.py [--rounds N] [--preset conf/quickstart.toml]
"""

from __future__ import annotations

import argparse
import tempfile
import tomllib
from pathlib import Path

from flwr_runs import ROOT, flwr_run_once

PARALLEL_CLIENTS = 2  # client-resources-num-cpus=1 on a 2-core machine


def run(preset: Path, rounds: int | None, workdir: Path) -> tuple[float, dict]:
    """Run the preset once with `flwr run`; return (wall seconds, summary.json)."""
    config = tomllib.loads(preset.read_text())
    if rounds:
        config["num-server-rounds"] = rounds
    federation = f"num-supernodes={config['num-clients']} client-resources-num-cpus=1"
    return flwr_run_once(config, federation, workdir)


def table(wall: float, summary: dict) -> str:
    t = summary["timing"]
    training = t["client_training_seconds_sum"] / PARALLEL_CLIENTS
    messaging = max(t["train_phase_seconds"] - training, 0.0)
    inside = t["rounds_seconds"] + t["final_evaluation_seconds"]
    rows = [
        ("engine start, app install, data loading, handshake", wall - inside),
        (f"local training (sum over clients / {PARALLEL_CLIENTS} in parallel)", training),
        ("messaging, serialisation, scheduling, client model build", messaging),
        ("aggregation", t["aggregate_seconds"]),
        ("validation (BN recalibration per anchor)", t["validation_seconds"]),
        ("final evaluation (every variant)", t["final_evaluation_seconds"]),
    ]
    rest = wall - sum(seconds for _, seconds in rows)
    rows.append(("other (checkpoints, result files)", rest))
    lines = ["| part | seconds | share |", "|---|---:|---:|"]
    lines += [
        f"| {name} | {seconds:.1f} | {100 * seconds / wall:.1f} % |" for name, seconds in rows
    ]
    lines.append(f"| **total wall time of `flwr run`** | **{wall:.1f}** | 100 % |")
    lines.append(
        f"\nrounds: {summary['rounds']}; client training summed over clients: "
        f"{t['client_training_seconds_sum']:.1f} s; population accuracy "
        f"{100 * summary.get('population_accuracy', float('nan')):.2f} %"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", type=Path, default=ROOT / "conf" / "quickstart.toml")
    parser.add_argument("--rounds", type=int, default=None, help="override num-server-rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wall, summary = run(args.preset, args.rounds, Path(tmp))
    print(table(wall, summary))


if __name__ == "__main__":
    main()
