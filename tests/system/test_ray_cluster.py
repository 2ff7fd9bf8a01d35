"""The simulation on a multi-node Ray cluster: two Ray nodes on 127.0.0.1 (two raylets, started
with `ray start --head` and `ray start --address` as the README's "Running on a Ray cluster"
says), then the real `flwr run .` of the quickstart, shrunk, attached to them with RAY_ADDRESS.
ClientApps must have run on both nodes and the run must write its results; every process
started here (both Ray nodes, the local SuperLink and its SuperExec) is stopped by PID."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from processes import flower_env, flwr_run_command, free_port, managed_processes, preset_with
from ray_cluster import LocalRayCluster

from fedapp.tools.launcher import APP_DIR

#: The quickstart (FEAST, Zipf budgets, budget-aware split, co-training rule) on scikit-learn's
#: 8x8 digits with 4 clients, all of them every round, so both nodes' actors get work.
SHRUNK_QUICKSTART = {
    "dataset": "digits",
    "feast-space.variant-cache": "feast-small-digits",
    "budget-min": 2e5,
    "budget-max": 6e6,
    "allocation-cap": 4.2e6,
    "num-clients": 4,
    "fraction-train": 1.0,
    "num-server-rounds": 2,
    "eval-every": 2,
    "local-epochs": 1,
    "batch-size": 16,
    "calibration-size": 50,
    "validation-size": 200,
    "test-size": 300,
}


def test_quickstart_runs_across_two_ray_nodes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    http_port, control_port = free_port(), free_port()
    with managed_processes(tmp_path) as procs, LocalRayCluster(tmp_path, nodes=2) as cluster:
        procs.adopt(f"--port {http_port}")  # the local SuperLink that flwr run starts
        procs.adopt(f"127.0.0.1:{http_port}")  # and its SuperExec
        env = flower_env(
            tmp_path / "flwr-home",
            FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
            FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
            RAY_ADDRESS=cluster.address,
        )
        preset = preset_with(
            tmp_path,
            "quickstart",
            SHRUNK_QUICKSTART | {"out-dir": str(out), "run-name": "cluster"},
        )
        command = flwr_run_command(
            [
                "--run-config",
                str(preset),
                "--federation-config",
                "num-supernodes=4 client-resources-num-cpus=1",
            ]
        )
        log = tmp_path / "flwr-run.log"
        cluster.watch()
        with log.open("w") as output:
            result = subprocess.run(
                command,
                cwd=APP_DIR,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=300,
                check=False,
            )
        per_node = cluster.actor_cpu_seconds()
        text = log.read_text()
    assert result.returncode == 0, text[-4000:]
    summary_path = out / "cluster" / "summary.json"
    assert summary_path.exists(), text[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["rounds"] == 2 and summary["nodes"] == 4
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    assert len(summary["variants"]) == 9  # every operating point of the digits cache tested
    assert "round 2/2 | clients 4/4" in text
    # one 1-CPU actor per 1-CPU node: ClientApps trained on the head and on the other node
    assert sorted(per_node) == [0, 1]
    assert all(seconds > 0.5 for seconds in per_node.values()), per_node
