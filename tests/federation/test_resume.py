"""A run that crashes after round k and is resumed reports the same accounting as one that never
stopped: communication ledger, compute proxy, resource metering and every other summary.json
figure; and a method's own records (MaxNet/MinNet role counts, which also decide later rounds'
roles) survive the checkpoint.

The crash is real: the server's process state is lost when a node's reply raises in round k + 1
(as if the server died mid-round), and the resumed run starts from nothing but the files on disk.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from digits_runs import DIGITS_FEAST
from local_grid import PowerCut, crash_in_round, preset_overrides, run_config, run_local
from processes import read_rounds
from run_figures import comparable_summary

from fedapp.methods.common.strategy import build_strategy
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.profiles import NodeRegistry

ROUNDS, CRASH_AFTER = 2, 1


#: What a resumed run cannot equal: clocks, where it ran, measured CPU and memory use.
def _config(out: Path, name: str, **extra: Any) -> dict[str, Any]:
    return run_config(
        **preset_overrides("fedavg-digits")
        | {
            "num_clients": 4,
            "fraction_train": 0.75,
            "num_server_rounds": ROUNDS,
            "local_epochs": 1,
            "out_dir": str(out),
            "run_name": name,
        }
        | extra
    )


def test_resumed_run_reports_the_accounting_of_an_uninterrupted_one(tmp_path: Path) -> None:
    whole, _ = run_local(_config(tmp_path, "whole"), num_nodes=4)

    crash = _config(tmp_path, "crash")
    with pytest.raises(PowerCut):
        hooks = dict.fromkeys(range(4), crash_in_round(CRASH_AFTER + 1))
        run_local(crash, num_nodes=4, reply_hooks=hooks)
    assert [r["round"] for r in read_rounds(tmp_path / "crash")] == list(range(1, CRASH_AFTER + 1))
    resumed, _ = run_local(_config(tmp_path, "crash", resume=True), num_nodes=4)

    assert resumed["resumed_from_round"] == CRASH_AFTER
    assert comparable_summary(resumed) == comparable_summary(whole)
    # the figures the comparison covers are real ones, accumulated over all rounds
    cohort = 3
    assert resumed["comm"]["client_rounds"] == ROUNDS * cohort
    assert resumed["resources"]["metered_client_rounds"] == ROUNDS * cohort
    assert resumed["compute_proxy_total_macs"] > 0
    assert len(resumed["compute_proxy_by_client"]) >= cohort
    rows = read_rounds(tmp_path / "crash")
    assert resumed["timing"]["rounds_seconds"] == pytest.approx(sum(r["seconds"] for r in rows))
    on_disk = json.loads((tmp_path / "crash" / "summary.json").read_text())
    assert on_disk["comm"] == whole["comm"]


def _hashes(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` -> the SHA-256 of its bytes."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_resume_with_another_config_is_refused_before_any_file_changes(tmp_path: Path) -> None:
    run_local(_config(tmp_path, "kept", num_server_rounds=1), num_nodes=4)
    run_dir = tmp_path / "kept"
    saved = json.loads((run_dir / "config.json").read_text())
    before = _hashes(run_dir)
    assert {"checkpoint.pt", "config.json", "metrics.jsonl", "summary.json"} <= set(before)

    other = {"num_server_rounds": 1, "learning_rate": 0.03, "local_epochs": 2}
    with pytest.raises(ConfigError) as refused:
        run_local(_config(tmp_path, "kept", resume=True, **other), num_nodes=4)

    message = str(refused.value)
    assert f"{run_dir} was run with another config" in message
    # each differing key with both values; resume, a placement key, may differ
    assert f"learning-rate = {saved['learning-rate']!r} there, 0.03 now" in message
    assert f"local-epochs = {saved['local-epochs']!r} there, 2 now" in message
    assert message.count(" there, ") == 2
    assert _hashes(run_dir) == before

    with pytest.raises(ConfigError, match=r"already holds a run \(summary\.json, checkpoint\.pt\)"):
        run_local(_config(tmp_path, "kept", num_server_rounds=1), num_nodes=4)  # resume = false
    assert _hashes(run_dir) == before


def test_maxnet_role_counts_survive_the_checkpoint_and_decide_the_next_roles(tmp_path) -> None:
    config = run_config(**DIGITS_FEAST | {"strategy": "superfednas", "out_dir": str(tmp_path)})
    cfg = parse_run_config(config)
    before = build_strategy(cfg, NodeRegistry(cfg.num_clients))
    for cohort in ([0, 1, 2], [1, 2, 3], [0, 2, 3]):
        before.tracker.roles(cohort)
    stored = json.loads(json.dumps(before.accounts()))  # as the checkpoint keeps it

    after = build_strategy(cfg, NodeRegistry(cfg.num_clients))
    after.restore_accounts(stored)
    assert after.tracker.largest == before.tracker.largest
    assert after.tracker.smallest == before.tracker.smallest
    assert after.tracker.roles([0, 1, 2, 3]) == before.tracker.roles([0, 1, 2, 3])


def test_the_points_trained_before_a_crash_stay_marked_trained(tmp_path) -> None:
    """summary.json's ``trained`` flag of an operating point counts the rounds before a crash."""
    cfg = parse_run_config(run_config(**DIGITS_FEAST | {"out_dir": str(tmp_path)}))
    before = build_strategy(cfg, NodeRegistry(cfg.num_clients))
    before.accounting.trained_points.update({0, 3, 7})
    stored = json.loads(json.dumps(before.accounts()))  # as the checkpoint keeps it

    after = build_strategy(cfg, NodeRegistry(cfg.num_clients))
    after.restore_accounts(stored)
    assert after.accounting.trained_points == {0, 3, 7}
