"""SuperFedNAS / DeepFedNAS transfers: MaxNet weights, tracking sandwich, budget-constrained
draws, MaxNet aggregation, and a federation for both strategy names."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from digits_runs import DIGITS_FEAST
from flwr.app import MessageType
from local_grid import LocalGrid, local_federation, run_config, server_context

from fedapp.apps.client_app import app as client_app
from fedapp.apps.server_app import run_experiment
from fedapp.methods.common.reply_validation import ValidReply
from fedapp.methods.common.strategy import build_strategy
from fedapp.methods.maxnet.server import (
    MAX,
    MIN,
    RANDOM,
    Assignment,
    PathSampler,
    SandwichTracker,
    SpaceSampler,
    maxnet_weight,
    maxnet_weights,
)
from fedapp.models.arch import parse_arch
from fedapp.models.counter import count
from fedapp.models.elastic_resnet import state_shapes
from fedapp.models.slicing import SliceAccumulator
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import data_layout, run_context
from fedapp.run.feast_space import model_space
from fedapp.run.federated_data import client_budgets, population
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.wire.records import from_record

DIGITS_MAXNET = DIGITS_FEAST | {"strategy": "superfednas"}


def _cfg(**overrides):
    return parse_run_config(run_config(**(DIGITS_MAXNET | overrides)))


# ---- MaxNet weights --------------------------------------------------------------------------
def test_maxnet_weight_decays_by_cosine_to_the_final_value_at_s() -> None:
    s = 0.8 * 100  # S = 80 % of 100 rounds
    a = 0.125 / 0.9
    assert maxnet_weight(0, s) == pytest.approx(0.9)
    assert maxnet_weight(40, s) == pytest.approx(0.9 * ((1 - a) * 0.5 + a))  # = 0.5125
    assert maxnet_weight(40, s) == pytest.approx(0.5125)
    assert maxnet_weight(20, s) == pytest.approx(
        0.9 * ((1 - a) * 0.5 * (1 + math.cos(0.25 * math.pi)) + a)
    )
    assert maxnet_weight(80, s) == pytest.approx(0.125)
    assert maxnet_weight(95, s) == pytest.approx(0.125)  # constant after S
    series = [maxnet_weight(t, s) for t in range(101)]
    assert all(x >= y for x, y in itertools.pairwise(series))


@pytest.mark.parametrize("t", [0, 40, 80, 120])
def test_other_clients_share_the_rest_and_all_weights_sum_to_one(t) -> None:
    w_max = maxnet_weight(t, 80)
    roles = [RANDOM, MAX, MIN, RANDOM, RANDOM]
    weights = maxnet_weights(roles, [10, 20, 30, 40, 50], w_max, by_examples=False)
    assert weights[1] == pytest.approx(w_max)
    assert all(w == pytest.approx((1 - w_max) / 4) for i, w in enumerate(weights) if i != 1)
    assert sum(weights) == pytest.approx(1.0)


def test_weights_without_the_max_reply_and_by_examples() -> None:
    # The max-subnet client's reply was dropped: nobody trained the max subnet this round, so
    # the remaining replies get equal weights (a plain overlap-aware average).
    assert maxnet_weights([MIN, RANDOM], [10, 30], 0.9, by_examples=False) == [0.5, 0.5]
    # n_i / sum(n) multiplies every weight (the authors' --weight_dataset)
    weights = maxnet_weights([MAX, MIN, RANDOM], [10, 30, 60], 0.9, by_examples=True)
    assert weights == pytest.approx([0.9 * 0.1, 0.05 * 0.3, 0.05 * 0.6])
    assert maxnet_weights([MAX], [5], 0.4, by_examples=False) == [0.4]


# ---- tracking sandwich ---------------------------------------------------------------------------
def test_tracking_sandwich_balances_max_and_min_over_rounds() -> None:
    tracker = SandwichTracker()
    history = [tracker.roles([3, 1, 0, 2]) for _ in range(8)]
    maxes = [next(p for p, r in roles.items() if r == MAX) for roles in history]
    mins = [next(p for p, r in roles.items() if r == MIN) for roles in history]
    assert maxes == [0, 1, 2, 3, 0, 1, 2, 3]  # fewest past MaxNet, ties to the lower id
    assert mins == [1, 0, 3, 2, 1, 0, 3, 2]  # fewest past MinNet among the others
    assert all(a != b for a, b in zip(maxes, mins, strict=True))
    assert tracker.largest == dict.fromkeys(range(4), 2)
    assert tracker.smallest == dict.fromkeys(range(4), 2)
    assert all(sum(r == RANDOM for r in roles.values()) == 2 for roles in history)


def test_tracking_sandwich_with_seeded_cohorts_keeps_maxnet_load_balanced() -> None:
    tracker = SandwichTracker()
    seen: dict[int, int] = {}
    for server_round in range(1, 41):
        cohort = np.random.default_rng([42, server_round]).choice(10, size=3, replace=False)
        roles = tracker.roles([int(p) for p in cohort])
        assert sorted(roles.values()) == sorted([MAX, MIN, RANDOM])
        for p in cohort:
            seen[int(p)] = seen.get(int(p), 0) + 1
    # every partition that took part got the MaxNet in about a third of its rounds
    for p, rounds in seen.items():
        assert abs(tracker.largest.get(p, 0) - rounds / 3) <= 2


# ---- samplers ------------------------------------------------------------------------------
def test_budget_constrained_draws_never_exceed_the_budget() -> None:
    cfg = _cfg()
    space = model_space(run_context(cfg).feast_space, population(data_layout(cfg)).info)
    budgets = [*space.cache.macs.tolist(), 1.5e6, 3.1e6]
    for sampler in (SpaceSampler(space), PathSampler(space)):
        for budget in budgets:
            largest = count(space.config, sampler.draw(MAX, budget, None)).macs
            assert largest == max(m for m in space.cache.macs if m <= budget)
            assert count(space.config, sampler.draw(MIN, budget, None)).macs == space.cache.min_macs
            for seed in range(25):
                arch = sampler.draw(RANDOM, budget, np.random.default_rng([seed, 1, 3]))
                assert count(space.config, arch).macs <= budget


def test_unconstrained_samplers_span_the_whole_space_or_path() -> None:
    cfg = _cfg()
    space = model_space(run_context(cfg).feast_space, population(data_layout(cfg)).info)
    sfn, dfn = SpaceSampler(space), PathSampler(space)
    assert sfn.draw(MAX, None, None) == space.config.max_arch()
    assert count(space.config, sfn.draw(MIN, None, None)).macs < space.cache.min_macs
    assert dfn.draw(MAX, None, None) == space.cache.variants[-1].arch
    assert dfn.draw(MIN, None, None) == space.cache.variants[0].arch
    rng = np.random.default_rng(0)
    random_sfn = {sfn.draw(RANDOM, None, rng) for _ in range(30)}
    assert len(random_sfn) > 20 and not random_sfn <= set(space.cache.archs)  # beyond the cache
    assert {dfn.draw(RANDOM, None, rng) for _ in range(30)} <= set(space.cache.archs)
    # seeded by (run seed, round, partition)
    draw = lambda: sfn.draw(RANDOM, None, np.random.default_rng([42, 3, 1]))  # noqa: E731
    assert draw() == draw()


def test_feast_transfer_min_is_the_global_minimum_and_max_the_best_of_20() -> None:
    cfg = _cfg(maxnet__subnet_sampling="feast-transfer")
    space = model_space(run_context(cfg).feast_space, population(data_layout(cfg)).info)
    sampler = SpaceSampler(space)
    low = sampler.transfer(MIN, space.cache.min_macs, np.random.default_rng(0))
    low_macs = count(space.config, low).macs
    assert low == space.config.arch_from_genes(np.zeros(space.config.num_genes, dtype=np.int64))
    assert low_macs < space.cache.min_macs  # below every cached variant: not a cache point
    genes = np.random.default_rng(1).integers(
        0, space.config.gene_high, (500, space.config.num_genes)
    )
    assert low_macs <= min(count(space.config, space.config.arch_from_genes(g)).macs for g in genes)
    for budget in (space.cache.macs[len(space.cache) // 2], space.cache.macs[-1]):
        rng_seed = [42, 3, 1]
        best = sampler.transfer(MAX, budget, np.random.default_rng(rng_seed))
        draws = np.random.default_rng(rng_seed).integers(
            0, space.config.gene_high, size=(20, space.config.num_genes)
        )
        fitting = [
            m
            for m in (count(space.config, space.config.arch_from_genes(g)).macs for g in draws)
            if m <= budget
        ]
        assert count(space.config, best).macs == max(fitting, default=low_macs) <= budget
    # a budget no random draw fits: the global minimum
    assert sampler.transfer(MAX, low_macs, np.random.default_rng(0)) == low
    strategy = build_strategy(cfg, NodeRegistry(cfg.num_clients))
    assert strategy.weight_examples  # the transfer weights replies by their examples
    with pytest.raises(ConfigError, match=r"DeepFedNAS samples its cached path"):
        _cfg(strategy="deepfednas", maxnet__subnet_sampling="feast-transfer")


def test_subnet_sampling_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"'maxnet\.subnet-sampling' = 'some'"):
        _cfg(maxnet__subnet_sampling="some")
    with pytest.raises(ConfigError, match=r"'maxnet\.decay-fraction' = 0\.0"):
        _cfg(maxnet__decay_fraction=0.0)


# ---- MaxNet aggregation ---------------------------------------------------------------------
def test_aggregation_weights_the_max_client_on_overlapping_positions() -> None:
    cfg = _cfg(num_server_rounds=10)  # S = 8 rounds; round 1 is t = 0: w_max = 0.9
    nodes = NodeRegistry(cfg.num_clients)
    strategy = build_strategy(cfg, nodes)
    arch = strategy.space.cache.variants[0].arch
    for node_id, pid, role in ((11, 0, MIN), (12, 1, MAX), (13, 2, RANDOM)):
        nodes.profiles[node_id] = NodeProfile(node_id, pid, 3, 100, 1e7, "cpu")
        strategy.assigned[pid] = Assignment(role, arch, 0, 0)
    old = {"w": np.full((4, 2), -1.0, np.float32), "n.num_batches_tracked": np.array(7)}
    replies = [  # min: leading 1 row, max: all 4 rows, random: 2 rows (examples do not matter)
        ValidReply(11, {"w": np.zeros((1, 2), np.float32)}, {"num-examples": 10}),
        ValidReply(12, {"w": np.ones((4, 2), np.float32)}, {"num-examples": 20}),
        ValidReply(13, {"w": np.full((2, 2), 0.5, np.float32)}, {"num-examples": 30}),
    ]
    new = strategy.aggregate(1, replies, old)
    # weights: max 0.9, the two others 0.05 each; every position divides by its covering weight
    np.testing.assert_allclose(new["w"][0], (0.9 * 1 + 0.05 * 0 + 0.05 * 0.5) / 1.0)
    np.testing.assert_allclose(new["w"][1], (0.9 * 1 + 0.05 * 0.5) / 0.95, rtol=1e-6)
    np.testing.assert_allclose(new["w"][2:], 1.0)  # only the max subnet covers them
    assert new["n.num_batches_tracked"] == 7
    late = strategy.aggregate(9, replies, old)  # t = 8 = S: w_max = 0.125, others 0.4375
    expected = (0.125 * 1 + 0.4375 * 0 + 0.4375 * 0.5) / 1.0
    np.testing.assert_allclose(late["w"][0], expected, rtol=1e-6)


# ---- federation -------------------------------------------------------------------------------
def _grid(tmp_path, name: str, **overrides):
    config = run_config(
        **(
            DIGITS_MAXNET
            | {
                "strategy": name,
                "num_clients": 4,
                "fraction_train": 0.75,
                "num_server_rounds": 2,
                "local_epochs": 1,
                "out_dir": str(tmp_path),
                "run_name": name,
            }
            | overrides
        )
    )
    server_context(config)
    return config, parse_run_config(config)


@pytest.mark.parametrize("name", ["superfednas", "deepfednas"])
def test_two_round_federation_for_both_names(tmp_path, name) -> None:
    config, cfg = _grid(tmp_path, name)
    grid = LocalGrid(client_app, config, num_nodes=4)
    summary = run_experiment(grid, cfg)
    for key in (
        "test_accuracy",
        "population_accuracy",
        "variants",
        "population",
        "comm",
        "compute_proxy_total_macs",
        "resources",
        "maxnet_assignments",
    ):
        assert key in summary, key
    space = model_space(run_context(cfg).feast_space, population(data_layout(cfg)).info)
    assert len(summary["variants"]) == len(space.cache)
    assert summary["compute_proxy_total_macs"] > 0
    assert sum(summary["maxnet_assignments"].values()) == 2  # one MaxNet per round
    assert 0 < summary["comm"]["mean_params_per_client_round"] < space.full_params
    run_dir = tmp_path / name
    files = {p.name for p in run_dir.iterdir()}
    assert {"variants.csv", "population.csv", "communication.csv", "accuracy_vs_macs.png"} <= files
    assert json.loads((run_dir / "summary.json").read_text())["strategy"] == name
    # every node's payload was exactly its assigned subnet, within its budget (budget-constrained)
    nodes = {n: grid.contexts[n].node_config["partition-id"] for n in grid.node_ids}
    subnets = set()
    for message in grid.sent:
        if message.metadata.message_type != MessageType.TRAIN:
            continue
        subnet = str(message.content["config"]["subnet"])
        subnets.add(subnet)
        macs = count(space.config, space.config.validate(parse_arch(subnet))).macs
        assert macs <= client_budgets(data_layout(cfg).budgets)[nodes[message.metadata.dst_node_id]]
    # a cached variant is trained exactly when some client's subnet was that variant
    cached = [str(v.arch) for v in space.cache.variants]
    assert [v["trained"] for v in summary["variants"]] == [a in subnets for a in cached]


def test_dropped_max_reply_leaves_a_plain_average_of_the_rest(tmp_path) -> None:
    config, _ = _grid(tmp_path, "deepfednas", fraction_train=1.0, num_server_rounds=1)
    kept: dict[int, dict[str, np.ndarray]] = {}

    def keep(index, reply):
        kept[index] = from_record(reply.content["arrays"])
        return reply

    # round 1, all four sampled, equal counts: partition 0 (node index 0) gets the MaxNet
    hooks = {0: lambda index, reply: None, 1: keep, 2: keep, 3: keep}
    _, grid, _, strategy = local_federation(config, num_nodes=4, reply_hooks=hooks)
    initial = strategy.initial_state()
    messages = strategy.configure_round(1, initial, grid)
    assert strategy.assigned[0].role == MAX
    new, _ = strategy.aggregate_round(1, grid.send_and_receive(messages))
    assert strategy.report.accepted == 3 and len(strategy.report.dropped) == 1
    reference = SliceAccumulator(initial)
    for index in sorted(kept):
        reference.add(kept[index], weight=1.0)
    expected = reference.result()
    for name, value in new.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-6, atol=1e-7)


def test_unconstrained_max_client_receives_the_whole_supernet(tmp_path) -> None:
    config, _ = _grid(tmp_path, "superfednas", maxnet__subnet_sampling="unconstrained")
    _, grid, nodes, strategy = local_federation(config, num_nodes=4)
    initial = strategy.initial_state()
    sizes = {}
    for message in strategy.configure_round(1, initial, grid):
        pid = nodes.profiles[message.metadata.dst_node_id].partition_id
        sent = from_record(message.content["arrays"])
        sizes[strategy.assigned[pid].role] = sum(a.size for a in sent.values())
        assert {k: v.shape for k, v in sent.items()} == state_shapes(
            strategy.space.config, strategy.assigned[pid].arch
        )
    # budgets are ignored: the MaxNet client gets every tensor whole, the MinNet the space's min
    assert sizes[MAX] == sum(a.size for a in initial.values())
    assert sizes[MIN] < sizes[RANDOM] < sizes[MAX]
