"""FEAST: the local co-training rule, a routed federation over the in-process Grid, accounting."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from digits_runs import DIGITS_FEAST
from flwr.app import ConfigRecord
from local_grid import local_federation, run_config

from fedapp.apps.server_app import run_experiment
from fedapp.evaluation.accounting import CommunicationLedger, coverage_probability, exposure
from fedapp.evaluation.intervals import format_row
from fedapp.methods.feast.settings import FeastSettings
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.models.routing import envelope
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import data_layout, run_context
from fedapp.run.feast_space import model_space
from fedapp.run.federated_data import client_budgets, population
from fedapp.training.co_training import co_training_gradients, plan_for
from fedapp.training.loops import optimizer_step
from fedapp.wire.records import from_record, to_record


def _space(**overrides):
    cfg = parse_run_config(run_config(**(DIGITS_FEAST | overrides)))
    return cfg, model_space(run_context(cfg).feast_space, population(data_layout(cfg)).info)


def test_coverage_formula_matches_the_paper() -> None:
    assert round(coverage_probability(100, 10, 11), 4) == 0.7062
    assert coverage_probability(100, 10, 0) == 0.0
    assert coverage_probability(100, 10, 91) == 1.0


@pytest.mark.parametrize(
    ("rule", "affordable", "expected"),
    [
        ("full", [0], ["min"]),  # a_max = a_min: plain supervised loss on the min
        ("full", [0, 1], ["max", "min+kd"]),  # no intermediate variant
        ("full", [0, 1, 2, 3], ["max", "min+kd", "random+kd"]),
        ("min-max-kd", [0, 1, 2, 3], ["max", "min+kd"]),
        ("min-max", [0, 1, 2, 3], ["max", "min"]),
        ("max", [0, 1, 2, 3], ["max"]),
        ("min", [0, 1, 2, 3], ["min"]),
    ],
)
def test_passes_per_case_and_kd_only_on_smaller_variants(rule, affordable, expected) -> None:
    _, space = _space()
    plan = plan_for(space.cache, affordable, rule)
    passes = plan.passes(torch.Generator().manual_seed(0))
    names = []
    for p in passes:
        name = (
            "min"
            if p.variant == plan.smallest
            else "max"
            if p.variant == plan.largest
            else "random"
        )
        names.append(name + ("+kd" if p.distil else ""))
        assert not (p.distil and p.variant == plan.largest), "the local max never distils"
    assert names == expected and plan.num_passes == len(expected)
    if "random+kd" in expected:
        assert passes[2].variant in plan.intermediates


def test_random_intermediate_is_redrawn_per_batch_and_seeded() -> None:
    _, space = _space()
    plan = plan_for(space.cache, list(range(len(space.cache))), "full")
    draw = lambda g: [plan.passes(g)[2].variant.macs for _ in range(30)]  # noqa: E731
    a, b = draw(torch.Generator().manual_seed(1)), draw(torch.Generator().manual_seed(1))
    assert a == b and len(set(a)) > 1
    assert all(plan.smallest.macs < m < plan.largest.macs for m in a)


class CountingSGD(torch.optim.SGD):
    """SGD that counts its steps."""

    steps = 0

    def step(self, closure=None):
        self.steps += 1
        return super().step(closure)


def test_one_optimizer_step_per_minibatch_with_summed_clipped_gradients() -> None:
    _, space = _space()
    affordable = [0, 1, 2, 3, 4]
    plan = plan_for(space.cache, affordable, "full")
    bounds = envelope(space.config, [space.cache.variants[i].arch for i in affordable])
    model = ElasticResNet(space.config, bounds, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = CountingSGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))  # shapes only
    for _ in range(3):
        outcome = optimizer_step(
            model,
            optimizer,
            x,
            y,
            co_training_gradients(model, plan, generator, kd_weight=0.5),
            generator=generator,
            mix=True,
            grad_clip=1e-3,
        )
        total = math.sqrt(
            sum(float(p.grad.norm()) ** 2 for p in model.parameters() if p.grad is not None)
        )
        assert total <= 1e-3 * 1.001  # the summed gradient was clipped before the step
    assert optimizer.steps == 3
    assert outcome.forward_macs >= plan.smallest.macs + plan.largest.macs
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert any("stages.0.0.conv1" in k for k in changed)


def test_budget_below_the_smallest_variant_is_a_config_error_unless_floored() -> None:
    with pytest.raises(ConfigError, match="below the smallest variant"):
        _space(budget_min=1e3, partitioner="iid")
    cfg, space = _space(budget_min=1e3, budget_floor=DIGITS_FEAST["budget_min"], partitioner="iid")
    assert space.cache.min_macs <= cfg.budget_floor  # every budget affords the smallest variant
    assert min(client_budgets(run_context(cfg).data.budgets)) == cfg.budget_floor


def test_two_round_federation_with_sparse_aggregation(tmp_path, caplog) -> None:
    config = run_config(
        **(
            DIGITS_FEAST
            | {
                "num_clients": 4,
                "fraction_train": 1.0,
                "num_server_rounds": 2,
                "out_dir": str(tmp_path),
                "run_name": "feast",
            }
        )
    )
    cfg, grid, nodes, strategy = local_federation(config, num_nodes=4)
    initial = strategy.initial_state()
    messages = list(strategy.configure_train(1, to_record(initial), ConfigRecord(), grid))
    routes = {
        m.metadata.dst_node_id: strategy.route_of(nodes.profiles[m.metadata.dst_node_id])
        for m in messages
    }
    for m in messages:  # each node received exactly its routed slices
        sent = from_record(m.content["arrays"])
        assert {k: v.shape for k, v in sent.items()} == routes[m.metadata.dst_node_id].shapes
    arrays, _ = strategy.aggregate_train(1, grid.send_and_receive(messages))
    new = from_record(arrays)
    routed = {}
    for route in routes.values():
        for name, shape in route.shapes.items():
            routed.setdefault(name, np.zeros(initial[name].shape, bool))[
                tuple(slice(0, s) for s in shape)
            ] = True
    for name, value in new.items():
        mask = routed.get(name, np.zeros(value.shape, bool))
        np.testing.assert_array_equal(value[~mask], initial[name][~mask])  # nobody routed it
    assert strategy.report.accepted == 4

    summary = run_experiment(grid, cfg)
    for key in (
        "population_accuracy",
        "population_accuracy_best_affordable",
        "variants",
        "comm",
        "compute_proxy_total_macs",
        "exposure",
    ):
        assert key in summary
    assert summary["population_accuracy_best_affordable"] >= summary["population_accuracy"]
    assert {"macs", "nominal_macs", "params", "accuracy"} <= set(summary["variants"][0])
    # trained: the minimum, each client's maximum and (rule full) its intermediates
    plans = [
        plan_for(strategy.space.cache, r.affordable, cfg.section(FeastSettings).training_rule)
        for r in routes.values()
    ]
    variants = strategy.space.cache.variants
    trained = {variants.index(v) for plan in plans for v in plan.trained}
    assert [v["trained"] for v in summary["variants"]] == [
        i in trained for i in range(len(variants))
    ]
    for key in (
        "mean_params_per_client_round",
        "aggregate_reduction",
        "client_reduction_mean",
        "client_reduction_median",
        "client_reduction_max",
    ):
        assert summary["comm"][key] > 0
    assert {"r_min", "min_coverage"} <= set(summary["exposure"])
    files = {p.name for p in (tmp_path / "feast").iterdir()}
    assert {"variants.csv", "population.csv", "communication.csv", "accuracy_vs_macs.png"} <= files
    header = (tmp_path / "feast" / "population.csv").read_text().splitlines()[0].split(",")
    assert {"variant", "accuracy", "best_affordable_variant", "best_affordable_accuracy"} <= set(
        header
    )
    assert json.loads((tmp_path / "feast" / "summary.json").read_text())["strategy"] == "feast"
    # the final test announces each variant as it finishes; validations stay silent
    announced = [r.getMessage() for r in caplog.records if "final test: point" in r.getMessage()]
    count = len(variants)
    assert [line.split(" | ")[0] for line in announced] == [
        f"final test: point {i}/{count}" for i in range(1, count + 1)
    ]
    by_macs = sorted(summary["variants"], key=lambda v: v["macs"])
    assert [line.split(" | ")[2] for line in announced] == [format_row(v) for v in by_macs]


def test_accounting_on_a_hand_checkable_population() -> None:
    ledger = CommunicationLedger(full_params=100)
    for partition, params in ((0, 10), (1, 50), (0, 10), (2, 100)):
        ledger.add(1, partition, params, bytes_down=4 * params, bytes_up=4 * params)
    out = ledger.summary({0: 10, 1: 50, 2: 100})
    assert out["mean_params_per_client_round"] == 42.5
    assert out["aggregate_reduction"] == pytest.approx(400 / 170)
    assert out["client_reduction_mean"] == pytest.approx((10 + 2 + 1) / 3)
    assert out["client_reduction_median"] == 2 and out["client_reduction_max"] == 10
    assert out["bytes_down_total"] == 4 * 170

    shapes = {"w": (4, 2), "b": (4,), "bn.num_batches_tracked": ()}
    routes = [{"w": (1, 2), "b": (1,)}, {"w": (2, 2), "b": (2,)}, {"w": (4, 2), "b": (4,)}]
    result = exposure(shapes, routes, cohort=1)
    # w rows: row 0 routed by 3, row 1 by 2, rows 2-3 by 1 (each has 2 columns); b likewise
    assert [(p["routed_by"], p["positions"]) for p in result["profiles"]] == [
        (1, 6),
        (2, 3),
        (3, 3),
    ]
    assert result["r_min"] == 1 and result["min_coverage"] == pytest.approx(1 / 3)
