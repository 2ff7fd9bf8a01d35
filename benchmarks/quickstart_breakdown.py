"""Where the quickstart's wall time goes: `flwr run` of conf/quickstart.toml in simulation.

Runs the real command (local SuperLink, Ray, 20 simulated nodes) with an isolated FLWR_HOME and
free ports, reads the per-phase timings the ServerApp records in summary.json, and prints how
the wall time splits into local training and everything else. Stops every process it started.

    python benchmarks/quickstart_breakdown.py [--rounds N] [--preset conf/quickstart.toml]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from processes import BIN_DIR, flower_env, free_port, managed_processes  # noqa: E402

PARALLEL_CLIENTS = 2  # client-resources-num-cpus=1 on a 2-core machine


def run(preset: Path, rounds: int | None, workdir: Path) -> tuple[float, dict]:
    """Run the preset once with `flwr run`; return (wall seconds, summary.json)."""
    config = tomllib.loads(preset.read_text())
    num_clients = int(config["num-clients"])
    config |= {"out-dir": str(workdir / "out"), "run-name": "bench"}
    if rounds:
        config["num-server-rounds"] = rounds
    run_config = workdir / "run-config.toml"
    run_config.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    http_port, control_port = free_port(), free_port()
    env = flower_env(
        workdir / "flwr-home",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
    )
    command = [
        str(BIN_DIR / "flwr"),
        "run",
        ".",
        "--stream",
        "--run-config",
        str(run_config),
        "--federation-config",
        f"num-supernodes={num_clients} client-resources-num-cpus=1",
    ]
    with managed_processes(workdir) as procs:
        procs.adopt(f"--port {http_port}")
        procs.adopt(f"127.0.0.1:{http_port}")
        start = time.perf_counter()
        with (workdir / "flwr-run.log").open("w") as log:
            subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=3600,
            )
        wall = time.perf_counter() - start
    return wall, json.loads((workdir / "out" / "bench" / "summary.json").read_text())


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
