"""Churn soak on real processes: a SuperLink with five SuperNodes on 127.0.0.1, FedAvg on the
embedded digits for 50 rounds, one SuperNode killed (SIGKILL, as a power cut) and restarted
every 10 rounds (rounds 5, 15, 25, ...: partitions in turn), and once the SuperLink with its
SuperExec and ServerApp killed and the run resumed (``resume = true``, the same run-name, the
same SuperLink database). The same config then runs undisturbed on a fresh federation.

It prints, per run: rounds completed (and whether they are 1..R, none lost or repeated),
client-rounds accounted (the sum of every metrics.jsonl row's accepted replies against the
summary's ``comm.client_rounds``, the run's accounts), the rounds that lost a node with their
seconds against the median round, and the test accuracy with its 95 % Wilson interval.

Each run's files stay in WORK/<run>/ (logs of every process, the run folder under out/); a run
whose summary.json exists is not run again, so a soak cut short is continued by the same command.

    python scripts/churn_soak.py --work /tmp/fedapp-soak            # the soak (minutes)
    python scripts/churn_soak.py --smoke --work /tmp/soak-smoke     # 2 nodes, 2 rounds, 1 kill
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import processes
from processes import (
    REPO_DIR,
    Federation,
    Processes,
    flwr_run_command,
    managed_processes,
    preset_with,
    read_rounds,
)

from fedapp.evaluation.intervals import wilson_interval

PRESET = "fedavg-digits"
RUN_NAME = "soak"
#: How often the run folder and the logs are looked at.
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Plan:
    """What one soak does."""

    nodes: int
    rounds: int
    node_kill_rounds: tuple[int, ...]  # a SuperNode is killed while it trains these rounds
    server_kill_after: int  # the SuperLink is killed once this many rounds are done; 0: never
    round_timeout: float

    def run_config(self, out: Path, resume: bool = False) -> dict[str, Any]:
        return {
            "num-clients": self.nodes,
            "fraction-train": 1.0,
            "num-server-rounds": self.rounds,
            "round-timeout": self.round_timeout,
            "node-wait-timeout": 300.0,
            "out-dir": str(out),
            "run-name": RUN_NAME,
            "resume": resume,
        }


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def rounds_done(run_dir: Path) -> int:
    """Rows of metrics.jsonl that are whole lines (the last one may be being written)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.endswith("}"))


class Soak:
    """One run of the plan on a fresh federation in ``root``; ``churn`` turns the kills on."""

    def __init__(self, procs: Processes, root: Path, plan: Plan, churn: bool) -> None:
        self.procs, self.root, self.plan, self.churn = procs, root, plan, churn
        self.fed = Federation(procs, root)
        self.out = root / "out"
        self.run_dir = self.out / RUN_NAME
        self.database = str(root / "superlink.db")
        self.starts: dict[int, int] = {}  # partition -> times started (names its process)
        self.events: list[str] = []
        self.launches = 0
        self.node_kills = 0
        self.server_killed: tuple[int, float] | None = None  # (rounds done, when)

    def node_name(self, partition: int) -> str:
        return f"sn{partition}-{self.starts[partition]}"

    def start_node(self, partition: int) -> Path:
        self.starts[partition] = self.starts.get(partition, 0) + 1
        name = self.node_name(partition)
        return self.fed.start_supernode(name, partition, self.plan.nodes, "--insecure")

    def start_link(self) -> None:
        """The SuperLink; with churn on a database, so that a restarted one knows the run's
        nodes (SQLite under heavy load sometimes answers a push with 'database is locked': that
        reply is lost and its round waits for round-timeout)."""
        name = f"superlink-{self.launches + 1}"
        keep = ["--database", self.database] if self.churn else []
        self.fed.start_superlink("--insecure", *keep, name=name)

    def launch(self, resume: bool) -> str:
        self.launches += 1
        name = f"flwr-run-{self.launches}"
        config = self.plan.run_config(self.out, resume=resume)
        path = preset_with(self.root, PRESET, config, name=f"run-{self.launches}")
        self.procs.start(
            name, flwr_run_command(["deploy", "--run-config", str(path)]), self.fed.env, REPO_DIR
        )
        return name

    def wait_training(self, log: Path, seen: int, wait: float) -> None:
        """Wait (up to ``wait`` s) until the node's log shows more train messages than ``seen``."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if log.read_text(errors="replace").count("Receiving: train message") > seen:
                return
            time.sleep(POLL_SECONDS)

    def kill_node_in(self, server_round: int, deadline: float) -> None:
        """SIGKILL the SuperNode whose turn it is while it trains ``server_round`` (or, if its
        message is slow to come, once the round has begun); start it again at once."""
        partition = self.node_kills % self.plan.nodes
        self.node_kills += 1
        name = self.node_name(partition)
        log = self.root / f"{name}.log"
        while rounds_done(self.run_dir) < server_round - 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {server_round - 1} not reached")
            time.sleep(POLL_SECONDS)
        self.wait_training(log, log.read_text(errors="replace").count("Receiving: train"), 20)
        self.procs.kill(name)
        self.events.append(f"round {server_round}: SuperNode {name} (partition {partition}) killed")
        say(self.events[-1] + "; restarting it")
        self.start_node(partition)

    def kill_server_after(self, done: int, run: str, deadline: float) -> str:
        """SIGKILL the SuperLink (SuperExec and ServerApp die with it) after ``done`` rounds,
        restart it on its database and resume the run; the new ``flwr run``'s name."""
        while rounds_done(self.run_dir) < done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {done} not reached")
            time.sleep(POLL_SECONDS)
        self.procs.kill(f"superlink-{self.launches}")
        self.server_killed = (rounds_done(self.run_dir), time.monotonic())
        self.events.append(f"after round {self.server_killed[0]}: SuperLink killed")
        say(self.events[-1] + "; restarting it and resuming the run")
        self.procs.wait_exit(run, timeout=120)  # the CLI loses its stream and gives up
        self.start_link()
        return self.launch(resume=True)

    def note_resumed(self, done: int) -> None:
        """Once the resumed run completes a round: how long the server kill cost."""
        if self.server_killed and done > self.server_killed[0]:
            seconds = time.monotonic() - self.server_killed[1]
            self.events.append(
                f"round {done} completed {seconds:.0f} s after the SuperLink was killed "
                "(restart, resume, handshake and the round itself)"
            )
            say(self.events[-1])
            self.server_killed = None

    def run(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        self.fed.connect()
        self.start_link()
        for partition in range(self.plan.nodes):
            self.start_node(partition)
        run = self.launch(resume=False)
        if self.churn:
            pending = sorted(self.plan.node_kill_rounds)
            server_kill = self.plan.server_kill_after
            while pending or server_kill:
                if server_kill and (not pending or pending[0] > server_kill):
                    run = self.kill_server_after(server_kill, run, deadline)
                    server_kill = 0
                else:
                    self.kill_node_in(pending.pop(0), deadline)
                self.note_resumed(rounds_done(self.run_dir))
        last = -1
        while self.procs.by_name[run].poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not end in {timeout:.0f} s; logs in {self.root}")
            done = rounds_done(self.run_dir)
            self.note_resumed(done)
            if done != last and done % 5 == 0:
                say(f"{self.root.name}: {done}/{self.plan.rounds} rounds")
                last = done
            time.sleep(POLL_SECONDS)
        if not (self.run_dir / "summary.json").exists():
            log = self.root / f"{run}.log"
            raise RuntimeError(f"no summary.json; {log}:\n{log.read_text()[-3000:]}")
        (self.root / "events.json").write_text(json.dumps(self.events, indent=1))
        return figures(self.run_dir, self.plan, self.events)


def figures(run_dir: Path, plan: Plan, events: list[str]) -> dict[str, Any]:
    """What the soak reports about one run folder."""
    rows = read_rounds(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    seconds = [row["seconds"] for row in rows]
    median = statistics.median(seconds)
    lost = [
        {
            "round": row["round"],
            "sampled": row["clients-sampled"],
            "accepted": row["clients-accepted"],
            "seconds": row["seconds"],
        }
        for row in rows
        if row["clients-accepted"] < plan.nodes
    ]
    accuracy, examples = summary["test_accuracy"], summary["test_examples"]
    low, high = wilson_interval(accuracy, examples)
    return {
        "rounds": [row["round"] for row in rows],
        "rounds_complete": [row["round"] for row in rows] == list(range(1, plan.rounds + 1)),
        "client_rounds_metrics": sum(row["clients-accepted"] for row in rows),
        "client_rounds_summary": int(summary["comm"]["client_rounds"]),
        "resumed_from_round": summary.get("resumed_from_round"),
        "median_round_seconds": median,
        "lost_rounds": lost,
        "test_accuracy": accuracy,
        "test_examples": examples,
        "ci95": (low, high),
        "events": events,
    }


def report(name: str, fig: dict[str, Any]) -> str:
    accounted = fig["client_rounds_metrics"] == fig["client_rounds_summary"]
    resumed = fig["resumed_from_round"]
    lines = [
        f"{name}: {len(fig['rounds'])} rounds completed"
        f" ({'1..R, none lost or repeated' if fig['rounds_complete'] else 'NOT 1..R'})"
        + (f", resumed after round {resumed}" if resumed else ""),
        f"  client-rounds: {fig['client_rounds_metrics']} accepted in metrics.jsonl, "
        f"{fig['client_rounds_summary']} in the summary's accounts"
        f" ({'equal' if accounted else 'DIFFERENT'})",
        f"  median round {fig['median_round_seconds']:.1f} s",
    ]
    for event in fig["events"]:
        lines.append(f"  event: {event}")
    for row in fig["lost_rounds"]:
        extra = row["seconds"] - fig["median_round_seconds"]
        lines.append(
            f"  round {row['round']}: {row['accepted']} of {row['sampled']} sampled replied, "
            f"{row['seconds']:.1f} s "
            f"({extra:+.1f} s against the median)"
        )
    low, high = fig["ci95"]
    lines.append(
        f"  test accuracy {100 * fig['test_accuracy']:.2f}% [{100 * low:.2f}, {100 * high:.2f}]"
        f" on {fig['test_examples']} images"
    )
    return "\n".join(lines)


def soak(work: Path, plan: Plan, timeout: float, only: str = "") -> dict[str, dict[str, Any]]:
    """Both runs (or ``only`` one), each skipped where an earlier invocation finished it."""
    results = {}
    for name, churn in (("churn", True), ("undisturbed", False)):
        if only and name != only:
            continue
        root = work / name
        done = root / "figures.json"
        if done.exists():
            say(f"{name}: finished before, figures from {done}")
            results[name] = json.loads(done.read_text())
            continue
        if root.exists():  # cut short: start that run again from nothing
            subprocess.run(["rm", "-rf", str(root)], check=True)
        root.mkdir(parents=True)
        say(f"{name}: {plan.nodes} SuperNodes, {plan.rounds} rounds, logs in {root}")
        with managed_processes(root) as procs:
            results[name] = Soak(procs, root, plan, churn).run(timeout)
        done.write_text(json.dumps(results[name], indent=1))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/fedapp-soak"))
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--kill-every", type=int, default=10, help="rounds between node kills")
    parser.add_argument("--server-kill-after", type=int, default=30)
    parser.add_argument("--round-timeout", type=float, default=90.0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument(
        "--only", choices=("churn", "undisturbed"), default="", help="one run (both in parallel)"
    )
    parser.add_argument("--smoke", action="store_true", help="2 nodes, 2 rounds, server kill only")
    args = parser.parse_args()
    if args.smoke:
        args.nodes, args.rounds, args.kill_every, args.server_kill_after = 2, 2, 0, 1
    if not 0 <= args.server_kill_after < args.rounds or args.nodes < 2 or args.kill_every < 0:
        parser.error("needs --nodes >= 2, --kill-every >= 0, 0 <= --server-kill-after < --rounds")
    first = args.kill_every // 2 or args.kill_every
    kills = tuple(range(first, args.rounds + 1, args.kill_every)) if args.kill_every else ()
    plan = Plan(args.nodes, args.rounds, kills, args.server_kill_after, args.round_timeout)
    processes.RUN_TIMEOUT = args.timeout
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally blocks stop everything
    results = soak(args.work, plan, args.timeout, args.only)
    print()
    for name, fig in results.items():
        print(report(name, fig))
    if args.only:
        return
    churn, calm = results["churn"], results["undisturbed"]
    ok = all(
        fig["rounds_complete"] and fig["client_rounds_metrics"] == fig["client_rounds_summary"]
        for fig in results.values()
    )
    gap = 100 * (churn["test_accuracy"] - calm["test_accuracy"])
    print(f"\nchurn - undisturbed test accuracy: {gap:+.2f} points")
    if not ok or not math.isfinite(gap):
        sys.exit("soak: rounds lost or repeated, or client-rounds not accounted")


if __name__ == "__main__":
    main()
