"""The app as users run it: `flwr run .` in Flower's simulation engine, and a real deployment
with a SuperLink and two SuperNodes on 127.0.0.1. Each test stops every process it started,
including the local SuperLink that `flwr run` leaves running, also when it fails."""

from __future__ import annotations

import json
from pathlib import Path

from processes import (
    BIN_DIR,
    SHARED_CORES_ENV,
    flower_env,
    flwr_run,
    free_port,
    managed_processes,
    preset_with,
    wait_for_port,
)


def _read_results(run_dir: Path, rounds: int, log: Path) -> dict:
    assert (run_dir / "summary.json").exists(), log.read_text()[-4000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, rounds + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    return summary


def test_flwr_run_simulation(tmp_path: Path) -> None:
    http_port, control_port = free_port(), free_port()
    env = flower_env(
        tmp_path / "flwr-home",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        # inherited by the Ray actors, which Ray then leaves at 2 threads for 1 CPU
        OMP_NUM_THREADS="2",
    )
    out = tmp_path / "out"
    log = tmp_path / "flwr-run.log"
    with managed_processes(tmp_path) as procs:
        procs.adopt(f"--port {http_port}")  # the local SuperLink that flwr run starts
        procs.adopt(f"127.0.0.1:{http_port}")  # and its SuperExec
        preset = preset_with(
            tmp_path,
            "fedavg-digits",
            {"num-server-rounds": 2, "out-dir": str(out), "run-name": "sim"},
        )
        result = flwr_run(
            [
                "--federation-config",
                "num-supernodes=4 client-resources-num-cpus=1",
                "--run-config",
                str(preset),
            ],
            env,
            log,
        )
        assert result.returncode == 0, log.read_text()[-4000:]
        summary = _read_results(out / "sim", rounds=2, log=log)
    assert summary["nodes"] == 4 and summary["dataset"] == "digits"
    assert "round 2/2 | clients 2/2" in log.read_text()
    # every 1-CPU actor trained with one torch thread whatever OMP_NUM_THREADS said
    rows = [json.loads(x) for x in (out / "sim" / "metrics.jsonl").read_text().splitlines()]
    assert [row["torch-threads"] for row in rows] == [1.0, 1.0]
    # no per-run environment was installed (that would re-download torch, and needs the internet)
    assert not (tmp_path / "flwr-home" / "runtime-envs").exists()


def test_deployment_superlink_and_two_supernodes(tmp_path: Path) -> None:
    link_port = free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "deploy"\n\n'
        f'[superlink.deploy]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
    )
    env = flower_env(home, **SHARED_CORES_ENV)
    out = tmp_path / "out"
    with managed_processes(tmp_path) as procs:
        link_log = procs.start(
            "superlink",
            [
                str(BIN_DIR / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--disable-runtime-dependency-installation",
            ],
            env,
            tmp_path,
        )
        wait_for_port(link_port, 30, link_log)
        for partition_id, budget in ((0, 5e7), (1, 4e8)):
            procs.start(
                f"supernode-{partition_id}",
                [
                    str(BIN_DIR / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"partition-id={partition_id} num-partitions=2 budget={budget:.0f}",
                ],
                flower_env(tmp_path / f"sn{partition_id}", **SHARED_CORES_ENV),
                tmp_path,
            )
        log = tmp_path / "flwr-run.log"
        preset = preset_with(
            tmp_path,
            "fedavg-digits",
            {"num-clients": 2, "num-server-rounds": 2, "out-dir": str(out), "run-name": "deploy"},
        )
        result = flwr_run(["deploy", "--run-config", str(preset)], env, log)
        assert result.returncode == 0, log.read_text()[-4000:]
        summary = _read_results(out / "deploy", rounds=2, log=log)
    assert summary["nodes"] == 2
    assert "round 2/2 | clients 2/2" in log.read_text()
