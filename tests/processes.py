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


def stop(pid: int, grace: float = 10.0) -> None:
    """Terminate a process group (then kill it if it does not go)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def pids_listening(port: int) -> list[int]:
    """PIDs of processes with a listening TCP socket on ``port`` (read from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":
                inodes.add(parts[9])
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        if any(f"socket:[{inode}]" in links for inode in inodes):
            pids.append(int(proc.name))
    return pids


class Processes:
    """Processes a test started; ``stop_all`` ends every one of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.pids: list[int] = []

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
        self.pids.append(proc.pid)
        return log_path

    def adopt(self, pid: int) -> None:
        """Take responsibility for stopping a process someone else started (e.g. by flwr run)."""
        if pid not in self.pids:
            self.pids.append(pid)

    def stop_all(self) -> None:
        for pid in reversed(self.pids):
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
