"""Run the app once with the real `flwr run` (local SuperLink, Ray) for a benchmark.

Isolated FLWR_HOME and free ports; every process it starts is stopped when the run ends, also on
failure or interruption.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from processes import (  # noqa: E402
    BIN_DIR,
    flower_env,
    free_port,
    managed_processes,
    write_run_config,
)


def flwr_run_once(
    config: dict[str, Any], federation: str, workdir: Path, **env_extra: str
) -> tuple[float, dict[str, Any]]:
    """`flwr run .` with this run config (kebab-case keys) and ``--federation-config``;
    returns (wall seconds, the run's summary.json). Results go to ``workdir/out/bench``."""
    config = config | {"out-dir": str(workdir / "out"), "run-name": "bench"}
    run_config = write_run_config(workdir / "run-config.toml", config)
    http_port, control_port = free_port(), free_port()
    env = flower_env(
        workdir / "flwr-home",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        **env_extra,
    )
    command = [
        str(BIN_DIR / "flwr"),
        "run",
        ".",
        "--stream",
        "--run-config",
        str(run_config),
        "--federation-config",
        federation,
    ]
    with managed_processes(workdir) as procs:
        procs.adopt(f"--port {http_port}")  # the local SuperLink
        procs.adopt(f"127.0.0.1:{http_port}")  # its SuperExec
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
    summary_path = workdir / "out" / "bench" / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(f"the run wrote no summary; log: {workdir / 'flwr-run.log'}")
    return wall, json.loads(summary_path.read_text())
