"""Start and always stop the real Flower processes that end-to-end tests need.

Every process is started in its own session so that stopping it by PID also ends the children it
spawned (flower-superexec, flwr-serverapp, flwr-clientapp); a leftover process would hold CI's
output open. Ports are ones the OS reports free on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN_DIR = Path(sys.executable).parent


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


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:3] + " "
    except OSError:
        return False


def stop(pid: int, grace: float = 10.0) -> None:
    """Terminate a process, and its whole group if it leads one; kill it if it does not go."""
    try:
        leads_group = os.getpgid(pid) == pid
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            (os.killpg if leads_group else os.kill)(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def pids_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (e.g. a port only this test uses)."""
    pids = []
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


class Processes:
    """Processes a test started; ``stop_all`` ends every one of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self.patterns: list[str] = []

    def start(self, name: str, args: list[str], env: dict[str, str], cwd: Path) -> Path:
        """Start a command in a new session, output to ``<log_dir>/<name>.log``."""
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                args,
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        return log_path

    def adopt(self, pattern: str) -> None:
        """Also stop, at the end, every process whose command line contains ``pattern``: the
        detached ones that others start for us (the local SuperLink of ``flwr run``, SuperExec)."""
        self.patterns.append(pattern)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            stop(proc.pid)
            proc.wait(timeout=10)
        for pattern in self.patterns:
            for pid in pids_mentioning(pattern):
                stop(pid)


@contextmanager
def managed_processes(log_dir: Path) -> Iterator[Processes]:
    """Processes that are stopped when the block ends, also on failure."""
    procs = Processes(log_dir)
    try:
        yield procs
    finally:
        procs.stop_all()


def wait_for_port(port: int, timeout: float, log: Path) -> None:
    """Wait until something listens on 127.0.0.1:port; fail with the log's tail otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port}; log:\n{log.read_text()[-3000:]}")
