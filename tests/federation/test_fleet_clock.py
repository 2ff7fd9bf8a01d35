"""The fleet's clock on short real digits runs (the real ServerApp logic and ClientApp): it
leaves a wait-for-all run bit-identical, a deadline drops exactly the replies whose fleet time
exceeds it, a round lasts as the formula says on a hand-made fleet, and over-commit keeps the
first cohort's worth of replies."""

from __future__ import annotations

import csv
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from digits_runs import DIGITS_FEAST
from flwr.app import Message, MessageType
from local_grid import FIRST_NODE_ID, run_config, run_local

from fedapp.evaluation.fleets import FleetFileError, load_fleet, parse_fleet
from fedapp.results import load_run
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.wire.messages import ARRAYS, COMPUTE_METRIC, METRICS
from fedapp.wire.records import from_record

NODES = 4
#: Two device classes with round figures, the partitions alternating between them.
HAND_MADE_FLEET = """
assignment = "partition"

[[class]]
name = "slow"
macs-per-second = 2e8
memory-mb = 512
download-mbps = 2.0
upload-mbps = 1.0

[[class]]
name = "fast"
macs-per-second = 5e9
memory-mb = 4096
download-mbps = 100.0
upload-mbps = 50.0

[partitions]
"0" = "slow"
"1" = "fast"
"2" = "slow"
"3" = "fast"
"""
SLOW = {"slow": (2e8, 2.0, 1.0), "fast": (5e9, 100.0, 50.0)}  # rate, Mbit/s down, up


def fleet_file(folder: Path) -> str:
    path = folder / "hand-made.toml"
    path.write_text(HAND_MADE_FLEET)
    return str(path)


def digits_run(out: Path, name: str, **fleet: Any) -> tuple[dict[str, Any], list[Message]]:
    """Two rounds of FEAST on 4 digits nodes, all in every round; the summary and every
    training reply as it arrived."""
    replies: list[Message] = []

    def keep(index: int, reply: Message) -> Message:
        replies.append(reply)
        return reply

    config = run_config(
        **DIGITS_FEAST,
        num_clients=NODES,
        fraction_train=1.0,
        num_server_rounds=2,
        eval_every=1,
        out_dir=str(out),
        run_name=name,
        **{f"fleet__{key}": value for key, value in fleet.items()},
    )
    summary, grid = run_local(config, NODES, reply_hooks=dict.fromkeys(range(NODES), keep))
    train = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    return summary, list(zip(train, replies, strict=True))


def formula_seconds(sent: Message, reply: Message) -> float:
    """A client-round's fleet seconds on the hand-made fleet, from what was sent and replied."""
    partition = sent.metadata.dst_node_id - FIRST_NODE_ID
    rate, down, up = SLOW["slow" if partition % 2 == 0 else "fast"]
    bytes_down = sum(a.nbytes for a in from_record(sent.content[ARRAYS]).values())
    bytes_up = sum(a.nbytes for a in from_record(reply.content[ARRAYS]).values())
    macs = float(reply.content[METRICS][COMPUTE_METRIC])
    return 8 * bytes_down / (down * 1e6) + macs / rate + 8 * bytes_up / (up * 1e6)


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def fleet_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "fleet.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def wait_for_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:
    """The same run on the default fleet and on the hand-made one, both waiting for all."""
    out = tmp_path_factory.mktemp("fleet")
    digits_run(out, "default")
    _, exchanged = digits_run(out, "hand-made", file=fleet_file(out))
    return out / "default", out / "hand-made", exchanged


def test_wait_for_all_leaves_the_run_bit_identical(wait_for_all: tuple[Path, Path, list]) -> None:
    default, hand_made, _ = wait_for_all
    for name in ("model_final.pt", "model_best.pt", "variants.csv", "communication.csv"):
        assert (default / name).read_bytes() == (hand_made / name).read_bytes(), name

    def trained(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if "second" not in k and "cpu" not in k
                and "rss" not in k}  # fmt: skip

    assert [trained(r) for r in rows(default)] == [trained(r) for r in rows(hand_made)]
    # the clock ran: the two fleets timed the same rounds differently, and dropped nothing
    seconds = [[r["fleet-seconds-clients"] for r in rows(d)] for d in (default, hand_made)]
    assert seconds[0] != seconds[1]
    assert all(r["clients-late"] == r["clients-surplus"] == 0 for r in rows(hand_made))


def test_round_time_equals_the_formula_on_a_hand_made_fleet(
    wait_for_all: tuple[Path, Path, list],
) -> None:
    _, hand_made, exchanged = wait_for_all
    by_round: dict[int, list[float]] = {}
    for sent, reply in exchanged:
        by_round.setdefault(int(sent.metadata.group_id), []).append(formula_seconds(sent, reply))
    recorded = {(int(r["round"]), int(r["partition"])): r for r in fleet_rows(hand_made)}
    for sent, reply in exchanged:
        key = (int(sent.metadata.group_id), sent.metadata.dst_node_id - FIRST_NODE_ID)
        assert float(recorded[key]["fleet_seconds"]) == pytest.approx(
            formula_seconds(sent, reply), rel=1e-12
        )
        assert recorded[key]["device"] == ("slow" if key[1] % 2 == 0 else "fast")
    for row in rows(hand_made):
        assert row["fleet-seconds-clients"] == pytest.approx(max(by_round[row["round"]]))
        assert row["fleet-seconds"] == pytest.approx(
            row["fleet-seconds-clients"] + row["seconds-aggregate"]
        )
    totals = np.cumsum([r["fleet-seconds"] for r in rows(hand_made)])
    assert [r["fleet-seconds-total"] for r in rows(hand_made)] == pytest.approx(list(totals))
    summary = json.loads((hand_made / "summary.json").read_text())
    assert summary["fleet"]["seconds"] == pytest.approx(totals[-1])
    assert summary["fleet"]["clients_by_class"] == {"slow": 2, "fast": 2}


def test_a_deadline_drops_exactly_the_replies_past_it(
    tmp_path: Path, wait_for_all: tuple[Path, Path, list]
) -> None:
    _, _, exchanged = wait_for_all
    first = sorted(formula_seconds(s, r) for s, r in exchanged if s.metadata.group_id == "1")
    deadline = (first[1] + first[2]) / 2  # two of the four clients are past it
    summary, exchanged = digits_run(
        tmp_path, "deadline", file=fleet_file(tmp_path), policy="deadline", deadline=deadline
    )
    run_dir = tmp_path / "deadline"
    late = {
        (int(s.metadata.group_id), s.metadata.dst_node_id - FIRST_NODE_ID)
        for s, r in exchanged
        if formula_seconds(s, r) > deadline
    }
    assert late, "the deadline must cut some replies for this test to mean anything"
    recorded = {(int(r["round"]), int(r["partition"])): r["outcome"] for r in fleet_rows(run_dir)}
    assert {key for key, outcome in recorded.items() if outcome == "late"} == late
    accepted = {(int(r["round"]), int(r["partition"])) for r in fleet_rows(run_dir)} - late
    with (run_dir / "communication.csv").open(newline="") as handle:
        ledger = {(int(r["round"]), int(r["partition"])) for r in csv.DictReader(handle)}
    assert ledger == accepted  # a late reply is never aggregated nor accounted
    for row in rows(run_dir):
        dropped = sum(1 for r, _ in late if r == row["round"])
        assert row["clients-late"] == row["clients-dropped"] == dropped
        assert row["clients-accepted"] == NODES - dropped
        assert row["fleet-seconds-clients"] == deadline  # someone was late: it waited until then
    assert summary["fleet"]["clients_late"] == len(late)


def test_over_commit_keeps_the_first_cohort(tmp_path: Path) -> None:
    """Half the population a round, over-committed 2x: all four sampled, the two fastest kept."""
    config = run_config(
        **DIGITS_FEAST,
        num_clients=NODES,
        fraction_train=0.5,
        num_server_rounds=1,
        out_dir=str(tmp_path),
        run_name="over",
        fleet__file=fleet_file(tmp_path),
        fleet__policy="over-commit",
        fleet__over_commit=2.0,
    )
    run_local(config, NODES)
    (row,) = rows(tmp_path / "over")
    assert (row["clients-sampled"], row["clients-accepted"], row["clients-surplus"]) == (4, 2, 2)
    outcomes = fleet_rows(tmp_path / "over")
    kept = sorted(float(r["fleet_seconds"]) for r in outcomes if r["outcome"] == "kept")
    surplus = sorted(float(r["fleet_seconds"]) for r in outcomes if r["outcome"] == "surplus")
    assert len(kept) == 2 and kept[-1] <= surplus[0]
    assert row["fleet-seconds-clients"] == kept[-1]


def test_a_run_from_before_the_clock_gets_its_fleet_time_from_its_files(
    wait_for_all: tuple[Path, Path, list], tmp_path: Path
) -> None:
    """The default-fleet run without its fleet columns and fleet.csv, as a run kept from before
    the clock (scripts/migrate_run_folders.py gives its config.json the fleet keys it ran
    with): its fleet time computed from its files is the one the clock recorded (FEAST's work
    per client-round is the same every round here)."""
    default, _, _ = wait_for_all
    kept = tmp_path / "kept"
    kept.mkdir()
    for path in default.iterdir():
        if path.is_file() and path.name != "fleet.csv":
            (kept / path.name).write_bytes(path.read_bytes())
    (kept / "metrics.jsonl").write_text(
        "".join(
            json.dumps({k: v for k, v in r.items() if not k.startswith("fleet")}) + "\n"
            for r in rows(default)
        )
    )
    computed, recorded = load_run(kept), load_run(default)
    assert computed.fleet_from_files and not recorded.fleet_from_files
    assert computed.fleet_hours == pytest.approx(recorded.fleet_hours, rel=1e-9)


def test_bad_fleets_are_refused_with_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no fleet 'nowhere'"):
        parse_run_config(run_config(fleet__file="nowhere"))
    with pytest.raises(ConfigError, match=re.escape("'fleet.deadline' > 0")):
        parse_run_config(run_config(fleet__policy="deadline"))
    with pytest.raises(ConfigError, match=re.escape("'fleet.clock' = 'wall'")):
        parse_run_config(run_config(fleet__clock="wall", fleet__policy="over-commit"))
    broken = HAND_MADE_FLEET.replace("upload-mbps = 1.0", "upload-mbps = 0.0")
    message = "class 'slow': upload-mbps = 0.0 must be > 0"
    with pytest.raises(FleetFileError, match=re.escape(message)):
        parse_fleet(tomllib.loads(broken), "broken", "broken.toml")
    unnamed = HAND_MADE_FLEET.replace('"3" = "fast"', '"3" = "tablet"')
    with pytest.raises(FleetFileError, match="partition 3 names class 'tablet'"):
        parse_fleet(tomllib.loads(unnamed), "unnamed", "unnamed.toml")


def test_the_default_fleet_carries_a_source_for_every_class() -> None:
    fleet = load_fleet("default")
    assert sum(fleet.shares) == pytest.approx(1.0)
    for device in fleet.classes:
        assert device.source, device.name
        assert device.availability == 1.0
    names = {c.name for c in fleet.classes}
    assert {"raspberry-pi-4", "raspberry-pi-5", "rock-pi-4", "x86-laptop"} <= names
    assert {c.name for c in fleet.classes if not c.estimate} == {
        "raspberry-pi-4",
        "raspberry-pi-5",
        "x86-laptop",
    }


def test_on_the_wall_clock_the_fleet_time_is_the_measured_round(tmp_path: Path) -> None:
    """A deployment (``fleet.clock = "wall"``) reports its real rounds in the same column."""
    summary, _ = digits_run(tmp_path, "wall", clock="wall")
    for row in rows(tmp_path / "wall"):
        assert row["fleet-seconds-clients"] == row["seconds-train-phase"]
        assert row["fleet-seconds"] == pytest.approx(
            row["seconds-train-phase"] + row["seconds-aggregate"]
        )
    assert not (tmp_path / "wall" / "fleet.csv").exists()
    assert summary["fleet"]["clock"] == "wall"
