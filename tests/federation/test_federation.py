"""FedAvg through the real ServerApp and ClientApp over an in-process Grid (no Ray).

Covers the handshake, seeded cohorts, reply validation (a bad reply is dropped, never averaged
in), a node vanishing mid-round, determinism, and the files a run writes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, MessageType
from local_grid import (
    FIRST_NODE_ID,
    LocalGrid,
    PowerCut,
    crash_in_round,
    local_federation,
    preset_overrides,
    run_config,
    run_local,
    server_context,
)

from fedapp.apps.client_app import app as client_app
from fedapp.apps.server_app import RunRejected, run_experiment
from fedapp.apps.server_app import app as server_app
from fedapp.methods.common.reply_validation import spec_of
from fedapp.models.slicing import SliceAccumulator
from fedapp.run.config import parse_run_config
from fedapp.run.context import data_layout
from fedapp.run.federated_data import client_budgets, client_shard

FAST = preset_overrides("fedavg-digits") | {"num_server_rounds": 2}


def _config(tmp_path, **overrides: Any) -> dict[str, Any]:
    return run_config(**(FAST | {"out_dir": str(tmp_path), "run_name": "run"} | overrides))


def test_fedavg_runs_and_writes_every_output(tmp_path) -> None:
    config = _config(tmp_path, num_clients=4, fraction_train=0.5)
    grid = LocalGrid(client_app, config, num_nodes=4)
    server_app(grid=grid, context=server_context(config))

    run_dir = tmp_path / "run"
    names = {p.name for p in run_dir.iterdir()}
    assert {
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "accuracy.png",
        "model_final.pt",
        "model_best.pt",
    } <= names
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["clients-sampled"] == 2 and r["clients-accepted"] == 2 for r in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["test_accuracy"] <= 1.0 and summary["nodes"] == 4
    timing = summary["timing"]
    assert timing["client_training_seconds_sum"] > 0 and timing["train_phase_seconds"] > 0
    assert timing["rounds_seconds"] <= summary["wall_seconds"]
    assert json.loads((run_dir / "config.json").read_text())["dataset"] == "digits"
    # one QUERY per node, then 2 TRAIN messages per round
    types = [m.metadata.message_type for m in grid.sent]
    assert types.count(MessageType.QUERY) == 4 and types.count(MessageType.TRAIN) == 4


def test_handshake_reports_partition_examples_and_budget(tmp_path) -> None:
    config = _config(tmp_path, num_clients=3, num_server_rounds=1)
    node_configs = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    node_configs[2]["budget"] = 123e6  # a device's own budget wins over the seeded draw
    grid = LocalGrid(client_app, config, num_nodes=3, node_configs=node_configs)
    cfg = parse_run_config(config)
    from fedapp.run.profiles import NodeRegistry

    nodes = NodeRegistry(cfg.num_clients)
    nodes.wait_for(grid, 3, timeout=5)
    by_partition = {p.partition_id: p for p in nodes.profiles.values()}
    budgets = client_budgets(data_layout(cfg).budgets)
    assert by_partition[0].budget == budgets[0] and by_partition[1].budget == budgets[1]
    assert by_partition[2].budget == 123e6
    assert all(
        p.num_examples == len(client_shard(data_layout(cfg), i).labels)
        for i, p in by_partition.items()
    )


def test_mismatched_population_stops_before_training(tmp_path, caplog) -> None:
    config = _config(tmp_path, num_clients=3)
    grid = LocalGrid(client_app, config, num_nodes=2)  # nodes say num-partitions = 2
    with pytest.raises(RunRejected):
        server_app(grid=grid, context=server_context(config))
    assert "num-supernodes=3" in caplog.text
    assert not any(m.metadata.message_type == MessageType.TRAIN for m in grid.sent)


def test_invalid_config_stops_before_anything_is_sent(tmp_path, caplog) -> None:
    config = _config(tmp_path, gamma=-1.0)
    grid = LocalGrid(client_app, config, num_nodes=2)
    with pytest.raises(RunRejected):
        server_app(grid=grid, context=server_context(config))
    assert "'gamma' = -1.0 is not allowed" in caplog.text
    assert grid.sent == [] and not (tmp_path / "run").exists()


def _nan(reply):
    name = next(iter(reply.content["arrays"]))
    bad = reply.content["arrays"][name].numpy().copy()
    bad.flat[0] = np.nan
    reply.content["arrays"][name] = Array(bad)
    return reply


def _reshape(reply):
    name = next(k for k, v in reply.content["arrays"].items() if len(v.shape) == 4)
    reply.content["arrays"][name] = Array(np.zeros((1, 1, 1, 1), np.float32))
    return reply


def _retype(reply):
    name = next(iter(reply.content["arrays"]))
    reply.content["arrays"][name] = Array(reply.content["arrays"][name].numpy().astype(np.float64))
    return reply


def _drop_key(reply):
    del reply.content["arrays"][next(iter(reply.content["arrays"]))]
    return reply


def _zero_examples(reply):
    reply.content["metrics"]["num-examples"] = 0
    return reply


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (_nan, "non-finite"),
        (_reshape, "expected float32"),
        (_retype, "got float64"),
        (_drop_key, "wrong keys"),
        (_zero_examples, "num-examples"),
        (lambda reply: None, "no reply"),
    ],
)
def test_bad_reply_is_dropped_and_the_rest_averaged(tmp_path, corrupt, reason) -> None:
    config = _config(tmp_path, num_clients=3, fraction_train=1.0, num_server_rounds=1)
    good: dict[int, Any] = {}

    def capture(index, reply):
        good[index] = (
            {k: v.numpy().copy() for k, v in reply.content["arrays"].items()},
            int(reply.content["metrics"]["num-examples"]),
        )
        return reply

    _, grid, _, strategy = local_federation(
        config, num_nodes=3, reply_hooks={0: capture, 1: lambda i, r: corrupt(r), 2: capture}
    )
    initial = strategy.initial_state()
    from flwr.app import ConfigRecord

    from fedapp.wire.records import from_record, to_record

    replies = grid.send_and_receive(
        strategy.configure_train(1, to_record(initial), ConfigRecord(), grid)
    )
    arrays, metrics = strategy.aggregate_train(1, replies)

    assert strategy.report.accepted == 2 and len(strategy.report.dropped) == 1
    assert reason in next(iter(strategy.report.dropped.values()))
    expected = SliceAccumulator(initial)
    for state, weight in good.values():
        expected.add(state, weight)
    result = from_record(arrays)
    for name, value in expected.result().items():
        np.testing.assert_allclose(result[name], value, rtol=1e-6, atol=1e-7)
    assert metrics["num-examples"] == sum(w for _, w in good.values())
    assert spec_of(result) == spec_of(initial)


def test_same_seed_same_cohorts_and_model(tmp_path) -> None:
    def final_state(name: str, seed: int) -> tuple[list[list[int]], dict[str, np.ndarray]]:
        config = _config(tmp_path, num_clients=4, fraction_train=0.5, seed=seed, run_name=name)
        _, grid = run_local(config, num_nodes=4)
        import torch

        state = torch.load(tmp_path / name / "model_final.pt", weights_only=True)
        cohorts = [
            sorted(
                m.metadata.dst_node_id
                for m in grid.sent
                if m.metadata.message_type == MessageType.TRAIN and m.metadata.group_id == str(r)
            )
            for r in (1, 2)
        ]
        return cohorts, {k: v.numpy() for k, v in state.items()}

    cohorts_a, state_a = final_state("a", seed=1)
    cohorts_b, state_b = final_state("b", seed=1)
    _, state_c = final_state("c", seed=2)
    assert cohorts_a == cohorts_b
    assert all(np.array_equal(state_a[k], state_b[k]) for k in state_a)
    assert any(not np.array_equal(state_a[k], state_c[k]) for k in state_a)


def test_each_round_pushes_its_heaviest_clients_first(tmp_path) -> None:
    """Examples x payload parameters, descending (the payloads differ by budget under FEAST)."""
    shrunk_quickstart = preset_overrides("quickstart") | {
        "dataset": "digits",
        "feast_space__variant_cache": "feast-small-digits",
        "budget_min": 2e5,
        "budget_max": 6e6,
        "allocation_cap": 4.2e6,
        "num_clients": 4,
        "fraction_train": 1.0,
        "num_server_rounds": 2,
        "local_epochs": 1,
        "calibration_size": 50,
        "validation_size": 200,
        "test_size": 300,
    }
    config = _config(tmp_path, **shrunk_quickstart)
    cfg = parse_run_config(config)
    _, grid = run_local(config, num_nodes=4)
    for server_round in ("1", "2"):
        sent = [
            m
            for m in grid.sent
            if m.metadata.message_type == MessageType.TRAIN and m.metadata.group_id == server_round
        ]
        work = [
            len(client_shard(data_layout(cfg), m.metadata.dst_node_id - FIRST_NODE_ID).labels)
            * sum(int(np.prod(a.shape)) for a in m.content.array_records["arrays"].values())
            for m in sent
        ]
        assert len(sent) == 4 and work == sorted(work, reverse=True)


def test_node_that_joins_later_is_profiled_when_first_seen(tmp_path) -> None:
    from flwr.app import ConfigRecord, Context, RecordDict

    from fedapp.wire.records import to_record

    config = _config(tmp_path, num_clients=3, fraction_train=1.0, min_train_clients=3)
    _, grid, nodes, strategy = local_federation(config, num_nodes=3)
    state = to_record(strategy.initial_state())
    strategy.aggregate_train(
        1, grid.send_and_receive(strategy.configure_train(1, state, ConfigRecord(), grid))
    )

    # partition 2's device reconnects under a new node id
    old_id, new_id = grid.node_ids[2], 9999
    grid.node_ids[2] = new_id
    grid.contexts[new_id] = Context(
        run_id=1,
        node_id=new_id,
        state=RecordDict(),
        node_config=grid.contexts[old_id].node_config,
        run_config=config,
    )
    sent_before = len(grid.sent)
    messages = list(strategy.configure_train(2, state, ConfigRecord(), grid))
    queries = [m for m in grid.sent[sent_before:] if m.metadata.message_type == MessageType.QUERY]
    assert [m.metadata.dst_node_id for m in queries] == [new_id]
    assert nodes.profiles[new_id].partition_id == 2
    assert new_id in {m.metadata.dst_node_id for m in messages}


def test_resume_after_a_crash_continues_without_lost_or_repeated_rounds(tmp_path) -> None:
    import torch

    base = {"num_clients": 3, "num_server_rounds": 4}
    config = _config(tmp_path, run_name="crashy", **base)
    server_context(config)
    # on every node: whichever of them round 3's cohort draws, its first reply cuts the run
    hooks = dict.fromkeys(range(3), crash_in_round(3))
    grid = LocalGrid(client_app, config, num_nodes=3, reply_hooks=hooks)
    with pytest.raises(PowerCut, match="server lost in round 3"):
        run_experiment(grid, parse_run_config(config))
    assert (tmp_path / "crashy" / "metrics.jsonl").read_text().count("\n") == 2

    resumed = _config(tmp_path, run_name="crashy", resume=True, **base)
    summary = run_experiment(LocalGrid(client_app, resumed, num_nodes=3), parse_run_config(resumed))
    rows = [json.loads(x) for x in (tmp_path / "crashy" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and summary["resumed_from_round"] == 2

    straight = _config(tmp_path, run_name="straight", **base)
    run_experiment(LocalGrid(client_app, straight, num_nodes=3), parse_run_config(straight))
    a = torch.load(tmp_path / "crashy" / "model_final.pt", weights_only=True)
    b = torch.load(tmp_path / "straight" / "model_final.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_split_that_does_not_fit_the_data_is_a_config_error(tmp_path) -> None:
    from fedapp.run.config import ConfigError
    from fedapp.run.federated_data import population

    cfg = parse_run_config(_config(tmp_path, validation_size=5000))
    with pytest.raises(ConfigError, match="cannot split 'digits'"):
        population(data_layout(cfg))
