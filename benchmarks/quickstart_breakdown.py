"""Where the quickstart's wall time goes: `flwr run` of conf/quickstart.toml in simulation.

Runs the real command (local SuperLink, Ray, 20 simulated nodes, one 1-CPU actor per core, as
the README's main command) with an isolated FLWR_HOME and free ports, reads the per-phase and
per-round timings the ServerApp records (summary.json, metrics.jsonl), and prints how the wall
time splits into local training and everything else. Stops every process it started.

Local training counts what a round cannot be shorter than with P parallel actors: the larger of
its longest client's training and the clients' training summed over P. Only what lies above that
(messages, serialisation, Ray scheduling, model builds, an actor idling while work waits) is
messaging; the line `non-training share` is everything but local training.

    python benchmarks/quickstart_breakdown.py [--rounds N] [--keep DIR] [--compare-model DIR]
    python benchmarks/quickstart_breakdown.py --smoke   # 1 round of 2 clients: checks the script
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import torch
from flwr_runs import ROOT, flwr_run_once

#: One 1-CPU Ray actor per core (client-resources-num-cpus=1): clients training at once.
PARALLEL = os.cpu_count() or 1


#: --smoke: the preset on 2 clients, both trained, for 1 round of 1 local epoch.
SMOKE = {"num-clients": 2, "fraction-train": 1.0, "num-server-rounds": 1, "local-epochs": 1}


def run(
    preset: Path, rounds: int | None, workdir: Path, smoke: bool = False
) -> tuple[float, dict[str, Any]]:
    """Run the preset once with `flwr run`; return (wall seconds, summary.json)."""
    config = tomllib.loads(preset.read_text()) | (SMOKE if smoke else {})
    if rounds:
        config["num-server-rounds"] = rounds
    federation = f"num-supernodes={config['num-clients']} client-resources-num-cpus=1"
    return flwr_run_once(config, federation, workdir)


def machine() -> str:
    """CPU model, cores, torch's CPU kernels and the load right now."""
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    load = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return (
        f"{model}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()} kernels); uptime: {load}"
    )


def training_seconds(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(sum over rounds of clients' training / PARALLEL, the same with each round at least as
    long as its longest client)."""
    spread = sum(r["seconds-client-training-sum"] / PARALLEL for r in rows)
    critical = sum(
        max(r["seconds-client-training-max"], r["seconds-client-training-sum"] / PARALLEL)
        for r in rows
    )
    return spread, critical


def table(wall: float, summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    t = summary["timing"]
    spread, critical = training_seconds(rows)
    messaging = max(t["train_phase_seconds"] - critical, 0.0)
    inside = t["rounds_seconds"] + t["final_evaluation_seconds"]
    parts = [
        ("engine start, app install, data loading, handshake", wall - inside),
        (f"local training, clients summed / {PARALLEL} actors", spread),
        ("local training, the round's longest client beyond that", critical - spread),
        ("messaging, serialisation, scheduling, client model build", messaging),
        ("aggregation", t["aggregate_seconds"]),
        ("validation (BN recalibration per anchor)", t["validation_seconds"]),
        ("final evaluation (every variant)", t["final_evaluation_seconds"]),
    ]
    rest = wall - sum(seconds for _, seconds in parts)
    parts.append(("other (checkpoints, result files)", rest))
    lines = ["| part | seconds | share |", "|---|---:|---:|"]
    lines += [
        f"| {name} | {seconds:.1f} | {100 * seconds / wall:.1f} % |" for name, seconds in parts
    ]
    lines.append(f"| **total wall time of `flwr run`** | **{wall:.1f}** | 100 % |")
    lines.append(
        f"\nrounds: {summary['rounds']}; client training summed over clients: "
        f"{t['client_training_seconds_sum']:.1f} s; population accuracy "
        f"{100 * summary.get('population_accuracy', float('nan')):.2f} %"
    )
    lines.append(
        f"(counting only the clients' training summed / {PARALLEL} as training: non-training "
        f"{100 * (wall - spread) / wall:.1f} %)"
    )
    lines.append(f"non-training share: {100 * (wall - critical) / wall:.1f} %")
    return "\n".join(lines)


def compare_models(run_dir: Path, other: Path) -> str:
    """Whether two runs' final models are bit for bit equal (every tensor)."""
    mine = torch.load(run_dir / "model_final.pt", weights_only=True)
    theirs = torch.load(other / "model_final.pt", weights_only=True)
    if mine.keys() != theirs.keys():
        return f"final model: tensor names differ from {other}"
    differing = [name for name in mine if not torch.equal(mine[name], theirs[name])]
    if not differing:
        return f"final model: all {len(mine)} tensors bit for bit equal to {other}"
    return f"final model: {len(differing)} of {len(mine)} tensors differ from {other}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", type=Path, default=ROOT / "conf" / "quickstart.toml")
    parser.add_argument("--rounds", type=int, default=None, help="override num-server-rounds")
    parser.add_argument("--keep", type=Path, default=None, help="copy the run's files here")
    parser.add_argument(
        "--compare-model", type=Path, default=None, help="a kept run to compare model_final.pt to"
    )
    parser.add_argument("--smoke", action="store_true", help="1 round of 2 clients")
    args = parser.parse_args()
    print(f"before: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        wall, summary = run(args.preset, args.rounds, Path(tmp), args.smoke)
        run_dir = Path(tmp) / "out" / "bench"
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if args.keep:
            shutil.copytree(run_dir, args.keep, dirs_exist_ok=True)
        comparison = compare_models(run_dir, args.compare_model) if args.compare_model else ""
    print(f"after: {machine()}")
    if comparison:
        print(comparison)
    print(table(wall, summary, rows))


if __name__ == "__main__":
    main()
