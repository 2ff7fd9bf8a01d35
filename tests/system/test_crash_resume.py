"""Crashes of real processes: what a resume or a restart must continue.

- The SuperLink and everything it started (SuperExec, ServerApp) killed with SIGKILL mid-run,
  then the run resumed with the same config: for one method of each kind (a global model:
  FedAvg; the FEAST supernet; models on the clients: Ditto) the final model and every test
  figure equal those of the same run uninterrupted. The SuperNodes live on, as devices would; the
  resumed run is a new Flower run, so their ``Context.state`` is empty and Ditto's personal
  models come from the nodes' disks (fedapp.methods.common.state_store).
- A SuperNode killed and started again mid-run under Ditto continues its personal model from
  its disk (its log says from which round) instead of starting it afresh.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from digits_runs import DIGITS_FEAST
from local_grid import key_of_name
from processes import (
    REPO_DIR,
    Federation,
    flwr_run,
    flwr_run_command,
    managed_processes,
    preset_with,
    read_rounds,
    wait_for_file,
)
from run_figures import comparable_summary

from fedapp.evaluation.results import CHECKPOINT_FILE, FINAL_MODEL_FILE, SUMMARY_FILE

ROUNDS = 2
#: Generous: a reply that misses the round's deadline changes the run, so the uninterrupted and
#: the resumed run would differ by the machine's load (FEAST's largest client took over 25 s on
#: two busy cores); no test here waits on it (a dead node costs Flower's detection time).
ROUND_TIMEOUT = 300.0
#: A SuperNode that died stays listed for up to this long (Flower 1.42's heartbeat window);
#: the registry gives its partition to a newcomer only once it is gone.
DETECTION_SECONDS = 60.0
SMALL = {"num-clients": 2, "fraction-train": 1.0, "num-server-rounds": ROUNDS, "eval-every": 1}
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "feast": {key_of_name(k): v for k, v in DIGITS_FEAST.items()},
    "ditto": {"strategy": "ditto", "model": "lenet5-x0.5"},
}
#: Figures a resumed run cannot equal: clocks, measured use, where and when it ran.


def _config(tmp_path: Path, method: str, run_name: str, **extra: Any) -> Path:
    overrides = (
        SMALL
        | METHODS[method]
        | {"out-dir": str(tmp_path / "out"), "run-name": run_name}
        | {"round-timeout": ROUND_TIMEOUT}
        | extra
    )
    return preset_with(tmp_path, "fedavg-digits", overrides, name=f"{run_name}-{len(extra)}")


def _figures(run_dir: Path) -> dict[str, Any]:
    return comparable_summary(json.loads((run_dir / SUMMARY_FILE).read_text()))


def _run(fed: Federation, config: Path, log: Path) -> None:
    result = flwr_run(["deploy", "--run-config", str(config)], fed.env, log)
    assert result.returncode == 0, log.read_text()[-4000:]


@pytest.mark.parametrize("method", list(METHODS))
def test_superlink_killed_mid_run_resumes_to_the_uninterrupted_result(tmp_path, method) -> None:
    out = tmp_path / "out"
    database = str(tmp_path / "superlink.db")
    with managed_processes(tmp_path) as procs:
        fed = Federation(procs, tmp_path)
        fed.connect()
        fed.start_superlink("--insecure", "--database", database)
        for partition_id in (0, 1):
            fed.start_supernode(f"sn{partition_id}", partition_id, 2, "--insecure")
        _run(fed, _config(tmp_path, method, "whole"), tmp_path / "flwr-run-whole.log")

        run_log = procs.start(
            "flwr-run",
            flwr_run_command(["deploy", "--run-config", str(_config(tmp_path, method, "crash"))]),
            fed.env,
            REPO_DIR,
        )
        wait_for_file(out / "crash" / CHECKPOINT_FILE, timeout=180, log=run_log)
        procs.kill("superlink")  # SIGKILL: SuperLink, SuperExec and ServerApp at once
        done = torch.load(out / "crash" / CHECKPOINT_FILE, weights_only=True)["round"]
        assert 1 <= done < ROUNDS
        procs.wait_exit("flwr-run", timeout=60)

        fed.start_superlink("--insecure", "--database", database, name="superlink-restarted")
        resumed = _config(tmp_path, method, "crash", resume=True)
        resumed_log = tmp_path / "flwr-run-resumed.log"
        _run(fed, resumed, resumed_log)
        assert f"resuming {out / 'crash'} after round {done}" in resumed_log.read_text()

    crash, whole = out / "crash", out / "whole"
    assert [r["round"] for r in read_rounds(crash)] == list(range(1, ROUNDS + 1))
    for run_dir in (crash, whole):  # every client in every round: a dropped reply would differ
        assert [r["clients-dropped"] for r in read_rounds(run_dir)] == [0] * ROUNDS
    assert json.loads((crash / SUMMARY_FILE).read_text())["resumed_from_round"] == done
    assert _figures(crash) == _figures(whole)
    final = torch.load(crash / FINAL_MODEL_FILE, weights_only=True)
    expected = torch.load(whole / FINAL_MODEL_FILE, weights_only=True)
    assert final.keys() == expected.keys()
    assert all(torch.equal(torch.as_tensor(final[k]), torch.as_tensor(expected[k])) for k in final)
    if method == "ditto":  # the personal models came back from the nodes' disks
        assert list((crash / "node-state").glob("partition-*/round-*.npz"))


def test_a_supernode_restarted_mid_run_continues_its_personal_model(tmp_path: Path) -> None:
    """Ditto, two SuperNodes: partition 1's is killed after round 1's checkpoint and started
    again once the SuperLink has let its old node id go; its first round back continues the
    personal model it kept on disk."""
    out, rounds = tmp_path / "out", 4
    config = _config(tmp_path, "ditto", "restart", **{"num-server-rounds": rounds})
    with managed_processes(tmp_path) as procs:
        fed = Federation(procs, tmp_path)
        fed.connect()
        fed.start_superlink("--insecure")
        fed.start_supernode("sn0", 0, 2, "--insecure")
        fed.start_supernode("sn1", 1, 2, "--insecure")
        run_log = procs.start(
            "flwr-run",
            flwr_run_command(["deploy", "--run-config", str(config)]),
            fed.env,
            REPO_DIR,
        )
        wait_for_file(out / "restart" / CHECKPOINT_FILE, timeout=180, log=run_log)
        procs.kill("sn1")  # the board reboots
        time.sleep(DETECTION_SECONDS)
        restarted = fed.start_supernode("sn1-restarted", 1, 2, "--insecure")
        assert procs.wait_exit("flwr-run", timeout=400) == 0, run_log.read_text()[-4000:]
        node_log = restarted.read_text(errors="replace")

    assert "partition 1 continues its node state as of round" in node_log, node_log[-3000:]
    summary = json.loads((out / "restart" / SUMMARY_FILE).read_text())
    assert [row["partition"] for row in summary["personal"]] == [0, 1]
    kept = sorted((out / "restart" / "node-state" / "partition-1").glob("round-*.npz"))
    assert kept[-1].name == f"round-{rounds:06d}.npz"
