"""Start `flwr run` of this app and stop every process it leaves behind.

`flwr run` starts a local SuperLink (and its SuperExec) that keeps running after the run ends; a
tool that runs the app (``fedapp compare``, the tests, the benchmarks) stops them by PID, found by
the free ports it gave them. Processes are looked up in /proc (Linux); elsewhere nothing is found
and the SuperLink is left running, with a warning.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w
from flwr.common.config import flatten_dict, unflatten_dict

from fedapp.run.config import APP_DIR

BIN_DIR = Path(sys.executable).parent
FLWR = str(BIN_DIR / "flwr")
#: How often a run is checked for its end, its deadline and its watcher.
WATCH_SECONDS = 2.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_env(flwr_home: Path, **extra: str) -> dict[str, str]:
    """Environment for Flower commands: this venv's tools first, an isolated FLWR_HOME."""
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}",
        FLWR_HOME=str(flwr_home),
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        FLWR_DISABLE_UPDATE_CHECK="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def _group_alive(pgid: int) -> bool:
    """Some process of the group is running (the leader may be gone while children live on)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = _stat(int(proc.name))
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def stop(pid: int, grace: float = 10.0, group: bool | None = None) -> None:
    """Terminate a process, and its whole group if it leads one (``group``: known to lead one,
    even if the leader itself has exited); kill what does not go."""
    if group is None:
        try:
            group = os.getpgid(pid) == pid
        except ProcessLookupError:
            return
    running = _group_alive if group else _alive
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not running(pid):
            return
        try:
            (os.killpg if group else os.kill)(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not running(pid):
                return
            time.sleep(0.1)


def pids_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (e.g. a port only this run uses)."""
    pids = []
    if not Path("/proc").is_dir():
        print(f"fedapp: no /proc here; processes started for '{text}' are left running")
        return pids
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(proc.name))
    return pids


def write_run_config(path: Path, config: Mapping[str, Any]) -> Path:
    """A run config as a TOML file for ``flwr run --run-config``: kebab-case keys, a method's
    settings as a dict (``{"fedkd-nas": {"teacher-epochs": 20}}``) or dotted keys
    (``"fedkd-nas.teacher-epochs"``), both written as the method's table. Flower reads the file
    back with tomli and flattens it (flwr.common.config.parse_config_args), so values must be
    what a run config holds: bool, int, float or str."""
    flat = flatten_dict(dict(config))  # Flower's own check of the value types
    for key in flat:
        parent = key.rpartition(".")[0]
        while parent:
            if parent in flat:
                raise ValueError(f"run config: {parent!r} is both a value and a section")
            parent = parent.rpartition(".")[0]
    path.write_text(tomli_w.dumps(unflatten_dict(flat)))
    return path


def run_app(
    run_config: Path,
    federation_config: str,
    workdir: Path,
    timeout: float,
    watch: Callable[[], None] | None = None,
    **env_extra: str,
) -> subprocess.CompletedProcess:
    """``flwr run`` of this app in simulation (own FLWR_HOME and free ports under ``workdir``),
    output to ``workdir/flwr-run.log``; ``watch`` is called every few seconds while it runs; the
    local SuperLink it starts is stopped afterwards. Past ``timeout`` seconds the run is killed
    and :class:`subprocess.TimeoutExpired` raised."""
    http_port, control_port = free_port(), free_port()
    env = flower_env(
        workdir / "flwr-home",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
        FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
        **env_extra,
    )
    command = [FLWR, "run", str(APP_DIR), "--stream", "--run-config", str(run_config)]
    command += ["--federation-config", federation_config]
    deadline = time.monotonic() + timeout
    try:
        with (workdir / "flwr-run.log").open("w") as log:
            process = subprocess.Popen(
                command,
                cwd=APP_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            with process:
                while process.poll() is None:
                    if time.monotonic() > deadline:
                        process.kill()
                        raise subprocess.TimeoutExpired(command, timeout)
                    if watch is not None:
                        watch()
                    time.sleep(WATCH_SECONDS)
            return subprocess.CompletedProcess(command, process.returncode)
    finally:
        for pattern in (f"--port {http_port}", f"127.0.0.1:{http_port}"):
            for pid in pids_mentioning(pattern):
                stop(pid)
