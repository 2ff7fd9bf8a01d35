"""HeteroFL: width slicing, count averaging with label-restricted classifier rows, masked
cross-entropy, the Scaler and static BN, and a federation over the in-process Grid."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from digits_runs import DIGITS_HETEROFL
from flwr.app import ConfigRecord
from local_grid import local_federation, run_config
from torch import nn

from fedapp.apps.server_app import run_experiment
from fedapp.methods.common.reply_validation import ValidReply
from fedapp.methods.heterofl.client import class_mask, masked_logits
from fedapp.methods.heterofl.keys import LABEL_MASK, WIDTH_KEY
from fedapp.methods.heterofl.server import HeteroFLStrategy, dynamic_widths
from fedapp.models.arch import load_supernet
from fedapp.models.slicing import leading_slice
from fedapp.models.width_scaling import WIDTHS, attach_scaler, width_model
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import run_context
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.wire.messages import NUM_EXAMPLES
from fedapp.wire.records import from_record, to_record


@pytest.fixture(scope="module")
def strategy() -> HeteroFLStrategy:
    cfg = parse_run_config(run_config(**DIGITS_HETEROFL, num_clients=4))
    return HeteroFLStrategy(run_context(cfg), NodeRegistry(cfg.num_clients))


def _profile(budget: float, partition: int = 0) -> NodeProfile:
    return NodeProfile(
        node_id=100 + partition,
        partition_id=partition,
        num_examples=10,
        num_partitions=4,
        budget=budget,
        device="cpu",
    )


def test_each_budget_trains_its_widest_affordable_width(strategy) -> None:
    macs = [strategy.costs[r].macs for r in WIDTHS]
    assert macs == [23_861, 72_312, 273_576, 1_029_424, 4_103_264]
    assert strategy.width_of(_profile(72_312)) == 1 / 8
    assert strategy.width_of(_profile(1_029_423)) == 1 / 4
    assert strategy.width_of(_profile(1e9)) == 1.0
    assert strategy.eligible(_profile(23_860)) is False  # below 1/16: left out


@pytest.mark.parametrize("rate", WIDTHS)
def test_a_clients_tensors_are_the_global_leading_slices_of_its_width(strategy, rate) -> None:
    state = strategy.initial_state()
    payload = strategy.train_payload(_profile(strategy.costs[rate].macs), state)
    stem, last = int(np.ceil(22 * rate)), int(np.ceil(176 * rate))  # ceil per layer
    assert payload["stem.conv.weight"].shape == (stem, 1, 3, 3)
    assert payload["stages.3.1.conv2.weight"].shape == (last, last, 3, 3)
    assert payload["head.weight"].shape == (10, last)  # every class row
    assert not any("running" in k or "num_batches" in k for k in payload)  # static BN
    for name, tensor in payload.items():
        np.testing.assert_array_equal(tensor, state[name][leading_slice(tensor.shape)])
    # exactly what the client's model holds
    local = width_model(strategy.config, rate).state_dict()
    assert {k: tuple(v.shape) for k, v in local.items()} == {k: v.shape for k, v in payload.items()}


def test_count_averaging_overlaps_label_rows_and_keeps_untouched_positions(strategy) -> None:
    old = {
        "conv.weight": np.full((4, 2), 10.0, np.float32),
        "head.weight": np.full((3, 4), 10.0, np.float32),
        "head.bias": np.full(3, 10.0, np.float32),
    }

    def reply(node: int, value: float, conv, head_in: int, classes, examples: int) -> ValidReply:
        arrays = {
            "conv.weight": np.full(conv, value, np.float32),
            "head.weight": np.full((3, head_in), value, np.float32),
            "head.bias": np.full(3, value, np.float32),
            LABEL_MASK: np.isin(np.arange(3), classes).astype(np.float32),
        }
        return ValidReply(node, arrays, {NUM_EXAMPLES: examples})

    narrow = reply(1, 1.0, (2, 1), 2, [0, 1], examples=10)
    wide = reply(2, 3.0, (3, 2), 4, [1, 2], examples=1000)  # unweighted: examples do not count
    new = strategy.aggregate(1, [narrow, wide], old)
    np.testing.assert_array_equal(
        new["conv.weight"], [[2, 3], [2, 3], [3, 3], [10, 10]]
    )  # overlap averaged 1:1, wide-only 3, row 3 untouched
    np.testing.assert_array_equal(
        new["head.weight"],
        [[1, 1, 10, 10], [2, 2, 3, 3], [3, 3, 3, 3]],
    )  # class 0 only from narrow, class 2 only from wide, class 1 from both where they overlap
    np.testing.assert_array_equal(new["head.bias"], [1, 2, 3])


def test_masked_cross_entropy_zeroes_absent_logits_and_their_gradients() -> None:
    config = load_supernet("resnet18-small", image_size=8)
    model = width_model(config, 0.25).train()
    present = class_mask(np.array([3, 1, 3]), 10)
    assert present.nonzero().flatten().tolist() == [1, 3]
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([1, 3, 3, 1, 1, 3])
    logits = model(x)
    masked = masked_logits(logits, present)
    assert torch.all(masked[:, ~present] == 0) and torch.equal(
        masked[:, present], logits[:, present]
    )
    loss = F.cross_entropy(masked, y)
    by_hand = torch.logsumexp(masked, 1) - masked[torch.arange(6), y]
    assert torch.isclose(loss, by_hand.mean())
    loss.backward()
    grad = model.head.weight.grad
    assert torch.all(grad[~present] == 0) and torch.all(grad[present].abs().sum(1) > 0)


def test_scaler_divides_conv_outputs_in_training_only() -> None:
    conv = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1, bias=False))
    attach_scaler(conv, 0.25)
    x = torch.randn(2, 1, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(conv.train()(x), conv.eval()(x) / 0.25)
        plain = F.conv2d(x, conv[0].weight, padding=1)
        torch.testing.assert_close(conv.eval()(x), plain)
    with pytest.raises(ValueError, match="rate"):
        attach_scaler(conv, 1.5)


def test_static_bn_keeps_no_statistics_and_normalises_by_the_batch() -> None:
    model = width_model(load_supernet("resnet18-small", image_size=8), 0.5)
    assert not any("running" in k or "num_batches" in k for k in model.state_dict())
    bn = model.stem.bn
    x = torch.randn(4, bn.num_features, 3, 3) * 5 + 2
    out = bn.eval()(x)  # eval too: batch statistics, none stored
    torch.testing.assert_close(
        out.mean(dim=(0, 2, 3)), torch.zeros(bn.num_features), atol=1e-5, rtol=0
    )


def test_two_round_federation_reports_every_width(tmp_path) -> None:
    overrides = DIGITS_HETEROFL | {
        "budget_min": 1e4,  # budgets 1e4 (no width: left out), 0.076M, 0.89M, 4.4M
        "zipf_s": 2.0,
        "gamma": 0.0,  # equal data shares: the 1e4 client still holds a shard
        "num_clients": 4,
        "fraction_train": 1.0,
        "num_server_rounds": 2,
        "eval_every": 2,
        "out_dir": str(tmp_path),
        "run_name": "heterofl",
    }
    config = run_config(**overrides)
    cfg, grid, nodes, strategy = local_federation(config, num_nodes=4)
    initial = strategy.initial_state()
    messages = list(strategy.configure_train(1, to_record(initial), ConfigRecord(), grid))
    for m in messages:  # each node gets its width, and exactly that width's slices
        profile = nodes.profiles[m.metadata.dst_node_id]
        rate = strategy.width_of(profile)
        assert m.content["config"][WIDTH_KEY] == rate
        sent = from_record(m.content["arrays"])
        assert {k: v.shape for k, v in sent.items()} == strategy.shapes[rate]
    left_out = [p for p in nodes.profiles.values() if strategy.width_of(p) is None]
    assert left_out and len(messages) == 4 - len(left_out)
    arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert strategy.report.accepted == len(messages) and metrics["train-loss"] > 0
    new = from_record(arrays)
    np.testing.assert_array_equal(new["stem.bn.running_mean"], initial["stem.bn.running_mean"])

    summary = run_experiment(grid, cfg)
    assert [v["index"] for v in summary["variants"]] == [0, 1, 2, 3, 4]
    trained = {  # the widths some accepted client trained, from what the server sent
        WIDTHS.index(m.content["config"][WIDTH_KEY])
        for m in grid.sent
        if m.metadata.message_type == "train"
    }
    assert [v["trained"] for v in summary["variants"]] == [i in trained for i in range(5)]
    assert 0 not in trained and trained  # no budget in (1/16, 1/8): 1/16 is nobody's own model
    assert [v["macs"] for v in summary["variants"]] == [strategy.costs[r].macs for r in WIDTHS]
    assert summary["clients_left_out"] == len(left_out)
    assert sum(summary["clients_by_width"].values()) == 4 - len(left_out)
    served = {row["partition"]: row["variant"] for row in summary["population"]}
    # a node that affords no width is served the narrowest trained one (minimum-tier fallback)
    assert len(served) == 4 and all(served[p.partition_id] == min(trained) for p in left_out)
    assert 0 <= summary["population_accuracy"] <= 1 and summary["compute_proxy_total_macs"] > 0
    assert summary["comm"]["client_reduction_max"] >= summary["comm"]["client_reduction_mean"] >= 1
    files = {p.name for p in (tmp_path / "heterofl").iterdir()}
    assert {"variants.csv", "population.csv", "communication.csv", "accuracy_vs_macs.png"} <= files
    assert (
        json.loads((tmp_path / "heterofl" / "summary.json").read_text())["strategy"] == "heterofl"
    )


def test_proportion_assignment_trains_every_width(tmp_path) -> None:
    overrides = DIGITS_HETEROFL | {
        "heterofl__assignment": "proportion",
        "gamma": 0.0,  # equal data shares: budgets of 3e4 would get too few examples
        "num_clients": 5,
        "fraction_train": 1.0,
        "num_server_rounds": 1,
        "eval_every": 1,
        "out_dir": str(tmp_path),
        "run_name": "heterofl",
    }
    cfg, grid, nodes, strategy = local_federation(run_config(**overrides), num_nodes=5)
    widths = {p.partition_id: strategy.width_of(p) for p in nodes.profiles.values()}
    assert sorted(widths.values()) == sorted(WIDTHS)  # one client per width (n // 5 = 1)
    by_budget = sorted(nodes.profiles.values(), key=lambda p: -p.budget)
    assert [widths[p.partition_id] for p in by_budget] == list(WIDTHS[::-1])  # widest: richest
    summary = run_experiment(grid, cfg)
    assert all(v["trained"] for v in summary["variants"])
    assert summary["clients_by_width"] == {f"{r:g}": 1 for r in WIDTHS}
    assert summary["clients_above_budget"] == sum(
        strategy.costs[widths[p.partition_id]].macs > p.budget for p in nodes.profiles.values()
    )
    with pytest.raises(ConfigError, match=r"'heterofl\.assignment' = 'random'"):
        parse_run_config(run_config(heterofl__assignment="random"))


def test_dynamic_assignment_redraws_widths_each_round_and_counts_client_rounds(tmp_path) -> None:
    overrides = DIGITS_HETEROFL | {
        "heterofl__assignment": "dynamic",
        "gamma": 0.0,  # equal data shares: budgets of 3e4 would get too few examples
        "num_clients": 5,
        "fraction_train": 1.0,
        "num_server_rounds": 2,
        "eval_every": 2,
        "out_dir": str(tmp_path),
        "run_name": "heterofl",
    }
    cfg, grid, nodes, strategy = local_federation(run_config(**overrides), num_nodes=5)
    draws = [dynamic_widths(cfg.seed, r, 5) for r in (1, 2)]
    assert draws[0] != draws[1]  # drawn anew each round ...
    assert draws[0] == dynamic_widths(cfg.seed, 1, 5)  # ... and fixed by the seed
    summary = run_experiment(grid, cfg)
    drawn = [rate for draw in draws for rate in draw.values()]
    assert summary["client_rounds_by_width"] == {f"{r:g}": drawn.count(r) for r in WIDTHS}
    assert [v["trained"] for v in summary["variants"]] == [r in drawn for r in WIDTHS]
    budgets = {p.partition_id: p.budget for p in nodes.profiles.values()}
    assert summary["client_rounds_above_budget"] == sum(
        strategy.costs[rate].macs > budgets[pid] for draw in draws for pid, rate in draw.items()
    )
