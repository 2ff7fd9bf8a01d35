"""A user error in deployment is as loud as in simulation: on a real SuperLink with a SuperNode,
the reason reaches the ``flwr run --stream`` console and the run ends ``finished:failed``.

Two mistakes on one federation (a SuperNode of a 2-device federation): a run config whose
``num-clients`` does not match the devices (the node rejects the handshake) and a run config
with a value a key does not allow (stopped by the ServerApp before anything is sent).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from processes import FLWR, Federation, flwr_run, managed_processes, preset_with

MISTAKES = {
    "mismatch": (
        {"num-clients": 3},
        "a node rejected the run: the federation has num-partitions = 2 but run config "
        "'num-clients' = 3",
    ),
    "invalid-value": ({"num-clients": 2, "gamma": -1.0}, "'gamma' = -1.0 is not allowed"),
}


def _statuses(env: dict[str, str]) -> list[str]:
    listed = subprocess.run(
        [FLWR, "ls", "deploy", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    return [run["status"] for run in json.loads(listed.stdout)["runs"]]


def test_config_errors_and_node_rejections_reach_the_console_and_fail_the_run(
    tmp_path: Path,
) -> None:
    with managed_processes(tmp_path) as procs:
        fed = Federation(procs, tmp_path)
        fed.connect()
        fed.start_superlink("--insecure")
        fed.start_supernode("sn0", 0, 2, "--insecure")
        for name, (overrides, message) in MISTAKES.items():
            config = preset_with(
                tmp_path,
                "fedavg-digits",
                {"out-dir": str(tmp_path / "out"), "node-wait-timeout": 60.0} | overrides,
                name=name,
            )
            log = tmp_path / f"{name}.log"
            flwr_run(["deploy", "--run-config", str(config)], fed.env, log)
            console = log.read_text()
            assert message in console, console[-4000:]
            assert "ServerApp raised an exception" in console, console[-4000:]
        assert _statuses(fed.env) == ["finished:failed"] * len(MISTAKES)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("summary.json"))
