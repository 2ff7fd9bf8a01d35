"""A resume continues the models that live on the clients (fedapp.methods.common.state_store).

Ditto (a personal model), FedMD (the client's own model; FedDistill keeps it the same way) and
Local-KD (FedKD-NAS's controller history and candidate weights, plus the teacher's logits kept
once and the server's record of who got them) each run uninterrupted, then again with the server
lost at the first reply of round 2, after the first node has trained round 2 (so that node's
state is a round ahead of the checkpoint), and is resumed with fresh node contexts (a new
``flwr run`` has empty ``Context.state``): every summary figure equals the uninterrupted run's,
bit for bit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from digits_runs import FEDMD_PHASES, LOGIT_EXCHANGE_DIGITS
from flwr.app import ConfigRecord, RecordDict
from local_grid import PowerCut, crash_in_round, run_config, run_local
from run_figures import comparable_summary

from fedapp.methods.common.state_store import KEPT_SNAPSHOTS, ROUND_KEY, StateStore, snapshot_name
from fedapp.run.config import parse_run_config
from fedapp.run.context import data_layout
from fedapp.run.profiles import local_node
from fedapp.wire.records import from_record, to_record

ROUNDS = 2
#: What a resumed run cannot equal: clocks, where it ran, measured CPU and memory use.
DIGITS = {
    **LOGIT_EXCHANGE_DIGITS,
    "num_server_rounds": ROUNDS,
    "local_epochs": 1,
    "eval_every": ROUNDS,
}
METHODS = {
    "ditto": {"strategy": "ditto", "model": "lenet5-x0.5", "learning_rate": 0.05},
    "fedmd": FEDMD_PHASES,
    "local-kd": {
        "strategy": "local-kd",
        "candidates__family": "lenet5",
        "public_size": 200,
        "fedkd_nas__teacher_epochs": 2,
        "fedkd_nas__duel_every": 2,
    },
}


def _config(out: Path, method: str, name: str, **extra: Any) -> dict[str, Any]:
    return run_config(**DIGITS | METHODS[method] | {"out_dir": str(out), "run_name": name} | extra)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each method's uninterrupted run, made once for this module."""
    out = tmp_path_factory.mktemp("whole")
    return {method: run_local(_config(out, method, method), num_nodes=3)[0] for method in METHODS}


def _crash_in_round_2(tmp_path: Path, method: str) -> None:
    with pytest.raises(PowerCut):
        hooks = dict.fromkeys(range(3), crash_in_round(2))
        run_local(_config(tmp_path, method, "crash"), num_nodes=3, reply_hooks=hooks)
    ahead = tmp_path / "crash" / "node-state" / "partition-0" / snapshot_name(2)
    assert ahead.exists()  # node 0 trained round 2, which the server lost
    assert not (tmp_path / "crash" / "node-state" / "partition-1" / snapshot_name(2)).exists()


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_a_resume_continues_the_node_states_bit_for_bit(
    tmp_path: Path, method: str, uninterrupted: dict[str, dict[str, Any]]
) -> None:
    _crash_in_round_2(tmp_path, method)
    resumed, grid = run_local(_config(tmp_path, method, "crash", resume=True), num_nodes=3)

    assert resumed["resumed_from_round"] == 1
    assert comparable_summary(resumed) == comparable_summary(uninterrupted[method])
    final = tmp_path / "crash" / "node-state" / "partition-0"
    assert sorted(p.name for p in final.iterdir()) == [snapshot_name(1), snapshot_name(2)]
    if method == "local-kd":  # every node got the teacher's logits in round 1: none again
        sent = [m for m in grid.sent if m.metadata.message_type == "train"]
        assert sent and all(len(m.content["arrays"]) == 0 for m in sent)


@pytest.mark.slow
def test_without_the_node_states_a_resume_would_differ(tmp_path: Path, uninterrupted) -> None:
    """The check above can fail: the same crash, the node states deleted before the resume
    (what every resume did before): the global model is the same, the personal ones are not."""
    _crash_in_round_2(tmp_path, "ditto")
    for snapshot in (tmp_path / "crash" / "node-state").rglob("*.npz"):
        snapshot.unlink()
    resumed, _ = run_local(_config(tmp_path, "ditto", "crash", resume=True), num_nodes=3)
    whole = uninterrupted["ditto"]
    assert resumed["global_test_accuracy"] == whole["global_test_accuracy"]
    assert resumed["personal"] != whole["personal"]


# ---- the store on its own ------------------------------------------------------------------
def _store(tmp_path: Path, **node_config: Any) -> tuple[StateStore, Any]:
    config = _config(tmp_path, "ditto", "run")
    cfg = parse_run_config(config)
    node_config = {"partition-id": 1, "num-partitions": 3} | node_config
    node = local_node(node_config, data_layout(cfg))
    return StateStore.for_node(node_config, config, cfg, node), config


def _state(value: float) -> RecordDict:
    state = RecordDict()
    state["model"] = to_record({"w": np.full(3, value, np.float32)})
    state["history"] = ConfigRecord({"names": ["a", "b"], "score": [0.5, value]})
    return state


def test_a_train_message_of_round_r_continues_the_state_as_of_the_round_before(tmp_path) -> None:
    store, _ = _store(tmp_path)
    for server_round in (1, 3, 4):
        store.commit(_state(float(server_round)), server_round)
    names = sorted(p.name for p in store.folder.iterdir())
    assert names == [snapshot_name(3), snapshot_name(4)]  # the two newest (KEPT_SNAPSHOTS)
    assert len(names) == KEPT_SNAPSHOTS

    state = RecordDict()
    assert store.prepare(state, upto=3) == 3  # round 4 re-trained after a resume from 3
    assert from_record(state["model"])["w"].tolist() == [3.0, 3.0, 3.0]
    assert list(state.config_records["history"]["score"]) == [0.5, 3.0]
    assert store.prepare(state, upto=3) == 3  # memory now serves
    assert store.prepare(RecordDict(), upto=None) == 4  # evaluation: the newest
    assert store.prepare(RecordDict(), upto=2) == 0  # nothing that old: fresh

    store.commit(_state(5.0), 4)  # the re-trained round 4 replaces the lost one
    assert store.prepare(RecordDict(), upto=None) == 4
    store.commit(_state(5.0), 2)  # a resume further back drops the newer snapshots
    assert sorted(p.name for p in store.folder.iterdir()) == [snapshot_name(2)]


def test_the_state_folder_is_private_to_the_node_user(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, **{"state-dir": str(tmp_path / "elsewhere")})
    store.commit(_state(1.0), 1)
    assert store.folder == tmp_path / "elsewhere" / "run" / "partition-1"
    assert stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.folder / snapshot_name(1)).st_mode) == 0o600
    assert not [p for p in store.folder.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.parametrize(
    "spoil",
    [
        lambda path: path.write_bytes(path.read_bytes()[:100]),  # torn
        lambda path: path.write_bytes(b"not a zip at all"),
        lambda path: path.rename(path.with_name(snapshot_name(2))),  # round tag mismatch
    ],
)
def test_a_corrupt_snapshot_is_dropped_with_a_reason_and_the_state_starts_fresh(
    tmp_path: Path, spoil: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = _store(tmp_path)
    store.commit(_state(1.0), 1)
    spoil(store.folder / snapshot_name(1))
    state = RecordDict()
    assert store.prepare(state, upto=None) == 0
    assert "drops its node state" in caplog.text and "starts it fresh" in caplog.text
    assert list(state.keys()) == []
    assert not list(store.folder.glob("*.npz"))  # dropped, not met again


def test_a_snapshot_of_another_configuration_or_node_is_not_continued(tmp_path, caplog) -> None:
    store, config = _store(tmp_path)
    store.commit(_state(1.0), 1)
    cfg = parse_run_config(config | {"seed": 7})
    node_config = {"partition-id": 1, "num-partitions": 3}
    other = StateStore.for_node(
        node_config, config | {"seed": 7}, cfg, local_node(node_config, data_layout(cfg))
    )
    assert other.folder == store.folder
    assert other.prepare(RecordDict(), upto=None) == 0
    assert "written under another identity" in caplog.text


def test_a_snapshot_that_unpickles_is_refused(tmp_path: Path, caplog) -> None:
    store, _ = _store(tmp_path)
    store.commit(_state(1.0), 1)
    path = store.folder / snapshot_name(1)
    with np.load(path) as npz:
        entries = dict(npz)
    entries["a0"] = np.array([object()], dtype=object)
    np.savez(path, **entries)  # savez pickles object arrays
    assert store.prepare(RecordDict(), upto=None) == 0
    assert "drops its node state" in caplog.text


def test_a_run_without_run_name_keeps_its_state_in_memory_only(tmp_path: Path) -> None:
    config = _config(tmp_path, "ditto", "")
    cfg = parse_run_config(config)
    node = local_node({"partition-id": 0, "num-partitions": 3}, data_layout(cfg))
    store = StateStore.for_node({}, config, cfg, node)
    state = _state(1.0)
    store.commit(state, 1)
    assert store.folder is None and state.config_records[ROUND_KEY]["round"] == 1
    assert not list(tmp_path.rglob("*.npz"))
    assert "model" in state  # memory still holds it
