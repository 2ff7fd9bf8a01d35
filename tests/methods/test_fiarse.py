"""FIARSE: magnitude top-k masks, the threshold-controlled biased gradient, sparse delta
aggregation, and a two-round federation on real digits."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest
import torch
from digits_runs import DIGITS_FIARSE
from local_grid import APP_DIR, local_federation, run_config
from torch import nn
from torch.func import functional_call

from fedapp.apps.server_app import run_experiment
from fedapp.data.registry import DatasetInfo
from fedapp.methods.fiarse.server import mac_levels, sparse_delta_average
from fedapp.methods.fiarse.settings import FiarseSettings
from fedapp.models.counter import count
from fedapp.models.masks import (
    MEASURES,
    TOPK_RULES,
    MaskFamily,
    apply_mask,
    classifier_names,
    full_model,
    mac_fraction,
    masked_names,
    masked_parameters,
    masked_weight,
    value_costs,
)
from fedapp.run.config import ConfigError, RunConfig, parse_run_config
from fedapp.run.context import data_layout, piece, run_context
from fedapp.run.federated_data import client_budgets, population
from fedapp.run.pieces import BudgetDraw
from fedapp.run.run_models import substrate_config
from fedapp.tools.compare import load_comparison
from fedapp.wire.records import from_record


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
        t = family.mask_for_budget(budget)["a"]
        assert set(family.mask_for_budget(budget).values()) == {t}  # global: one threshold
        level = mac_fraction(budget, family.full_macs) * family.full_macs
        assert family.effective_macs(t) <= level
        # Keeping one more value (the next largest) would exceed the level (or nothing is left).
        nxt = family.by_macs.descending[family.by_macs.descending < t]
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


def test_effective_macs_of_the_full_model_equal_the_analytic_count() -> None:
    cfg = parse_run_config(run_config(**DIGITS_FIARSE))
    info = population(data_layout(cfg)).info
    config = substrate_config(run_context(cfg).substrate, info)
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
        sent_thresholds = list(m.content["config"]["mask-thresholds"])
        thresholds = family.mask_for_budget(budget)
        assert sent_thresholds == [thresholds[n] for n in strategy.masked]
        assert family.effective_macs(thresholds) <= budget
        sent = from_record(m.content["arrays"])
        for name in strategy.masked:
            kept = np.abs(initial[name]) >= thresholds[name]
            np.testing.assert_array_equal(sent[name][kept], initial[name][kept])
            assert not sent[name][~kept].any()
    new, _ = strategy.aggregate_round(1, grid.send_and_receive(messages))
    assert strategy.report.accepted == 3
    for name in strategy.masked:  # values no client kept were not changed by anyone
        smallest = min(t[name] for t in strategy._thresholds.values())
        untouched = np.abs(initial[name]) < smallest
        np.testing.assert_array_equal(new[name][untouched], initial[name][untouched])
    budgets = {p.partition_id: p.budget for p in nodes.profiles.values()}
    # the ledger counts kept values, not dense zeros
    for row in strategy.accounting.ledger.client_rounds:
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
    with pytest.raises(
        ConfigError, match=r"'fiarse\.grid-points' = 1 is not allowed: must be >= 2"
    ):
        parse_run_config(run_config(fiarse__grid_points=1))


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


# ---- conventions: what a budget's fraction counts, global or layer-wise top-k, the classifier ----
def _fiarse_presets() -> list[tuple[str, dict]]:
    """Every shipped run config that runs FIARSE: its preset, and the comparisons listing it."""
    presets = []
    for path in sorted((APP_DIR / "conf").glob("*.toml")):
        values = tomllib.loads(path.read_text())
        if values.get("strategy") == "fiarse":
            presets.append((path.stem, values))
    for path in sorted((APP_DIR / "conf" / "compare").glob("*.toml")):
        comparison = load_comparison(path.stem)
        if "fiarse" in comparison.strategies:
            presets.append((path.stem, comparison.run_config("fiarse")))
    return presets


#: Channels, image size and classes of the presets' data sets (CIFAR-100 needs no download here).
_SHAPES = {"mnist-5k": (1, 28, 10), "fashion-mnist": (1, 28, 10), "cifar100": (3, 32, 100)}
_CONVENTIONS = [(measure, topk) for measure in MEASURES for topk in TOPK_RULES]


def _pytorch_default_init(model: nn.Module) -> None:
    """Every conv and linear layer back to PyTorch's own initialisation."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            module.reset_parameters()


def _marked(presets: list[tuple[str, dict]]) -> list:
    """The presets as parameters; CIFAR-100's full-size ResNet18 is ``slow``: outside the fast
    tier."""
    return [
        pytest.param(p, id=p[0], marks=[pytest.mark.slow] if p[1]["dataset"] == "cifar100" else [])
        for p in presets
    ]


def _conventions(cfg: RunConfig) -> list[tuple[str, str]]:
    """Every convention on the 28x28 presets; CIFAR-100's full-size ResNet18 (11M values sorted
    per convention, most of a minute for all of them) under its own preset's only."""
    if cfg.dataset != "cifar100":
        return _CONVENTIONS
    own = cfg.section(FiarseSettings)
    return [(own.budget, own.topk)]


@pytest.mark.parametrize("preset", _marked(_fiarse_presets()))
def test_the_classifier_keeps_weights_at_the_smallest_budget_of_every_preset(preset) -> None:
    name, values = preset
    cfg = parse_run_config(run_config(**{k.replace("-", "_"): v for k, v in values.items()}))
    channels, size, classes = _SHAPES[cfg.dataset]
    info = DatasetInfo(cfg.dataset, classes, channels, size, (0.0,), (1.0,), "none", True)
    smallest = float(min(client_budgets(piece(BudgetDraw, cfg))))  # its floor included
    for init in ("fedapp", "pytorch-default"):
        model = full_model(substrate_config(run_context(cfg).substrate, info), seed=cfg.seed)
        if init == "pytorch-default":
            torch.manual_seed(cfg.seed)
            _pytorch_default_init(model)
        state = {k: v.numpy() for k, v in model.state_dict().items()}
        costs = value_costs(model, torch.zeros(1, channels, size, size))
        head = classifier_names(model)
        assert head == ["head.weight", "head.bias"]
        for measure, topk in _conventions(cfg):
            family = MaskFamily.of(state, costs, measure=measure, topk=topk, classifier=head)
            mask = family.mask_for_budget(smallest)
            kept = family.kept_counts(mask)
            fraction = mac_fraction(smallest, family.full_macs)
            share = max(1, int(fraction * state["head.weight"].size))
            assert kept["head.weight"] >= share, (name, init, measure, topk)
            assert kept["head.bias"] >= 1, (name, init, measure, topk)
            if measure == "macs":  # the floor comes out of the budget, never on top of it
                assert family.effective_macs(mask) <= fraction * family.full_macs


def test_the_classifier_floor_leaves_a_mask_alone_where_the_head_survives() -> None:
    state = {
        "conv": np.linspace(0.01, 0.1, 20, dtype=np.float32),
        "head.weight": np.float32([0.5, 0.4, 0.3, 0.2]),  # larger than every conv value
        "head.bias": np.float32([0.6, -0.7]),
    }
    costs = {"conv": 1, "head.weight": 1, "head.bias": 0}
    plain = MaskFamily.of(state, costs)
    floored = MaskFamily.of(state, costs, classifier=["head.weight", "head.bias"])
    assert floored.mask(0.5)["conv"] == plain.mask(0.5)["conv"]  # the authors' mask unchanged
    # A small head would be masked away by the global ranking alone; the floor keeps its share.
    state["head.weight"] = np.float32([0.001, 0.002, 0.003, 0.004])
    state["head.bias"] = np.float32([0.0, 0.0])
    plain = MaskFamily.of(state, costs)
    floored = MaskFamily.of(state, costs, classifier=["head.weight", "head.bias"])
    assert plain.kept_counts(plain.mask(0.5))["head.weight"] == 0
    kept = floored.kept_counts(floored.mask(0.5))
    assert kept["head.weight"] == 2 and kept["head.bias"] == 2  # zero biases tie: all kept
    assert floored.effective_macs(floored.mask(0.5)) <= 0.5 * floored.full_macs
    assert floored.kept_values(floored.mask(1.0)) == 26  # the full model keeps everything


def test_params_budget_keeps_a_share_of_values_and_layerwise_ranks_per_group() -> None:
    rng = np.random.default_rng(1)
    state = {
        "stem.conv.weight": rng.normal(size=100).astype(np.float32) * 10,  # large values
        "stages.0.0.conv1.weight": rng.normal(size=300).astype(np.float32),
        "head.weight": rng.normal(size=100).astype(np.float32) * 0.01,
    }
    costs = {"stem.conv.weight": 9, "stages.0.0.conv1.weight": 4, "head.weight": 1}
    by_params = MaskFamily.of(state, costs, measure="params")
    assert by_params.kept_values(by_params.mask(0.25)) == 125  # int(0.25 * 500) values
    assert by_params.kept_fraction(by_params.mask(0.25)) == pytest.approx(0.25)
    layerwise = MaskFamily.of(state, costs, measure="params", topk="layerwise")
    kept = layerwise.kept_counts(layerwise.mask(0.25))
    assert kept == {"stem.conv.weight": 25, "stages.0.0.conv1.weight": 75, "head.weight": 25}
    by_macs = MaskFamily.of(state, costs, topk="layerwise")
    kept = by_macs.kept_counts(by_macs.mask(0.25))
    assert kept["stem.conv.weight"] * 9 <= 0.25 * 900 and kept["head.weight"] == 25
    with pytest.raises(ConfigError, match=r"'fiarse\.budget' = 'flops'"):
        parse_run_config(run_config(fiarse__budget="flops"))
    with pytest.raises(ConfigError, match=r"'fiarse\.topk' = 'stage'"):
        parse_run_config(run_config(fiarse__topk="stage"))


def test_trained_marks_exactly_the_grid_points_of_client_fractions(tmp_path) -> None:
    config = run_config(
        **(
            DIGITS_FIARSE
            | {
                "num_clients": 3,
                "fraction_train": 1.0,
                "num_server_rounds": 1,
                "eval_every": 1,
                "fiarse__grid_points": 4,
                "fiarse__budget": "params",
                "out_dir": str(tmp_path),
                "run_name": "fiarse",
            }
        )
    )
    cfg, grid, nodes, strategy = local_federation(config, num_nodes=3)
    summary = run_experiment(grid, cfg)
    full = strategy.family(strategy.initial_state()).full_macs
    trained_fractions = {
        mac_fraction(nodes.profiles[m.metadata.dst_node_id].budget, full)
        for m in grid.sent
        if m.metadata.message_type == "train"
    }
    for point in summary["variants"]:
        assert point["trained"] == any(
            point["fraction"] == pytest.approx(f) for f in trained_fractions
        )
        assert 0 < point["kept_fraction"] <= 1 and point["effective_macs"] == point["macs"]
    flags = [p["trained"] for p in summary["variants"]]
    assert flags[0] and not all(flags)  # the smallest budget's point; interior points: nobody
    header = (tmp_path / "fiarse" / "variants.csv").read_text().splitlines()[0].split(",")
    assert {"trained", "fraction", "kept_fraction", "effective_macs"} <= set(header)
