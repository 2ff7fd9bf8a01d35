"""FIARSE: magnitude top-k masks, the threshold-controlled biased gradient, sparse delta
aggregation, and a two-round federation on real digits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from local_grid import local_federation, run_config
from torch import nn
from torch.func import functional_call

from fedapp.config import ConfigError, parse_run_config
from fedapp.federated_data import population
from fedapp.models.counter import count
from fedapp.models.masks import (
    MaskFamily,
    apply_mask,
    full_model,
    mac_fraction,
    masked_names,
    masked_parameters,
    masked_weight,
    value_costs,
)
from fedapp.records import from_record
from fedapp.run_models import substrate_config
from fedapp.server_app import run_experiment
from fedapp.strategies.fiarse import mac_levels, sparse_delta_average


class Tiny(nn.Module):
    """conv (no bias) -> BN -> global pool -> linear (with bias), on 1x5x5 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).mean(dim=(2, 3)))


def test_masked_tensors_are_conv_and_linear_parameters_never_bn() -> None:
    model = Tiny()
    assert masked_names(model) == ["conv.weight", "fc.weight", "fc.bias"]
    costs = value_costs(model, torch.zeros(1, 1, 5, 5))
    # A conv weight value runs once per output position (5x5), a linear weight once, a bias never.
    assert costs == {"conv.weight": 25, "fc.weight": 1, "fc.bias": 0}
    assert model.training  # the probe pass leaves the mode as it was


def _hand_state() -> dict[str, np.ndarray]:
    return {
        "a": np.array([0.9, -0.1, 0.5, 0.3], np.float32),  # cost 10 per value
        "b": np.array([[0.8, -0.4], [0.2, 0.05]], np.float32),  # cost 1 per value
        "bias": np.array([0.6], np.float32),  # cost 0
        "bn": np.array([0.01, 5.0], np.float32),  # not masked
    }


def test_top_k_is_global_over_layers_and_capped_by_mac_level() -> None:
    state = _hand_state()
    family = MaskFamily.of(state, {"a": 10, "b": 1, "bias": 0})
    assert family.full_macs == 4 * 10 + 4 * 1
    # Descending: .9(a,10) .8(b,1) .6(bias,0) .5(a,10) .4(b,1) .3(a,10) .2(b,1) .1(a,10) .05(b,1)
    # cumulative:   10      11      11        21      22      32      33      43      44
    assert family.threshold(21) == pytest.approx(0.5)
    assert family.kept_counts(0.5) == {"a": 2, "b": 1, "bias": 1}
    assert family.effective_macs(0.5) == 21
    assert family.threshold(20.9) == pytest.approx(0.6)  # 0.5 would exceed the level
    assert family.effective_macs(family.threshold(20.9)) == 11
    assert family.threshold(9) == float("inf")  # not even the largest value fits
    assert family.kept_values(family.threshold(1e9)) == 9  # everything
    assert family.effective_macs(family.threshold(44)) == 44
    masked = apply_mask(state, ["a", "b", "bias"], 0.5)
    np.testing.assert_array_equal(masked["a"], np.float32([0.9, 0, 0.5, 0]))
    np.testing.assert_array_equal(masked["b"], np.float32([[0.8, 0], [0, 0]]))
    np.testing.assert_array_equal(masked["bn"], state["bn"])  # BN untouched


def test_a_tie_at_the_cut_is_dropped_whole() -> None:
    state = {"w": np.array([0.7, 0.4, 0.4, 0.1], np.float32)}
    family = MaskFamily.of(state, {"w": 1})
    # Level 2 reaches one of the two 0.4s; |w| >= 0.4 would keep both (3 MACs): keep only 0.7.
    assert family.threshold(2) == pytest.approx(0.7)
    assert family.threshold(3) == pytest.approx(0.4)


def test_kept_fraction_follows_the_budget_in_macs() -> None:
    assert mac_fraction(25, 100) == 0.25
    assert mac_fraction(250, 100) == 1.0  # capped
    rng = np.random.default_rng(0)
    state = {"a": rng.normal(size=400).astype(np.float32), "b": rng.normal(size=100)}
    family = MaskFamily.of(state, {"a": 3, "b": 1})
    for budget in (50, 300, 700, 1299, 5000):
        t = family.threshold_for_budget(budget)
        level = mac_fraction(budget, family.full_macs) * family.full_macs
        assert family.effective_macs(t) <= level
        # Keeping one more value (the next largest) would exceed the level (or nothing is left).
        nxt = family.descending[family.descending < t]
        if len(nxt):
            assert family.effective_macs(float(nxt[0])) > level


def test_biased_gradient_on_kept_weights_and_zero_on_masked() -> None:
    t = 0.5
    w = torch.tensor([0.5, 1.0, 0.2, -2.0, -0.5], requires_grad=True)
    c = torch.tensor([1.0, 2.0, 3.0, -1.0, 4.0])
    effective = masked_weight(w, t)
    np.testing.assert_allclose(effective.detach(), [0.5, 1.0, 0.0, -2.0, -0.5])
    (effective * c).sum().backward()
    # dL/dw = c * (1 + 2t|w| / (|w| + t)^2) where |w| >= t, else 0.
    expected = [
        1.0 * 1.5,  # at the threshold: 1 + 2*.5*.5/1 = 1.5
        2.0 * (1 + 2 * 0.5 * 1.0 / 1.5**2),
        0.0,  # masked: no straight-through gradient
        -1.0 * (1 + 2 * 0.5 * 2.0 / 2.5**2),  # sign of w does not flip the factor
        4.0 * 1.5,
    ]
    np.testing.assert_allclose(w.grad, expected, rtol=1e-6)


def test_zero_threshold_gives_the_plain_gradient() -> None:
    w = torch.tensor([0.0, 0.3, -1.2], requires_grad=True)
    (masked_weight(w, 0.0) * torch.tensor([2.0, 3.0, 5.0])).sum().backward()
    np.testing.assert_allclose(w.grad, [2.0, 3.0, 5.0])  # 0/0 at w = 0 is zeroed, not nan


def test_sparse_delta_average_over_the_clients_that_changed_each_position() -> None:
    old = {
        "w": np.array([1.0, 1.0, 1.0, 1.0], np.float32),
        "bn.num_batches_tracked": np.array(7, np.int64),
    }
    deltas = [
        {"w": np.float32([0.2, 0.0, -0.4, 0.0]), "bn.num_batches_tracked": np.array(3)},
        {"w": np.float32([0.4, 0.6, 0.0, 0.0]), "bn.num_batches_tracked": np.array(3)},
    ]
    new = sparse_delta_average(old, deltas)
    # position 0: both changed it -> +0.3; 1 and 2: one client each -> its delta (not halved);
    # 3: nobody -> unchanged. Step counters keep their value.
    np.testing.assert_allclose(new["w"], [1.3, 1.6, 0.6, 1.0], rtol=1e-6)
    assert new["w"].dtype == np.float32
    assert int(new["bn.num_batches_tracked"]) == 7


def test_mac_levels_span_smallest_budget_to_full_model() -> None:
    assert mac_levels(10, 100, 4) == [10.0, 40.0, 70.0, 100.0]
    assert mac_levels(500, 100, 4) == [100.0]  # a budget above the full model is capped


DIGITS_FIARSE = {
    "strategy": "fiarse",
    "dataset": "digits",
    "partitioner": "iid",
    "budget_min": 2e5,
    "budget_max": 6e6,
    "validation_size": 100,
    "test_size": 200,
    "calibration_size": 32,
    "batch_size": 32,
    "local_epochs": 1,
    "fiarse_grid_points": 3,
    "eval_every": 2,
}


def test_effective_macs_of_the_full_model_equal_the_analytic_count() -> None:
    cfg = parse_run_config(run_config(**DIGITS_FIARSE))
    info = population(cfg).info
    config = substrate_config(cfg, info)
    model = full_model(config)
    costs = value_costs(model, torch.zeros(1, info.channels, info.image_size, info.image_size))
    family = MaskFamily.of({k: v.numpy() for k, v in model.state_dict().items()}, costs)
    assert family.full_macs == count(config, config.max_arch()).macs
    assert not any(".bn" in name for name in costs)


def test_two_round_federation_on_digits(tmp_path) -> None:
    config = run_config(
        **(
            DIGITS_FIARSE
            | {
                "num_clients": 3,
                "fraction_train": 1.0,
                "num_server_rounds": 2,
                "out_dir": str(tmp_path),
                "run_name": "fiarse",
            }
        )
    )
    cfg, grid, nodes, strategy = local_federation(config, num_nodes=3)
    initial = strategy.initial_state()
    messages = strategy.configure_round(1, initial, grid)
    family = strategy.family(initial)
    for m in messages:  # each node received the global model with its top-k kept, zeros elsewhere
        budget = nodes.profiles[m.metadata.dst_node_id].budget
        threshold = float(m.content["config"]["mask-threshold"])
        assert threshold == family.threshold_for_budget(budget)
        assert family.effective_macs(threshold) <= budget
        sent = from_record(m.content["arrays"])
        for name in strategy.masked:
            kept = np.abs(initial[name]) >= threshold
            np.testing.assert_array_equal(sent[name][kept], initial[name][kept])
            assert not sent[name][~kept].any()
    new, _ = strategy.aggregate_round(1, grid.send_and_receive(messages))
    assert strategy.report.accepted == 3
    smallest = min(strategy._thresholds.values())
    for name in strategy.masked:  # values no client kept were not changed by anyone
        untouched = np.abs(initial[name]) < smallest
        np.testing.assert_array_equal(new[name][untouched], initial[name][untouched])
    budgets = {p.partition_id: p.budget for p in nodes.profiles.values()}
    for row in strategy.ledger.client_rounds:  # the ledger counts kept values, not dense zeros
        affords_all = budgets[row["partition"]] >= family.full_macs
        assert (row["params"] == strategy.full_params) == affords_all
        assert row["params"] <= strategy.full_params

    summary = run_experiment(grid, cfg)
    assert len(summary["variants"]) == 3
    macs = [v["macs"] for v in summary["variants"]]
    assert macs == sorted(macs) and macs[-1] == strategy.family(initial).full_macs
    for key in ("population_accuracy", "comm", "compute_proxy_total_macs", "resources"):
        assert key in summary
    assert summary["compute_proxy_total_macs"] > 0
    for row in summary["population"]:  # served the largest grid point within its budget
        assert row["macs"] <= row["budget"]
    files = {p.name for p in (tmp_path / "fiarse").iterdir()}
    assert {"variants.csv", "population.csv", "communication.csv", "accuracy_vs_macs.png"} <= files
    assert json.loads((tmp_path / "fiarse" / "summary.json").read_text())["strategy"] == "fiarse"


def test_grid_size_below_two_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'fiarse-grid-points' = 1 is not allowed: must be >= 2"):
        parse_run_config(run_config(fiarse_grid_points=1))


def test_masked_values_stay_bit_identical_through_sgd_with_momentum() -> None:
    torch.manual_seed(0)
    model = Tiny()
    names = masked_names(model)
    threshold = float(model.conv.weight.detach().abs().median())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.0)
    for _ in range(3):
        x, y = torch.randn(8, 1, 5, 5), torch.randint(0, 3, (8,))
        logits = functional_call(model, masked_parameters(model, names, threshold), (x,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
    kept = before["conv.weight"].abs() >= threshold
    after = model.state_dict()
    assert torch.equal(after["conv.weight"][~kept], before["conv.weight"][~kept])
    assert not torch.equal(after["conv.weight"][kept], before["conv.weight"][kept])
    assert not torch.equal(after["bn.weight"], before["bn.weight"])  # BN trains unmasked
