"""Start and always stop the real Flower processes that end-to-end tests need.

Every process is started in its own session so that stopping it by PID also ends the children it
spawned (flower-superexec, flwr-serverapp, flwr-clientapp); a leftover process would hold CI's
output open. Ports are ones the OS reports free on 127.0.0.1. SuperLinks and SuperNodes are
started through the deployment guide's own scripts (``scripts/deploy``), so the tests also check
what a person following docs/deployment.md runs.

``FEDAPP_DEVICE_VENV=<venv>`` runs the SuperNodes (and the ClientApps they start) from that
virtual environment instead of this one: one made with the base install (``pip install fedapp``)
checks that a device with its own data (``--data-path``,
tests/system/test_deployment_own_data.py) needs nothing more; nodes that cut a seeded shard need
``pip install "fedapp[data]"`` there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from flwr.common.config import flatten_dict

from fedapp.tools.launcher import APP_DIR as REPO_DIR
from fedapp.tools.launcher import (
    BIN_DIR,  # noqa: F401  (re-exported: the tests find the venv's tools through it)
    FLWR,
    flower_env,
    free_port,
    pids_mentioning,
    stop,
    write_run_config,
)

DEPLOY_SCRIPTS = REPO_DIR / "scripts" / "deploy"
#: Several SuperNodes share this machine's cores: one torch thread per process avoids
#: oversubscription (two 2-thread ClientApps on 2 cores trained 40x slower than 1-thread ones),
#: and a short SuperExec poll starts each ClientApp sooner. Both are in docs/deployment.md.
SHARED_CORES_ENV = {"OMP_NUM_THREADS": "1", "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1"}
RUN_TIMEOUT = 420
#: The virtual environment SuperNodes run from; empty: the tests' own.
DEVICE_VENV = os.environ.get("FEDAPP_DEVICE_VENV", "")


def device_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the device venv's tools (flower-supernode, its ClientApp's Python) first."""
    if not DEVICE_VENV:
        return dict(env)
    tools = Path(DEVICE_VENV).expanduser().resolve() / "bin"
    if not (tools / "flower-supernode").is_file():
        raise FileNotFoundError(f"FEDAPP_DEVICE_VENV={DEVICE_VENV}: no {tools}/flower-supernode")
    return dict(env, PATH=f"{tools}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(tools.parent))


class Processes:
    """Processes a test started; ``stop_all`` ends every one of them."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []
        self.by_name: dict[str, subprocess.Popen] = {}
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
        self.by_name[name] = proc
        return log_path

    def kill(self, name: str) -> None:
        """SIGKILL a started process and everything in its session, as a power cut would."""
        proc = self.by_name[name]
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def wait_exit(self, name: str, timeout: float) -> int:
        """The exit status of a started process that is expected to end by itself."""
        return self.by_name[name].wait(timeout=timeout)

    def adopt(self, pattern: str) -> None:
        """Also stop, at the end, every process whose command line contains ``pattern``: the
        detached ones that others start for us (the local SuperLink of ``flwr run``, SuperExec)."""
        self.patterns.append(pattern)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            stop(proc.pid, group=True)  # started in its own session: pid = its group id
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


def preset_with(directory: Path, preset: str, overrides: Mapping[str, Any], name: str = "") -> Path:
    """A preset with some keys changed, as ``<directory>/<name or preset>.toml``: flwr run takes
    a TOML file or key=value pairs, not both."""
    preset_values = tomllib.loads((REPO_DIR / "conf" / f"{preset}.toml").read_text())
    config = flatten_dict(preset_values) | dict(overrides)
    return write_run_config(directory / f"{name or preset}.toml", config)


def flwr_run_command(args: list[str]) -> list[str]:
    """``flwr run .`` of this app with streamed logs."""
    return [FLWR, "run", ".", *args, "--stream"]


def flwr_run(args: list[str], env: dict[str, str], log: Path) -> subprocess.CompletedProcess:
    """Run ``flwr run .`` to completion, output to ``log``."""
    with log.open("w") as out:
        return subprocess.run(
            flwr_run_command(args),
            cwd=REPO_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=RUN_TIMEOUT,
            check=False,
        )


def script(name: str, *args: str, env: dict[str, str], cwd: Path) -> str:
    """Run one of the deployment scripts to completion; its output, or an error showing it."""
    result = subprocess.run(
        [str(DEPLOY_SCRIPTS / name), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


class Federation:
    """A SuperLink and its SuperNodes on 127.0.0.1, started with the deployment scripts.

    ``env`` is the environment of the person who runs ``flwr`` (its own FLWR_HOME with a
    connection named ``deploy``); each server and device process gets its own FLWR_HOME too.
    """

    def __init__(
        self,
        procs: Processes,
        root: Path,
        base_env: Mapping[str, str] = SHARED_CORES_ENV,
        **extra_env: str,
    ) -> None:
        self.procs = procs
        self.root = root
        self.port = free_port()
        self.extra_env = dict(base_env) | extra_env
        self.env = flower_env(root / "flwr-home", **extra_env)

    def process_env(self, name: str) -> dict[str, str]:
        return flower_env(self.root / f"{name}-home", **self.extra_env)

    def connect(self, security: str = "--insecure") -> None:
        """Add the ``deploy`` connection (``security``: a CA certificate or ``--insecure``)."""
        script(
            "add-connection.sh",
            "deploy",
            f"127.0.0.1:{self.port}",
            security,
            env=self.env,
            cwd=self.root,
        )

    def start_superlink(self, *flags: str, name: str = "superlink") -> Path:
        """start-superlink.sh on this federation's port; returns its log once it listens."""
        log = self.procs.start(
            name,
            [
                str(DEPLOY_SCRIPTS / "start-superlink.sh"),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *flags,
            ],
            self.process_env("superlink"),
            self.root,
        )
        wait_for_port(self.port, 30, log)
        return log

    def start_supernode(
        self, name: str, partition_id: int, num_partitions: int, *flags: str
    ) -> Path:
        """start-supernode.sh for one device; returns its log."""
        return self.procs.start(
            name,
            [
                str(DEPLOY_SCRIPTS / "start-supernode.sh"),
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--partition-id",
                str(partition_id),
                "--num-partitions",
                str(num_partitions),
                "--port",
                str(free_port()),
                *flags,
            ],
            device_env(self.process_env(name)),
            self.root,
        )


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wait_for_file(path: Path, timeout: float, log: Path) -> None:
    """Wait until ``path`` exists; fail with the log's tail otherwise."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear; log:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
