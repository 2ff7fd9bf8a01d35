"""ScaleFL: depth-width levels with exits, the self-distillation loss, count-averaged aggregation
of levels, the minimum-level fallback, and a two-round federation on real digits."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from digits_runs import DIGITS_SCALEFL
from local_grid import run_config, run_local
from torch.utils.flop_counter import FlopCounterMode

from fedapp.methods.common.reply_validation import ValidReply
from fedapp.methods.common.strategy import build_strategy
from fedapp.methods.scalefl.client import kd_active, self_distillation_loss
from fedapp.models.arch import load_supernet
from fedapp.models.early_exits import (
    SCALEFL_LEVELS,
    EarlyExitResNet,
    affordable_level,
    level_cost,
    level_shapes,
)
from fedapp.models.slicing import fits
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.wire.messages import NUM_EXAMPLES

DIGITS = load_supernet("resnet18-small", image_size=8)


def _blocks(shapes: dict[str, tuple[int, ...]]) -> list[str]:
    return sorted({".".join(k.split(".")[:3]) for k in shapes if k.startswith("stages.")})


@pytest.mark.parametrize("convs", [0, 3])
def test_levels_keep_leading_blocks_at_their_width_with_one_exit_per_level(convs: int) -> None:
    full = level_shapes(DIGITS, SCALEFL_LEVELS, 3, convs)
    expected_blocks = [
        ["stages.0.0", "stages.0.1", "stages.1.0"],
        ["stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1"],
        ["stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1", "stages.2.0"],
        [f"stages.{s}.{b}" for s in range(4) for b in range(2)],
    ]
    x = torch.randn(2, 1, 8, 8)
    for level, blocks in enumerate(expected_blocks):
        model = EarlyExitResNet(DIGITS, SCALEFL_LEVELS, level, convs, seed=0).eval()
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        assert _blocks(shapes) == blocks
        heads = {k.split(".")[1] for k in shapes if k.startswith("exits.")}
        assert heads == {str(i) for i in range(min(level + 1, 3))}
        assert ("head.weight" in shapes) == (level == 3)
        width = SCALEFL_LEVELS[level].width
        assert shapes["stem.conv.weight"][0] == math.ceil(22 * width)
        assert all(fits(shape, full[name]) for name, shape in shapes.items())  # leading slices
        outputs = model.exit_logits(x)
        assert len(outputs) == level + 1
        assert all(o.shape == (2, 10) for o in outputs)
        torch.testing.assert_close(model(x), outputs[-1])  # serving runs the deepest exit
        # the analytic cost is what the model holds and computes (torch counts 2 FLOPs per MAC)
        cost = level_cost(DIGITS, SCALEFL_LEVELS, level, convs)
        assert cost.params == sum(p.numel() for p in model.parameters())
        with FlopCounterMode(display=False) as flops:
            model.exit_logits(x[:1])
        assert cost.macs == flops.get_total_flops() // 2
    if convs:
        assert full["exits.0.convs.2.weight"] == (44, 44, 3, 3)


def test_cifar_levels_match_the_feast_papers_scalefl() -> None:
    """11.27M parameters in all and a ~35M-MAC smallest level at 100 classes (Suppl. E)."""
    cifar = load_supernet("resnet18-cifar")
    costs = [level_cost(cifar, SCALEFL_LEVELS, i, 0) for i in range(4)]
    assert costs[-1].params == 11_220_132 + 2 * (128 * 100 + 100) + (256 * 100 + 100)
    assert round(costs[-1].params / 1e6, 2) == 11.27
    assert 35e6 < costs[0].macs < 36e6
    assert [c.macs for c in costs] == sorted(c.macs for c in costs)


def test_self_distillation_loss_on_hand_checkable_logits() -> None:
    y = torch.tensor([0])
    uniform = torch.zeros(1, 2)  # deepest exit: p = (1/2, 1/2)
    student = torch.tensor([[math.log(3.0), 0.0]])  # p = (3/4, 1/4)
    # gamma = 0: (1 * CE(student) + 2 * CE(teacher)) / 3
    plain = self_distillation_loss([student, uniform], y, y, 1.0, gamma=0.0, temperature=1.0)
    assert plain.item() == pytest.approx((math.log(4 / 3) + 2 * math.log(2)) / 3)
    # KL(teacher || student) summed = 0.5 ln(4/3); 'mean' over batch x classes halves it
    kd = self_distillation_loss([student, uniform], y, y, 1.0, gamma=0.5, temperature=1.0)
    kl = 0.25 * math.log(4 / 3)
    assert kd.item() == pytest.approx((math.log(4 / 3) + 0.5 * kl + 2 * math.log(2)) / 3)
    # temperature 2 softens both sides and multiplies the KL by T^2 = 4
    p = torch.softmax(student / 2, dim=1)[0]
    kl_t = 0.5 * float(sum(0.5 * math.log(0.5 / q) for q in p))
    soft = self_distillation_loss([student, uniform], y, y, 1.0, gamma=0.5, temperature=2.0)
    assert soft.item() == pytest.approx((math.log(4 / 3) + 0.5 * 4 * kl_t + 2 * math.log(2)) / 3)
    # three exits weigh 1, 2, 3 over 6; mixed labels weigh lam and 1 - lam
    z = [torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[0.0, math.log(3.0)]])]
    three = self_distillation_loss(z, y, torch.tensor([1]), 0.25, gamma=0.0, temperature=1.0)
    ce_last = 0.25 * math.log(4) + 0.75 * math.log(4 / 3)
    assert three.item() == pytest.approx((1 * math.log(2) + 2 * math.log(2) + 3 * ce_last) / 6)


def test_the_teacher_is_not_detached_and_kd_starts_after_a_quarter() -> None:
    y = torch.tensor([0, 1])
    student = torch.tensor([[2.0, -1.0], [0.5, 0.3]])
    grads = []
    for gamma in (0.0, 1.0):
        teacher = torch.tensor([[0.1, 0.4], [1.0, -2.0]], requires_grad=True)
        self_distillation_loss(
            [student, teacher], y, y, 1.0, gamma=gamma, temperature=3.0
        ).backward()
        grads.append(teacher.grad.clone())
    assert not torch.allclose(grads[0], grads[1])  # distillation also moves the deepest exit
    assert [kd_active(r, 8) for r in (1, 2, 3)] == [False, False, True]


def test_feast_form_is_batchmean_with_a_detached_teacher_from_round_one() -> None:
    y = torch.tensor([0])
    uniform = torch.zeros(1, 2)
    student = torch.tensor([[math.log(3.0), 0.0]])
    # batchmean sums the KL over the 2 classes: twice the official 'mean' here
    kl = 0.5 * math.log(4 / 3)
    feast = self_distillation_loss(
        [student, uniform], y, y, 1.0, gamma=0.5, temperature=1.0, form="feast"
    )
    assert feast.item() == pytest.approx((math.log(4 / 3) + 0.5 * kl + 2 * math.log(2)) / 3)
    grads = []
    for gamma in (0.0, 1.0):
        teacher = torch.tensor([[0.1, 0.4]], requires_grad=True)
        self_distillation_loss(
            [student, teacher], y, y, 1.0, gamma=gamma, temperature=3.0, form="feast"
        ).backward()
        grads.append(teacher.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])  # only the CE reaches the deepest exit
    assert [kd_active(r, 8, "feast") for r in (1, 2, 3)] == [True, True, True]
    with pytest.raises(ConfigError, match=r"'scalefl\.kd-form' = 'batchmean'"):
        parse_run_config(run_config(scalefl__kd_form="batchmean"))


def _strategy(budgets: list[float]):
    config = run_config(**DIGITS_SCALEFL)
    nodes = NodeRegistry(len(budgets))
    for i, budget in enumerate(budgets):
        nodes.profiles[100 + i] = NodeProfile(100 + i, i, len(budgets), 50, budget, "cpu")
    return build_strategy(parse_run_config(config), nodes)


def test_aggregation_averages_overlaps_by_count_and_keeps_what_nobody_held() -> None:
    strategy = _strategy([3e5, 6e5])
    assert [strategy.level_of(p) for p in strategy.nodes.profiles.values()] == [0, 1]
    old = strategy.initial_state()
    small, large = (strategy.train_payload(p, old) for p in strategy.nodes.profiles.values())
    replies = [
        ValidReply(100, {k: np.full_like(v, 1) for k, v in small.items()}, {NUM_EXAMPLES: 10}),
        ValidReply(101, {k: np.full_like(v, 3) for k, v in large.items()}, {NUM_EXAMPLES: 990}),
    ]
    new = strategy.aggregate(1, replies, old)
    assert new.keys() == old.keys()
    w = "stages.1.0.conv1.weight"  # both levels: overlap averaged 1:1 whatever the data sizes
    n_small, n_large = small[w].shape[0], large[w].shape[0]
    assert np.all(new[w][:n_small, : small[w].shape[1]] == 2)
    assert np.all(new[w][n_small:n_large, : large[w].shape[1]] == 3)  # only the wider level
    assert np.array_equal(new[w][n_large:], old[w][n_large:])  # nobody held these filters
    assert np.all(new["exits.0.fc.weight"][:, : small["exits.0.fc.weight"].shape[1]] == 2)
    assert np.all(new["exits.1.fc.weight"][:, : large["exits.1.fc.weight"].shape[1]] == 3)
    assert "stages.1.1.conv1.weight" not in small  # the block only level 2 reaches
    assert np.all(new["stages.1.1.conv1.weight"][:n_large, :n_large] == 3)
    for untouched in ("stages.2.0.conv1.weight", "exits.2.fc.weight", "head.weight"):
        assert np.array_equal(new[untouched], old[untouched])
    assert new["stem.bn.num_batches_tracked"] == old["stem.bn.num_batches_tracked"]


def test_clients_below_the_smallest_level_fall_back_to_it_and_are_counted() -> None:
    strategy = _strategy([1e5, 2.6e5, 2.7e5, 4.2e6])
    smallest = strategy.costs[0].macs
    assert affordable_level(strategy.costs, smallest - 1) == (0, True)
    assert affordable_level(strategy.costs, smallest) == (0, False)
    assert affordable_level(strategy.costs, 1e12) == (3, False)
    assert [strategy.level_of(p) for p in strategy.nodes.profiles.values()] == [0, 0, 0, 3]
    assert strategy.clients_below_smallest_level() == 2


def test_two_round_federation_on_digits(tmp_path) -> None:
    config = run_config(
        **(DIGITS_SCALEFL | {"num_server_rounds": 2, "out_dir": str(tmp_path), "run_name": "s"})
    )
    summary, _ = run_local(config, num_nodes=4)
    assert summary["clients_below_smallest_level"] == 1
    assert [v["index"] for v in summary["variants"]] == [0, 1, 2, 3]
    assert [v["macs"] for v in summary["variants"]] == sorted(
        v["macs"] for v in summary["variants"]
    )
    assert all(0 <= v["accuracy"] <= 1 for v in summary["variants"])
    assert sorted(c["variant"] for c in summary["population"]) == [0, 1, 3, 3]
    assert summary["test_accuracy"] == summary["variants"][-1]["accuracy"]
    assert summary["compute_proxy_total_macs"] > 0
    assert summary["comm"]["client_rounds"] == 8
    assert 0 <= summary["population_accuracy"] <= 1
    run_dir = tmp_path / "s"
    files = {p.name for p in run_dir.iterdir()}
    assert {"variants.csv", "population.csv", "communication.csv", "accuracy_vs_macs.png"} <= files
    written = json.loads((run_dir / "summary.json").read_text())
    assert written["strategy"] == "scalefl"
    assert written["clients_below_smallest_level"] == 1
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {"val-acc-level1", "val-acc-level4"} <= set(rounds[-1])
