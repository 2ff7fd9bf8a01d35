"""Ditto: the personal model's proximal step, personal models kept across rounds in node state,
and a two-round federation evaluating global and personal models."""

from __future__ import annotations

import csv
import json

import numpy as np
import torch
from digits_runs import DITTO_DIGITS
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from local_grid import run_config, run_local, server_context
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fedapp.methods.common.node_state import load_arrays
from fedapp.methods.ditto import client as ditto
from fedapp.methods.fedavg import client as fedavg
from fedapp.models.zoo import build_model, forward_macs
from fedapp.random_streams import Stream
from fedapp.run.config import parse_run_config
from fedapp.run.context import data_layout, run_context
from fedapp.run.federated_data import population
from fedapp.run.profiles import local_node
from fedapp.training.loops import seed_local_work, train_loader
from fedapp.wire.messages import ARRAYS, COMPUTE_METRIC, CONFIG, METRICS
from fedapp.wire.records import load_state, to_record

CPU = torch.device("cpu")


def test_one_proximal_step_equals_the_formula() -> None:
    # v = 0, so the logits are 0 and softmax is uniform: grad F(0) is known in closed form
    cfg = parse_run_config(
        run_config(
            strategy="ditto", momentum=0.0, weight_decay=0.0, local_epochs=1, ditto__lambda=0.5
        )
    )
    x = torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.5, 0.0, 1.0, 2.0]])
    y = torch.tensor([0, 2])
    personal = nn.Linear(4, 3)
    nn.init.zeros_(personal.weight)
    nn.init.zeros_(personal.bias)
    global_model = nn.Linear(4, 3)
    w, b = global_model.weight.detach().clone(), global_model.bias.detach().clone()
    lr = 0.1

    ditto.train_personal(
        personal,
        global_model,
        DataLoader(TensorDataset(x, y), batch_size=2),
        run_context(cfg),
        lr,
        CPU,
    )

    residual = torch.full((2, 3), 1 / 3) - nn.functional.one_hot(y, 3)  # softmax - one-hot
    grad_w, grad_b = residual.T @ x / 2, residual.mean(0)
    # v <- v - lr * (grad F(v) + lambda * (v - w)) with v = 0
    torch.testing.assert_close(personal.weight.detach(), -lr * (grad_w - 0.5 * w))
    torch.testing.assert_close(personal.bias.detach(), -lr * (grad_b - 0.5 * b))


def _train_message(state: dict[str, np.ndarray], server_round: int) -> Message:
    content = RecordDict(
        {
            ARRAYS: to_record(state),
            CONFIG: ConfigRecord({"server-round": server_round, "learning-rate": 0.05}),
        }
    )
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN)


def test_personal_model_is_kept_in_node_state_and_trained_from_there() -> None:
    config = run_config(**DITTO_DIGITS)
    server_context(config)
    cfg = parse_run_config(config)
    info = population(data_layout(cfg)).info
    node = local_node({"partition-id": 1, "num-partitions": 4}, data_layout(cfg))
    torch.manual_seed(0)
    global_state = {
        k: v.numpy().copy() for k, v in build_model(cfg.model, info).state_dict().items()
    }

    ditto.train(_train_message(global_state, 1), run_context(cfg), node)
    first = load_arrays(node.state, ditto.PERSONAL_KEY)
    assert first is not None and set(first) == set(global_state)
    assert any(not np.array_equal(first[k], global_state[k]) for k in first)

    reply = ditto.train(_train_message(global_state, 2), run_context(cfg), node)
    second = load_arrays(node.state, ditto.PERSONAL_KEY)
    # round 2 trained the kept model: replaying that from `first` gives exactly `second`
    replay, anchor = build_model(cfg.model, info), build_model(cfg.model, info)
    load_state(replay, first)
    load_state(anchor, global_state)
    generator = seed_local_work(cfg.seed, Stream.DITTO_PERSONAL, 2, 1)
    loader = train_loader(node.shard(data_layout(cfg)), info, cfg.batch_size, generator)
    ditto.train_personal(replay, anchor, loader, run_context(cfg), 0.05, CPU)
    for name, value in replay.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), second[name])
    # ... and only the global copy travels: the reply is not the personal model
    sent = {k: v.numpy() for k, v in reply[ARRAYS].items()}
    assert any(not np.array_equal(sent[k], second[k]) for k in sent)


def test_two_round_federation_reports_personal_and_global_accuracy(tmp_path) -> None:
    config = run_config(**(DITTO_DIGITS | {"out_dir": str(tmp_path), "run_name": "ditto"}))
    summary, grid = run_local(config, num_nodes=4)

    assert summary["personal_clients"] == 4 and len(summary["personal"]) == 4
    accuracies = [row["accuracy"] for row in summary["personal"]]
    assert summary["test_accuracy"] == np.mean(accuracies)
    assert 0 < summary["global_test_accuracy"] <= 1 and summary["comm"]["client_rounds"] == 8
    global_state = torch.load(tmp_path / "ditto" / "model_final.pt", weights_only=True)
    for context in grid.contexts.values():  # every node kept a personal model, not the global
        personal = load_arrays(context.state, ditto.PERSONAL_KEY)
        assert personal is not None
        assert any(not np.array_equal(personal[k], global_state[k].numpy()) for k in personal)
    rows = [
        json.loads(line) for line in (tmp_path / "ditto" / "metrics.jsonl").read_text().splitlines()
    ]
    assert all("val-personal-accuracy" in row and "val-accuracy" in row for row in rows)
    assert (tmp_path / "ditto" / "personal.csv").exists()
    # the accounting once: one row per accepted client-round, totals their sums
    with (tmp_path / "ditto" / "communication.csv").open() as f:
        ledger = list(csv.DictReader(f))
    assert len(ledger) == summary["comm"]["client_rounds"]
    assert summary["comm"]["bytes_down_total"] == sum(int(r["bytes_down"]) for r in ledger)


def test_fedavg_and_ditto_replies_carry_the_compute_proxy() -> None:
    """3 x forward MACs x examples trained; Ditto's personal model trains as much again."""
    config = run_config(**(DITTO_DIGITS | {"model": "cnn-small", "local_epochs": 2}))
    server_context(config)
    cfg = parse_run_config(config)
    info = population(data_layout(cfg)).info
    node = local_node({"partition-id": 0, "num-partitions": 4}, data_layout(cfg))
    torch.manual_seed(0)
    state = {k: v.numpy().copy() for k, v in build_model(cfg.model, info).state_dict().items()}
    # what one epoch's batches hold (a lone last image is left out)
    epoch = train_loader(node.shard(data_layout(cfg)), info, cfg.batch_size, torch.Generator())
    trained = sum(len(labels) for _, labels in epoch) * cfg.local_epochs
    expected = 3 * forward_macs(cfg.model, info) * trained

    fedavg_metrics = fedavg.train(_train_message(state, 1), run_context(cfg), node)[METRICS]
    ditto_metrics = ditto.train(_train_message(state, 1), run_context(cfg), node)[METRICS]

    assert forward_macs(cfg.model, info) > 0
    assert fedavg_metrics[COMPUTE_METRIC] == expected
    assert ditto_metrics[COMPUTE_METRIC] == 2 * expected
