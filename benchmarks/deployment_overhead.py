"""Benchmark: per-round wall time of one workload in-process, in simulation and in deployment.

The same run (FedAvg on the embedded digits, 2 clients, both trained every round, the preset
``conf/fedavg-digits.toml`` otherwise) is executed side by side in one invocation:

- in-process: the real ServerApp and ClientApp over ``tests/local_grid.py`` (no Flower runtime);
- simulation: ``flwr run .`` with its local SuperLink (Ray; ClientApps live in reused actors);
- deployment: ``flwr run`` against a real SuperLink and 2 SuperNodes on 127.0.0.1, where every
  message starts a fresh ``flwr-clientapp`` process that imports torch and fedapp; once with
  Flower's defaults and once with ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.1`` (how soon SuperExec
  starts the ClientApp of a message; the one per-message cost Flower 1.42 lets you tune, see
  docs/deployment.md, "Overhead").

Every process gets ``OMP_NUM_THREADS=1``: the 2 clients share this machine's cores, and torch's
default of one thread per core per process oversubscribes them (3x slower rounds on 2 cores, and
far worse when other work loads the machine), which would measure contention, not the runtime.

Per-round time is the ``seconds`` of each row of metrics.jsonl (send, train, receive, aggregate,
validate); the table gives the median over rounds and the ratio to in-process. "run" is the
wall time of the whole command, including starting the runtime, the handshake and the test.

Run: ``python benchmarks/deployment_overhead.py [--rounds 3]`` (about 3 minutes on 2 idle cores).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; inherited by every process
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from local_grid import LocalGrid, run_config, server_context
from processes import (
    Federation,
    flower_env,
    flwr_run,
    free_port,
    managed_processes,
    preset_with,
    read_rounds,
)

from fedapp.client_app import app as client_app
from fedapp.config import parse_run_config
from fedapp.server_app import run_experiment

NODES = 2
TUNED_POLL = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}


def workload(out: Path, name: str, rounds: int) -> dict[str, Any]:
    """Run-config overrides of the preset, the same for every mode."""
    return {
        "num-clients": NODES,
        "num-server-rounds": rounds,
        "out-dir": str(out),
        "run-name": name,
    }


def in_process(root: Path, rounds: int) -> Path:
    overrides = workload(root / "out", "in-process", rounds)
    config = run_config(**{k.replace("-", "_"): v for k, v in preset(root, overrides).items()})
    server_context(config)
    run_experiment(LocalGrid(client_app, config, num_nodes=NODES), parse_run_config(config))
    return root / "out" / "in-process"


def preset(root: Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The preset with the overrides, as a dict (what the flwr run modes read from a file)."""
    import tomllib

    return tomllib.loads(preset_with(root, "fedavg-digits", overrides).read_text())


def simulation(root: Path, rounds: int) -> Path:
    http_port, control_port = free_port(), free_port()
    env = flower_env(
        root / "flwr-home",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
    )
    with managed_processes(root) as procs:
        procs.adopt(f"--port {http_port}")  # the local SuperLink that flwr run starts
        procs.adopt(f"127.0.0.1:{http_port}")  # and its SuperExec
        config = preset_with(root, "fedavg-digits", workload(root / "out", "simulation", rounds))
        federation = f"num-supernodes={NODES} client-resources-num-cpus=1"
        args = ["--federation-config", federation, "--run-config", str(config)]
        check(flwr_run(args, env, root / "flwr-run.log"), root / "flwr-run.log")
    return root / "out" / "simulation"


def deployment(env: Mapping[str, str]) -> Callable[[Path, int], Path]:
    """A deployment run whose SuperLink and SuperNodes get ``env`` on top of the defaults."""

    def run(root: Path, rounds: int) -> Path:
        with managed_processes(root) as procs:
            fed = Federation(procs, root, base_env=env)
            fed.connect()
            fed.start_superlink("--insecure")
            for partition_id in range(NODES):
                fed.start_supernode(f"sn{partition_id}", partition_id, NODES, "--insecure")
            config = preset_with(root, "fedavg-digits", workload(root / "out", "deploy", rounds))
            log = root / "flwr-run.log"
            check(flwr_run(["deploy", "--run-config", str(config)], fed.env, log), log)
        return root / "out" / "deploy"

    return run


def check(result: Any, log: Path) -> None:
    if result.returncode != 0 or "test accuracy" not in log.read_text():
        raise RuntimeError(f"run failed; log:\n{log.read_text()[-3000:]}")


MODES: dict[str, Callable[[Path, int], Path]] = {
    "in-process (LocalGrid)": in_process,
    "simulation (flwr run, Ray)": simulation,
    "deployment, Flower defaults": deployment({}),
    "deployment, SuperExec poll 0.1 s": deployment(TUNED_POLL),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # a SIGTERM must still stop the SuperLinks and SuperNodes started so far (finally blocks)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = []
    with tempfile.TemporaryDirectory(prefix="fedapp-overhead-") as tmp:
        for index, (mode, run) in enumerate(MODES.items()):
            root = Path(tmp) / str(index)
            root.mkdir()
            start = time.perf_counter()
            run_dir = run(root, args.rounds)
            wall = time.perf_counter() - start
            seconds = [row["seconds"] for row in read_rounds(run_dir)]
            results.append((mode, statistics.median(seconds), wall))
            rounded = [round(s, 1) for s in seconds]
            print(f"{mode}: rounds {rounded} s, run {wall:.1f} s", flush=True)
    base = results[0][1]
    print(f"\nFedAvg, digits, {NODES} clients, {args.rounds} rounds; median over rounds\n")
    print("| mode | s/round | x in-process | run (s) |")
    print("| --- | ---: | ---: | ---: |")
    for mode, per_round, wall in results:
        print(f"| {mode} | {per_round:.2f} | {per_round / base:.1f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
