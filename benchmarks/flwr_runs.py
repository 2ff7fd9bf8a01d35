"""Run the app once with the real `flwr run` (local SuperLink, Ray) for a benchmark.

Isolated FLWR_HOME and free ports; the local SuperLink it starts is stopped when the run ends,
also on failure or interruption (fedapp.tools.launcher).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fedapp.tools.launcher import APP_DIR, run_app, write_run_config

#: The app's root (conf/ presets live here): the checkout whose fedapp is imported.
ROOT = APP_DIR


def flwr_run_once(
    config: dict[str, Any], federation: str, workdir: Path, **env_extra: str
) -> tuple[float, dict[str, Any]]:
    """`flwr run .` with this run config (kebab-case keys) and ``--federation-config``;
    returns (wall seconds, the run's summary.json). Results go to ``workdir/out/bench``."""
    config = config | {"out-dir": str(workdir / "out"), "run-name": "bench"}
    run_config = write_run_config(workdir / "run-config.toml", config)
    start = time.perf_counter()
    result = run_app(run_config, federation, workdir, timeout=3600, **env_extra)
    wall = time.perf_counter() - start
    summary_path = workdir / "out" / "bench" / "summary.json"
    if result.returncode != 0 or not summary_path.exists():
        log = (workdir / "flwr-run.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the run failed or wrote no summary; its log ends:\n{log}")
    return wall, json.loads(summary_path.read_text())
