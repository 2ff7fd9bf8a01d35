"""A local multi-node Ray cluster on 127.0.0.1, for the tests and benchmarks that run the
simulation across several Ray nodes the way a user's cluster does (``ray start --head`` on one
machine, ``ray start --address`` on the others, then ``flwr run`` with ``RAY_ADDRESS``).

Each node is one ``ray start --block`` process started in its own session: its raylet, object
store, agents and the workers it spawns share its process group, so stopping that group by the
node's PID ends all of them, and sampling /proc shows on which node a Ray actor runs. Every port
is one the OS reports free, and the cluster's temp dir is its own: ``ray start --head`` records
the cluster address there instead of in /tmp/ray, so no other ``ray.init()`` on this machine
(another run's simulation) attaches to this cluster by accident. Linux only (/proc).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedapp.tools.launcher import BIN_DIR, flower_env, free_port, stop

RAY = str(BIN_DIR / "ray")
#: Object store per node: small, the nodes share this machine's memory and /dev/shm.
OBJECT_STORE_BYTES = 200 * 2**20
#: Ray's process title of a Flower ClientApp actor (``ray::<class name>``).
CLIENT_ACTOR_TITLE = "ray::ClientAppActor"
#: Seconds a node's processes get to exit on SIGTERM before SIGKILL (they keep no state).
STOP_GRACE = 3.0
#: What ``ray start`` prints once its node runs.
STARTED = "Ray runtime started"


@dataclass
class RayNode:
    """One started node: its ``ray start --block`` process (= its process group) and log."""

    index: int
    proc: subprocess.Popen
    log: Path


def _node_ports() -> list[str]:
    """Every port a node opens, chosen free, so several nodes fit on one machine."""
    flags = (
        "--node-manager-port",
        "--object-manager-port",
        "--metrics-export-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
    )
    return [arg for flag in flags for arg in (flag, str(free_port()))]


@dataclass
class LocalRayCluster:
    """``nodes`` Ray nodes with ``cpus`` CPUs and ``gpus`` GPUs each; use as a context manager
    (started on entry, every process stopped on exit, also on failure)."""

    root: Path
    nodes: int = 2
    cpus: int = 1
    gpus: int = 0
    started: list[RayNode] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    #: pid of each ClientApp actor seen -> (node index, CPU seconds at its last sample)
    actors: dict[int, tuple[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Short on purpose: Ray's Unix socket paths live below it (limit ~107 characters).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def address(self) -> str:
        """What ``ray start --address`` and ``RAY_ADDRESS`` take."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRayCluster:
        try:
            self._start_node(["--head", "--port", str(self.port), "--include-dashboard", "false"])
            for _ in range(1, self.nodes):
                self._start_node(["--address", self.address])
            self.wait_for_nodes(timeout=120)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_node(self, role: list[str]) -> None:
        index = len(self.started)
        log = self.root / f"ray-node-{index}.log"
        command = [RAY, "start", "--block", *role, "--node-ip-address", "127.0.0.1"]
        command += ["--num-cpus", str(self.cpus), "--num-gpus", str(self.gpus)]
        command += ["--temp-dir", str(self.temp_dir), "--disable-usage-stats"]
        command += ["--object-store-memory", str(OBJECT_STORE_BYTES), *_node_ports()]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                env=flower_env(self.root / "ray-home"),
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started.append(RayNode(index, proc, log))

    def wait_for_nodes(self, timeout: float) -> None:
        """Wait until every node has started, then until ``ray status`` lists them all active."""
        deadline = time.monotonic() + timeout
        status = ""
        while time.monotonic() < deadline:
            for node in self.started:
                if node.proc.poll() is not None:
                    raise RuntimeError(
                        f"Ray node {node.index} exited; log:\n{node.log.read_text()[-3000:]}"
                    )
            if not all(STARTED in node.log.read_text() for node in self.started):
                time.sleep(0.5)
                continue
            result = subprocess.run(
                [RAY, "status", "--address", self.address],
                capture_output=True,
                text=True,
                env=flower_env(self.root / "ray-home"),
                timeout=60,
                check=False,
            )
            status = result.stdout
            if result.returncode == 0 and _active_nodes(status) >= self.nodes:
                return
            time.sleep(1.0)
        raise TimeoutError(f"{self.nodes} Ray nodes did not join in {timeout:g} s:\n{status}")

    # ---- which node ran what --------------------------------------------------------------------
    def watch(self, interval: float = 0.25) -> None:
        """Start sampling /proc for ClientApp actors: their node and CPU seconds so far."""
        self._watcher = threading.Thread(target=self._sample, args=(interval,), daemon=True)
        self._watcher.start()

    def _sample(self, interval: float) -> None:
        groups = {node.proc.pid: node.index for node in self.started}
        while not self._watching.wait(interval):
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit():
                    continue
                try:
                    title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode()
                    fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if not title.startswith(CLIENT_ACTOR_TITLE) or int(fields[2]) not in groups:
                    continue
                ticks = int(fields[11]) + int(fields[12])  # utime + stime
                seconds = ticks / os.sysconf("SC_CLK_TCK")
                self.actors[int(proc.name)] = (groups[int(fields[2])], seconds)

    def actor_cpu_seconds(self) -> dict[int, float]:
        """Node index -> CPU seconds its ClientApp actors used (as last sampled)."""
        self._watching.set()
        if self._watcher is not None:
            self._watcher.join()
        per_node = {node.index: 0.0 for node in self.started}
        for node_index, seconds in self.actors.values():
            per_node[node_index] += seconds
        return per_node

    def stop(self) -> None:
        """Stop every node by its PID (its whole process group) and remove the temp dir."""
        self._watching.set()
        for node in reversed(self.started):
            stop(node.proc.pid, grace=STOP_GRACE, group=True)
            node.proc.wait(timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _active_nodes(status: str) -> int:
    """Nodes listed under "Active:" in ``ray status`` output."""
    lines = status.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Active:")
    except StopIteration:
        return 0
    count = 0
    for line in lines[start + 1 :]:
        if not line.strip().startswith("1 node_"):
            break
        count += 1
    return count
