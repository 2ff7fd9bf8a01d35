"""No client shortens its time on the fleet's clock by under-reporting its work.

The fleet's clock times a client-round by the compute proxy the reply reports; the server holds
it to the least work the examples it claims take with what the method sent it (its model,
width, level, mask, subnet or co-training plan). Every method runs on real digits over the
in-process grid with fedapp's own ClientApp, one partition claiming to have done no work: that
reply alone is dropped with its reason, and every honest reply (all other partitions, all
other rounds) is kept, so no honest client is ever below its floor. On FedAvg a claim 1 %
below the real work is refused too, and on HeteroFL a claim of half the shard with half the work.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from digits_runs import (
    DIGITS_FEAST,
    DIGITS_FEDDISTILL,
    DIGITS_FEDKD_NAS,
    DIGITS_FIARSE,
    DIGITS_HETEROFL,
    DIGITS_SCALEFL,
    DITTO_DIGITS,
    FEDDF_DIGITS,
    FEDMD_PHASES,
    LOGIT_EXCHANGE_DIGITS,
)
from hostile_client import Lies, hostile_app
from local_grid import LocalGrid, preset_overrides, run_config, server_context

from fedapp.apps.server_app import run_experiment
from fedapp.models.cache import Variant
from fedapp.run.config import parse_run_config
from fedapp.training.co_training import CoTrainingPlan

ONE_ROUND = {"num_server_rounds": 1, "fraction_train": 1.0, "local_epochs": 1}
FEDAVG = preset_overrides("fedavg-digits") | ONE_ROUND | {"num_clients": 3}
FEDKD_NAS = DIGITS_FEDKD_NAS | ONE_ROUND | {"fedkd_nas__teacher_epochs": 1}
#: Each method's run, and the round its partition 0 claims no work (FedMD: round 2, once there
#: is a consensus to revisit the shard after).
RUNS: dict[str, tuple[dict[str, Any], int]] = {
    "fedavg": (FEDAVG, 1),
    "flwr:fedprox": (FEDAVG | {"strategy": "flwr:fedprox"}, 1),
    "ditto": (DITTO_DIGITS | ONE_ROUND | {"num_clients": 3}, 1),
    "feast": (DIGITS_FEAST | ONE_ROUND | {"num_clients": 3}, 1),
    "superfednas": (DIGITS_FEAST | ONE_ROUND | {"num_clients": 3, "strategy": "superfednas"}, 1),
    "deepfednas": (DIGITS_FEAST | ONE_ROUND | {"num_clients": 3, "strategy": "deepfednas"}, 1),
    "heterofl": (DIGITS_HETEROFL | ONE_ROUND | {"num_clients": 3}, 1),
    "scalefl": (DIGITS_SCALEFL | ONE_ROUND, 1),
    "fiarse": (DIGITS_FIARSE | ONE_ROUND | {"num_clients": 3}, 1),
    "feddf": (FEDDF_DIGITS | ONE_ROUND | {"num_clients": 3, "feddf__distill_steps": 5}, 1),
    "feddistill": (DIGITS_FEDDISTILL | ONE_ROUND, 1),
    "fedmd": (LOGIT_EXCHANGE_DIGITS | ONE_ROUND | FEDMD_PHASES | {"num_server_rounds": 2}, 2),
    "fedkd-nas": (FEDKD_NAS | {"strategy": "fedkd-nas"}, 1),
    "local-kd": (FEDKD_NAS | {"strategy": "local-kd"}, 1),
}


def _run(tmp_path: Path, overrides: dict[str, Any], lies: Lies) -> list[dict[str, Any]]:
    config = run_config(**overrides | {"out_dir": str(tmp_path), "run_name": "run"})
    server_context(config)
    grid = LocalGrid(hostile_app(lies), config, num_nodes=int(config["num-clients"]))
    run_experiment(grid, parse_run_config(config))
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped reply" in r.getMessage()]


@pytest.mark.parametrize("method", list(RUNS))
def test_a_reply_claiming_no_work_is_dropped_and_every_honest_one_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, method: str
) -> None:
    overrides, lying_round = RUNS[method]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        rows = _run(tmp_path, overrides | {"strategy": method}, {0: {lying_round: "no-work"}})

    dropped = {r["round"]: r["clients-dropped"] for r in rows}
    assert dropped == {r["round"]: int(r["round"] == lying_round) for r in rows}
    assert all(r["clients-accepted"] == r["clients-sampled"] - dropped[r["round"]] for r in rows)
    (refusal,) = _refusals(caplog)
    assert "(partition 0)" in refusal and "compute-proxy-macs = 0.0 is less than" in refusal


def test_a_fedavg_reply_one_percent_short_of_its_work_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="flwr"):
        rows = _run(tmp_path, FEDAVG, {1: {1: "under-reported-compute"}})

    assert rows[0]["clients-dropped"] == 1
    (refusal,) = _refusals(caplog)
    assert "(partition 1)" in refusal and "take at the least" in refusal


def test_a_heterofl_reply_claiming_half_its_shard_and_half_the_work_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """HeteroFL averages replies unweighted: fewer examples claimed would buy a shorter time at
    no cost in say, so the floor counts the examples the node's profile holds."""
    overrides, _ = RUNS["heterofl"]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        rows = _run(tmp_path, overrides, {2: {1: "fewer-examples"}})

    assert rows[0]["clients-dropped"] == 1
    (refusal,) = _refusals(caplog)
    assert "(partition 2)" in refusal and "take at the least" in refusal


def test_a_plans_least_work_is_its_cheapest_draw() -> None:
    """The floor of a FEAST plan equals the cheapest mini-batch its client can draw."""
    smallest, *between, largest = [Variant(None, macs, 0) for macs in (10, 40, 25, 70, 100)]
    plan = CoTrainingPlan(smallest, largest, tuple(between), "full")
    generator = torch.Generator().manual_seed(0)
    draws = {sum(p.variant.macs for p in plan.passes(generator)) for _ in range(200)}
    assert draws == {135, 150, 180}
    assert plan.least_forward_macs == min(draws)
    assert CoTrainingPlan(smallest, largest, tuple(between), "min-max").least_forward_macs == 110
