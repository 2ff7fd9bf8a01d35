"""Benchmark: per-round wall time of one workload in simulation and in deployment, side by side.

``--workload quickstart`` is the README's quickstart job (FEAST on the embedded mnist-5k,
``conf/quickstart.toml``), ``--workload digits`` FedAvg on the embedded digits
(``conf/fedavg-digits.toml``); either with 2 clients, both trained every round,
``--rounds`` rounds. One invocation runs it:

- in simulation: ``flwr run .`` with its local SuperLink (Ray; ClientApps live in reused actors);
- in deployment: ``flwr run`` against a real SuperLink and 2 SuperNodes on 127.0.0.1 started by
  the deployment scripts, where every message starts a fresh ``flwr-clientapp`` process, with the
  SuperExec poll docs/deployment.md recommends (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1``).

Every process gets ``OMP_NUM_THREADS=1``: the 2 clients share this machine's cores, and torch's
default of one thread per core per process oversubscribes them (3x slower rounds on 2 cores),
which would measure contention, not the runtime.

Per-round time is the ``seconds`` of each row of metrics.jsonl (send, train, receive, aggregate,
validate). The table gives each mode's rounds and their median; the last line is the median over
rounds of the per-round ratio deployment / simulation. "run" is the wall time of the whole
command, including starting the runtime, the handshake and the final test.

Run: ``python benchmarks/deployment_overhead.py --workload quickstart --rounds 3``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every process
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import processes
from processes import (
    Federation,
    flower_env,
    flwr_run,
    free_port,
    managed_processes,
    preset_with,
    read_rounds,
)

NODES = 2
#: Both modes get this on top of the defaults: one torch thread per process (below) and the
#: SuperExec poll that docs/deployment.md recommends for SuperNodes (the only per-message setting
#: Flower 1.42 offers; 1 s by default).
DEPLOY_ENV = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}
#: workload -> (preset, overrides): both clients train every round (the preset otherwise).
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "quickstart": ("quickstart", {"fraction-train": 1.0}),
    "digits": ("fedavg-digits", {"fraction-train": 1.0}),
}


def workload(name: str, out: Path, run_name: str, rounds: int, root: Path) -> Path:
    """The workload's run config as a TOML file, the same for every mode."""
    preset, overrides = WORKLOADS[name]
    config = overrides | {
        "num-clients": NODES,
        "num-server-rounds": rounds,
        "out-dir": str(out),
        "run-name": run_name,
    }
    return preset_with(root, preset, config)


def simulation(name: str, root: Path, rounds: int) -> Path:
    http_port, control_port = free_port(), free_port()
    env = flower_env(
        root / "flwr-home",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
    )
    with managed_processes(root) as procs:
        procs.adopt(f"--port {http_port}")  # the local SuperLink that flwr run starts
        procs.adopt(f"127.0.0.1:{http_port}")  # and its SuperExec
        config = workload(name, root / "out", "simulation", rounds, root)
        federation = f"num-supernodes={NODES} client-resources-num-cpus=1"
        args = ["--federation-config", federation, "--run-config", str(config)]
        check(flwr_run(args, env, root / "flwr-run.log"), root / "flwr-run.log")
    return root / "out" / "simulation"


def deployment(name: str, root: Path, rounds: int) -> Path:
    """A real SuperLink and 2 SuperNodes on 127.0.0.1, started with the deployment scripts."""
    with managed_processes(root) as procs:
        fed = Federation(procs, root, base_env=DEPLOY_ENV)
        fed.connect()
        fed.start_superlink("--insecure")
        for partition_id in range(NODES):
            fed.start_supernode(f"sn{partition_id}", partition_id, NODES, "--insecure")
        config = workload(name, root / "out", "deploy", rounds, root)
        log = root / "flwr-run.log"
        check(flwr_run(["deploy", "--run-config", str(config)], fed.env, log), log)
    return root / "out" / "deploy"


def check(result: Any, log: Path) -> None:
    if result.returncode != 0 or "test accuracy" not in log.read_text():
        raise RuntimeError(f"run failed; log:\n{log.read_text()[-3000:]}")


MODES: dict[str, Callable[[str, Path, int], Path]] = {
    "simulation (flwr run, Ray)": simulation,
    "deployment (SuperLink + 2 SuperNodes)": deployment,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="quickstart")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    processes.RUN_TIMEOUT = 3600  # a quickstart run on a loaded 2-core machine takes minutes
    # a SIGTERM must still stop the SuperLinks and SuperNodes started so far (finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    per_round: dict[str, list[float]] = {}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="fedapp-overhead-") as tmp:
        for index, (mode, run) in enumerate(MODES.items()):
            root = Path(tmp) / str(index)
            root.mkdir()
            start = time.perf_counter()
            run_dir = run(args.workload, root, args.rounds)
            walls[mode] = time.perf_counter() - start
            per_round[mode] = [row["seconds"] for row in read_rounds(run_dir)]
            rounded = [round(s, 2) for s in per_round[mode]]
            print(f"{mode}: rounds {rounded} s, run {walls[mode]:.1f} s", flush=True)
    sim, dep = per_round.values()
    ratios = [d / s for d, s in zip(dep, sim, strict=True)]
    load = os.getloadavg()
    print(
        f"\n{args.workload} ({WORKLOADS[args.workload][0]} preset), {NODES} clients, "
        f"{args.rounds} rounds; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}\n"
    )
    print("| mode | s/round (median) | rounds (s) | run (s) |")
    print("| --- | ---: | --- | ---: |")
    for mode, seconds in per_round.items():
        rounds = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"| {mode} | {statistics.median(seconds):.2f} | {rounds} | {walls[mode]:.1f} |")
    print(f"\ndeployment/simulation round time: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
