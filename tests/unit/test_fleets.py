"""Fleet files: how clients map onto device classes, when a device is reachable, and the round
policies on hand-made client times."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from local_grid import local_federation, run_config

from fedapp.evaluation.fleet_clock import DeviceClass, time_round
from fedapp.evaluation.fleets import Fleet, parse_fleet

THREE_CLASSES = """
[[class]]
name = "fast"
share = 0.2
macs-per-second = 1e11
memory-mb = 8192
download-mbps = 100.0
upload-mbps = 50.0

[[class]]
name = "slow"
share = 0.5
macs-per-second = 1e9
memory-mb = 1024
download-mbps = 10.0
upload-mbps = 5.0
availability = 0.5

[[class]]
name = "middle"
share = 0.3
macs-per-second = 1e10
memory-mb = 4096
download-mbps = 50.0
upload-mbps = 20.0
"""


def fleet(text: str = THREE_CLASSES) -> Fleet:
    return parse_fleet(tomllib.loads(text), "three", "three.toml")


def test_the_largest_budgets_get_the_fastest_classes_in_their_shares() -> None:
    budgets = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 10.0]
    names = [device.name for device in fleet().assign(budgets)]
    by_budget = [name for _, name in sorted(zip(budgets, names, strict=True))]
    assert by_budget == ["slow"] * 5 + ["middle"] * 3 + ["fast"] * 2
    # 7 clients: 3.5 / 2.1 / 1.4 -> 3, 2, 1 and the largest remainder (slow's .5) gets the 7th
    counts = [d.name for d in fleet().assign([float(b) for b in range(7)])]
    assert (counts.count("slow"), counts.count("middle"), counts.count("fast")) == (4, 2, 1)


def test_equal_budgets_are_ranked_by_partition_id() -> None:
    names = [d.name for d in fleet().assign([1.0] * 10)]
    assert names == ["slow"] * 5 + ["middle"] * 3 + ["fast"] * 2


def test_a_partition_table_names_each_clients_class() -> None:
    text = THREE_CLASSES + '\n[partitions]\n"0" = "fast"\n"1" = "slow"\n'
    by_partition = fleet(text.replace("[[class]]", 'assignment = "partition"\n[[class]]', 1))
    assert [d.name for d in by_partition.assign([1.0, 2.0])] == ["fast", "slow"]
    with pytest.raises(ValueError, match=r"names no class for partition\(s\) \[2\]"):
        by_partition.assign([1.0, 2.0, 3.0])


def test_availability_is_a_seeded_draw_per_round_and_partition_and_a_trace_replaces_it() -> None:
    slow = fleet().class_named("slow")
    draws = [[fleet().available(slow, 42, r, p) for p in range(50)] for r in range(1, 5)]
    again = [[fleet().available(slow, 42, r, p) for p in range(50)] for r in range(1, 5)]
    assert draws == again
    share = sum(map(sum, draws)) / 200
    assert 0.35 < share < 0.65  # availability 0.5
    assert draws[0] != draws[1]
    always = fleet().class_named("fast")
    assert all(fleet().available(always, 42, r, 0) for r in range(1, 20))
    traced = fleet(THREE_CLASSES + '\n[traces]\n"3" = [1, 0, 0]\n')
    assert [traced.available(always, 42, r, 3) for r in range(1, 7)] == [1, 0, 0, 1, 0, 0]


def test_unreachable_devices_are_not_sampled(tmp_path: Path) -> None:
    path = tmp_path / "half.toml"
    path.write_text(THREE_CLASSES.replace("share = 0.2", "share = 0.0").replace(
        "share = 0.3", "share = 0.0").replace("share = 0.5", "share = 1.0"))  # fmt: skip
    config = run_config(
        dataset="digits",
        num_clients=8,
        fraction_train=1.0,
        strategy="fedavg",
        model="cnn-small",
        budget_min=2e5,
        budget_max=6e6,
        fleet__file=str(path),
    )
    federation = local_federation(config, 8)
    strategy = federation.strategy
    for server_round in (1, 2, 3):
        sampled = {p.partition_id for p in strategy.sample_cohort(server_round, federation.grid)}
        reachable = {p for p in range(8) if strategy.fleet.available(server_round, p)}
        assert sampled == reachable and len(reachable) < 8


def test_the_policies_on_hand_made_times() -> None:
    seconds = {11: 4.0, 12: 1.0, 13: 9.0, 14: 1.0}
    everyone = time_round(seconds, "wait-for-all", 0.0, 2)
    assert everyone.kept == (12, 14, 11, 13) and everyone.seconds == 9.0
    cut = time_round(seconds, "deadline", 5.0, 2)
    assert (cut.kept, cut.late, cut.seconds) == ((12, 14, 11), (13,), 5.0)
    in_time = time_round(seconds, "deadline", 10.0, 2)
    assert (in_time.late, in_time.seconds) == ((), 9.0)  # nobody late: the last reply ends it
    first = time_round(seconds, "over-commit", 0.0, 2)
    assert (first.kept, first.surplus, first.seconds) == ((12, 14), (11, 13), 1.0)


def test_a_client_round_is_download_then_training_then_upload() -> None:
    device = DeviceClass("board", 2e9, 1024, download_mbps=8.0, upload_mbps=4.0)
    # 1 MB down at 8 Mbit/s: 1 s; 4e9 MACs at 2e9/s: 2 s; 0.5 MB up at 4 Mbit/s: 1 s
    assert device.client_round_seconds(1e6, 4e9, 0.5e6) == pytest.approx(4.0)
