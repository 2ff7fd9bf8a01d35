"""FedKD-NAS and Local-KD: logit fusion and EMA, robust aggregation, KD, the NAS controller, and
both methods end to end through the real ServerApp and ClientApp (LocalGrid) on real digits."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from digits_runs import DIGITS_FEDKD_NAS
from flwr.app import RecordDict
from local_grid import run_config, run_local

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.methods.fedkd_nas.client import RoundTrainer, kd_schedule, train_with_kd
from fedapp.methods.fedkd_nas.nas import (
    Measured,
    NasHistory,
    challenger,
    decide,
    duel_due,
    feasible_candidates,
    holdout_split,
    incumbent,
    keep_weights,
    public_holdout,
    required_gain,
    warm_start,
)
from fedapp.methods.fedkd_nas.server import FedKDNASStrategy, teacher_folds
from fedapp.methods.fedkd_nas.settings import FedKDNASSettings
from fedapp.models.budgets import BudgetError
from fedapp.models.families import family_candidates
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import data_layout, run_context
from fedapp.run.federated_data import client_budgets, public_images
from fedapp.run.profiles import LocalNode, NodeRegistry
from fedapp.training.distillation import endless, kd_loss, predict_logits
from fedapp.training.logit_fusion import aggregate_logits, fuse_with_teacher, smooth
from fedapp.wire.records import from_record

DIGITS = DatasetInfo("digits", 10, 1, 8, (0.0,), (1.0,), "none", False)
LENET = family_candidates("lenet5", DIGITS, batch_size=16)
FAST = DIGITS_FEDKD_NAS


# ---- server-side fusion --------------------------------------------------------------------
def test_fusion_and_ema_by_hand() -> None:
    a, b = np.array([[1.0, 0.0]], np.float32), np.array([[5.0, 4.0]], np.float32)
    agg = aggregate_logits([a, b], [1, 3], "weighted")
    np.testing.assert_allclose(agg, [[4.0, 3.0]])  # (1*a + 3*b) / 4
    np.testing.assert_allclose(aggregate_logits([a, b], [1, 3], "mean"), [[3.0, 2.0]])
    teacher = np.array([[0.0, 2.0]], np.float32)
    fused = fuse_with_teacher(agg, teacher, beta=0.5)
    np.testing.assert_allclose(fused, [[2.0, 2.5]])
    np.testing.assert_array_equal(fuse_with_teacher(agg, None, beta=0.5), agg)
    previous = np.array([[10.0, 0.0]], np.float32)
    np.testing.assert_allclose(smooth(previous, fused, gamma=0.9), [[9.2, 0.25]])  # 0.9p + 0.1z
    np.testing.assert_array_equal(smooth(None, fused, gamma=0.9), fused)


def test_trimmed_mean_and_median_resist_one_malicious_client() -> None:
    rng = np.random.default_rng(0)
    honest = [rng.normal(1.0, 0.05, (20, 10)).astype(np.float32) for _ in range(4)]
    malicious = np.full((20, 10), 1e6, np.float32)
    replies, weights = [*honest, malicious], [100, 100, 100, 100, 400]
    low, high = np.min(honest, axis=0), np.max(honest, axis=0)
    for method in ("trimmed-mean", "median"):
        robust = aggregate_logits(replies, weights, method, trim_fraction=0.2)
        assert np.all((robust >= low - 1e-6) & (robust <= high + 1e-6)), method
    assert aggregate_logits(replies, weights, "weighted").min() > 1e5  # the plain mean breaks


# ---- client-side distillation --------------------------------------------------------------
def test_kd_term_pulls_the_students_public_logits_to_the_target() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x_pub = torch.randn(32, 1, 2, 2)
    target = torch.tensor([[4.0, -2.0, 0.0]]).repeat(32, 1)
    assert kd_loss(target, target).item() == pytest.approx(0.0, abs=1e-6)
    before = kd_loss(model(x_pub), target).item()
    private = [(torch.randn(8, 1, 2, 2), torch.randint(0, 3, (8,))) for _ in range(20)]
    public = endless([(x_pub[i : i + 8], target[i : i + 8]) for i in range(0, 32, 8)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats, seen = train_with_kd(
        model, private, public, optimizer, 3, torch.device("cpu"), 5.0, 2.0, kd_steps=0
    )
    assert (stats.examples, seen, stats.steps) == (480, 480, 60)
    assert kd_loss(model(x_pub), target).item() < 0.2 * before


def test_kd_steps_per_epoch_do_not_depend_on_the_shard_size() -> None:
    """A client with 28 private images gets the same KD as one with 448 (kd-steps = 16)."""
    torch.manual_seed(0)
    x_pub, target = torch.randn(64, 1, 2, 2), torch.randn(64, 3)
    seen_by_shard = {}
    for shard in (28, 448):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
        private = [
            (torch.randn(len(ids), 1, 2, 2), torch.randint(0, 3, (len(ids),)))
            for ids in torch.arange(shard).split(16)
        ]
        public = endless([(x_pub[i : i + 16], target[i : i + 16]) for i in range(0, 64, 16)])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        stats, seen = train_with_kd(
            model, private, public, optimizer, 2, torch.device("cpu"), 0.5, 1.0, kd_steps=16
        )
        seen_by_shard[shard] = seen
        assert stats.examples == 2 * shard  # every private image, every epoch
        assert stats.steps == 2 * max(len(private), 16)
    assert seen_by_shard == {28: 2 * 16 * 16, 448: 2 * 16 * 16}
    # the schedule: every private batch once, exactly kd_steps public batches, spread evenly
    for batches in (0, 2, 16, 28, 100):
        plan = kd_schedule(batches, 16)
        assert sum(p for p, _ in plan) == batches and sum(k for _, k in plan) == 16
        assert len(plan) == max(batches, 16)
    assert kd_schedule(2, 4) == [(True, True), (False, True), (True, True), (False, True)]
    # kd-steps = 0 (one public batch per private batch) shrinks with the shard: 2 vs 28 KD steps
    assert [sum(k for _, k in kd_schedule(b, 0)) for b in (2, 28)] == [2, 28]


# ---- NAS controller ------------------------------------------------------------------------
def _cfg(**overrides):
    return parse_run_config(run_config(**(FAST | {"strategy": "fedkd-nas"} | overrides)))


def test_feasible_set_respects_mac_and_memory_budgets() -> None:
    cfg = _cfg()
    assert [c.name for c in feasible_candidates(run_context(cfg), DIGITS, 2e4)] == [
        "lenet5-x0.25",
        "lenet5-x0.5",
    ]
    assert len(feasible_candidates(run_context(cfg), DIGITS, 3e5)) == 4
    tight = _cfg(fedkd_nas__memory_mb=LENET[1].train_memory_bytes / 2**20)
    assert [c.name for c in feasible_candidates(run_context(tight), DIGITS, 3e5)] == [
        "lenet5-x0.25",
        "lenet5-x0.5",
    ]
    with pytest.raises(BudgetError, match="affords no candidate"):
        feasible_candidates(run_context(cfg), DIGITS, 5e3)


def test_a_duel_compares_equal_training_only_and_needs_more_than_one_holdout_image() -> None:
    small, large = LENET[0], LENET[3]
    budget = 3e5  # cost 0.1 * MACs / budget: x0.25 0.0026, x2.0 0.0818
    fresh = Measured(0.90, steps=12, round=7)
    with pytest.raises(ValueError, match="equal training"):
        decide(large, fresh, small, Measured(0.95, steps=2, round=7), budget, 0.1, 0.02)
    with pytest.raises(ValueError, match="equal training"):  # a stale score: another round
        decide(large, fresh, small, Measured(0.99, steps=12, round=3), budget, 0.1, 0.02)
    # the small one scores 0.9374 - 0.0026 vs 0.90 - 0.0818: a gain of 0.116 > 0.02: switch
    switch = decide(large, fresh, small, Measured(0.9374, 12, 7), budget, 0.1, 0.02)
    assert (switch.winner, switch.rival, switch.reason) == (small.name, large.name, "duel-switched")
    # a gain below the required one keeps the incumbent
    keep = decide(large, fresh, small, Measured(0.80, 12, 7), budget, 0.1, 0.02)
    assert (keep.winner, keep.reason) == (large.name, "duel-kept")
    assert keep.score == pytest.approx(0.90 - 0.1 * large.macs / budget)
    # the margin is never finer than one hold-out example: 3 images -> 1/3
    assert required_gain(0.02, 3) == pytest.approx(1 / 3) and required_gain(0.02, 500) == 0.02


def test_controller_starts_at_the_largest_feasible_and_duels_the_stalest_rival() -> None:
    feasible, history = LENET, NasHistory()
    start, why = incumbent(feasible, history)
    assert (start.name, why) == ("lenet5-x2.0", "start")
    history.incumbent = start.name
    assert incumbent(feasible, history) == (start, "incumbent")
    # never-measured rivals first, the larger first; then the one measured longest ago
    assert challenger(feasible, start, history).name == "lenet5-x1.0"
    history.measured = {
        "lenet5-x1.0": Measured(0.9, 10, round=8),
        "lenet5-x0.5": Measured(0.9, 10, round=4),
        "lenet5-x0.25": Measured(0.9, 10, round=6),
    }
    assert challenger(feasible, start, history).name == "lenet5-x0.5"
    # every 3rd round this client trains is a duel; never with one candidate or duel-every 0
    due = []
    for _ in range(7):
        due.append(duel_due(history, feasible, 3))
        history.rounds_trained += 1
    assert due == [False, False, True, False, False, True, False]
    assert not duel_due(history, LENET[:1], 1) and not duel_due(history, feasible, 0)


def test_warm_start_restores_weights_and_evicts_the_least_recently_used() -> None:
    state, history = RecordDict(), NasHistory()
    weights = {name: {"w": np.full(3, i, np.float32)} for i, name in enumerate("abc")}
    for name in "ab":
        keep_weights(state, history, name, weights[name], keep=2)
    np.testing.assert_array_equal(warm_start(state, "a")["w"], weights["a"]["w"])
    keep_weights(state, history, "a", weights["a"], keep=2)  # 'a' used again: 'b' is older
    keep_weights(state, history, "c", weights["c"], keep=2)
    assert warm_start(state, "b") is None and history.kept == ["a", "c"]
    history.measured["c"] = Measured(0.5, 12, 3)
    history.incumbent, history.rounds_trained = "c", 4
    history.save(state)
    assert NasHistory.load(state) == history


def test_holdout_split_is_fixed_and_disjoint() -> None:
    shard = ImageArrays(np.arange(50, dtype=np.uint8).reshape(50, 1, 1, 1), np.arange(50))
    train, held = holdout_split(shard, 0.1, seed=1, partition_id=3)
    again, _ = holdout_split(shard, 0.1, seed=1, partition_id=3)
    assert len(held.labels) == 5 and len(train.labels) == 45
    assert not set(train.labels) & set(held.labels)
    np.testing.assert_array_equal(train.labels, again.labels)


def test_public_scoring_keeps_its_images_out_of_kd_and_measures_agreement_with_the_target() -> None:
    """nas-score-on = public: the whole shard trains, no candidate distils on the scored public
    images, and a score is the top-1 agreement with the broadcast target on them."""
    cfg = _cfg(strategy="fedkd-nas", fedkd_nas__score_on="public", fedkd_nas__public_holdout=0.2)
    distil, scored = public_holdout(200, 0.2, cfg.seed)
    assert len(scored) == 40 and len(distil) == 160 and not set(distil) & set(scored)
    np.testing.assert_array_equal(public_holdout(200, 0.2, cfg.seed)[1], scored)
    target = np.random.default_rng(0).normal(size=(200, 10)).astype(np.float32)
    node = LocalNode(0, 3, None, 3e5)
    trainer = RoundTrainer(run_context(cfg), node, target, server_round=3, lr=0.02)
    assert len(trainer.train_part.labels) == len(node.shard(data_layout(cfg)).labels)
    np.testing.assert_array_equal(
        trainer.holdout.images, public_images(data_layout(cfg)).images[scored]
    )
    np.testing.assert_array_equal(trainer.holdout.labels, target[scored].argmax(axis=1))
    batches = trainer.kd_batches(target, torch.Generator().manual_seed(0))
    rows = torch.cat([rows for _, rows in itertools.islice(batches, 10)]).numpy()  # 160 rows
    assert sorted(map(tuple, rows)) == sorted(map(tuple, target[distil]))  # each KD image once
    trained = trainer.train(LENET[0])
    logits = predict_logits(trained.model, trainer.holdout, trainer.info, torch.device("cpu"))
    agreement = np.mean(logits.argmax(axis=1) == target[scored].argmax(axis=1))
    assert trained.measured.accuracy == pytest.approx(agreement)
    # private scoring: a hold-out of the shard, KD on every public image
    private_cfg = _cfg(strategy="fedkd-nas", fedkd_nas__score_on="private")
    private = RoundTrainer(run_context(private_cfg), node, target, server_round=3, lr=0.02)
    assert len(private.train_part.labels) + len(private.holdout.labels) == len(
        node.shard(data_layout(cfg)).labels
    )
    rows = torch.cat(
        [r for _, r in itertools.islice(private.kd_batches(target, torch.Generator()), 13)]
    )
    assert len({tuple(r) for r in rows.numpy()}) == 200
    with pytest.raises(ConfigError, match=r"fedkd-nas\.teacher-beta"):  # no target to score against
        _cfg(strategy="local-kd", fedkd_nas__score_on="public", fedkd_nas__teacher_beta=0.0)
    with pytest.raises(ConfigError, match=r"fedkd-nas\.score-on"):
        _cfg(fedkd_nas__score_on="test")


# ---- end to end ----------------------------------------------------------------------------
def _run(tmp_path, strategy: str, rounds: int = 2, **overrides):
    config = run_config(
        **(FAST | {"strategy": strategy, "num_server_rounds": rounds} | overrides)
        | {"out_dir": str(tmp_path), "run_name": strategy}
    )
    summary, grid = run_local(config, num_nodes=3)
    with (tmp_path / strategy / "nas_choices.csv").open() as f:
        choices = list(csv.DictReader(f))
    return summary, grid, choices


def test_fedkd_nas_two_rounds_on_digits(tmp_path) -> None:
    summary, _, choices = _run(tmp_path, "fedkd-nas")
    assert 0.3 < summary["test_accuracy"] <= 1.0 and summary["test_clients"] == 3
    assert summary["teacher_test_accuracy"] > 0.6  # trained on 200 labelled public images
    assert {"test_loss", "comm", "compute_proxy_total_macs", "nas_choices"} <= set(summary)
    # logits cross the link both ways: 200 x 10 float32 per client and round
    assert summary["resources"]["comm_mb_total"] == pytest.approx(2 * 2 * 3 * 200 * 10 * 4 / 2**20)
    # each client starts from the largest candidate its budget affords; the one whose budget
    # affords only the smallest never trains another
    budgets = _budgets()
    first = {row["partition"]: row["candidate"] for row in choices if row["round"] == "1"}
    assert first == {p: [c.name for c in LENET if c.macs <= b][-1] for p, b in budgets.items()}
    assert len(set(first.values())) == 3
    (poorest,) = [p for p, b in budgets.items() if b < LENET[1].macs]
    assert {row["candidate"] for row in choices if row["partition"] == poorest} == {"lenet5-x0.25"}
    with (tmp_path / "fedkd-nas" / "clients.csv").open() as f:
        clients = list(csv.DictReader(f))
    assert [row["partition"] for row in clients] == ["0", "1", "2"]
    assert {"accuracy", "macs", "multiplier"} <= set(clients[0])
    last = {row["partition"]: row["candidate"] for row in choices if row["round"] == "2"}
    assert {row["partition"]: row["candidate"] for row in clients} == last
    # every round's row says where Z~ stands between the D_pub labels, the clients and P_T
    rows = [json.loads(line) for line in (tmp_path / "fedkd-nas" / "metrics.jsonl").open()]
    keys = ("target-label-agreement", "target-clients-agreement", "clients-label-agreement")
    for row in rows:
        assert all(0.0 <= row[key] <= 1.0 for key in (*keys, "teacher-label-agreement"))
    assert rows[0]["teacher-label-agreement"] < 1.0  # cross-fitted: P_T is not the labels


@pytest.mark.parametrize("score_on", ["private", "public"])
def test_in_a_federation_no_client_stays_on_a_candidate_scored_after_less_training(
    tmp_path, score_on: str
) -> None:
    """Duels every 2nd round a client trains: each compares two scores of the same round after
    the same steps, the better one (by more than the required gain) is next round's student,
    whether scored on a private hold-out or on 40 public images against Z~."""
    summary, _, choices = _run(
        tmp_path, "fedkd-nas", rounds=7, fedkd_nas__duel_every=2, fedkd_nas__score_on=score_on
    )
    switches = [row for row in choices if row["reason"] == "duel-switched"]
    assert summary["nas_switches"] == len(switches)  # a client's first choice is no switch
    budgets = _budgets()
    holdout = {p: len(_client_holdout(int(p))) if score_on == "private" else 40 for p in budgets}
    for row in choices:  # a share of the hold-out's images
        assert float(row["nas-holdout-accuracy"]) * holdout[row["partition"]] == pytest.approx(
            round(float(row["nas-holdout-accuracy"]) * holdout[row["partition"]])
        )
    duels = [row for row in choices if row["rival"]]
    assert len(duels) >= 6
    for row in duels:
        assert int(row["nas-steps"]) == int(float(row["nas-rival-steps"])) > 0
        gain = float(row["nas-score"]) - float(row["nas-rival-score"])
        if row["reason"] == "duel-switched":
            assert gain > required_gain(0.02, holdout[row["partition"]])
        else:
            assert row["reason"] == "duel-kept" and gain >= -required_gain(
                0.02, holdout[row["partition"]]
            )
    for partition, budget in budgets.items():
        rows = [row for row in choices if row["partition"] == partition]
        feasible = [c.name for c in LENET if c.macs <= budget]
        assert rows[0]["candidate"] == feasible[-1] and rows[0]["reason"] == "start"
        for before, after in itertools.pairwise(rows):  # each round trains the last winner
            trained = after["rival"] if after["reason"] == "duel-switched" else after["candidate"]
            assert trained == before["candidate"]
        last_measured: dict[str, int] = {}  # each duel's challenger is the stalest rival
        for row in rows:
            trained = row["rival"] if row["reason"] == "duel-switched" else row["candidate"]
            if row["rival"]:
                challenged = ({row["candidate"], row["rival"]} - {trained}).pop()
                stalest = min(
                    (c for c in LENET if c.name in feasible and c.name != trained),
                    key=lambda c: (last_measured.get(c.name, -1), -c.macs),
                )
                assert challenged == stalest.name
            for name in (row["candidate"], row["rival"]):
                if name:
                    last_measured[name] = int(row["round"])


def _budgets() -> dict[str, float]:
    """Each partition's budget (MACs) in the FAST runs, as the clients draw it."""
    return {str(p): float(b) for p, b in enumerate(client_budgets(data_layout(_cfg()).budgets))}


def _client_holdout(partition: int) -> np.ndarray:
    from fedapp.run.federated_data import client_shard

    cfg = _cfg()
    _, held = holdout_split(
        client_shard(data_layout(cfg), partition),
        cfg.section(FedKDNASSettings).holdout,
        cfg.seed,
        partition,
    )
    return held.labels


def test_the_teacher_never_labels_an_image_it_was_trained_on() -> None:
    for size, folds in ((200, 2), (7, 3)):
        splits = teacher_folds(size, folds, seed=5)
        labelled = np.concatenate([lab for _, lab in splits])
        assert sorted(labelled) == list(range(size))  # every image labelled exactly once
        for trained_on, lab in splits:
            assert not set(trained_on) & set(lab)
            assert len(trained_on) + len(lab) == size
    # 1 fold, no cross-fitting: one teacher on all of D_pub, labelling its own training images
    ((trained_on, lab),) = teacher_folds(5, 1, seed=5)
    assert list(trained_on) == list(lab) == [0, 1, 2, 3, 4]
    # measured on real digits: fitted to D_pub it reproduces the labels; cross-fitted it does not
    agreement = {}
    for folds in (1, 2):
        cfg = _cfg(strategy="fedkd-nas", fedkd_nas__teacher_folds=folds)
        strategy = FedKDNASStrategy(run_context(cfg), NodeRegistry(cfg.num_clients))
        p_t = strategy.initial_state()["teacher"]
        agreement[folds] = float(np.mean(p_t.argmax(axis=1) == strategy.public_labels))
        assert len(strategy.teachers) == folds
    assert agreement[1] == 1.0 and 0.5 < agreement[2] < 1.0, agreement


def test_local_kd_receives_the_teacher_once_and_sends_nothing(tmp_path) -> None:
    summary, grid, choices = _run(tmp_path, "local-kd")
    assert 0.3 < summary["test_accuracy"] <= 1.0 and summary["test_clients"] == 3
    traffic = summary["resources"]["comm_mb_total"]
    assert traffic == pytest.approx(3 * 200 * 10 * 4 / 2**20)  # P_T once per client, no uplink
    sent = [from_record(m.content["arrays"]) for m in grid.sent if "arrays" in m.content]
    assert [len(arrays) for arrays in sent] == [1, 1, 1, 0, 0, 0]
    assert len(choices) == 6  # the controller still runs every round


#: The modules of FEAST's model space (supernet cache, its search, budget routing, co-training).
FEAST_SPACE = (
    "fedapp.run.feast_space",
    "fedapp.models.cache",
    "fedapp.models.ga",
    "fedapp.models.routing",
    "fedapp.training.co_training",
)


def test_a_fedkd_nas_run_imports_nothing_of_feasts_model_space(tmp_path) -> None:
    """Both halves of a whole run, in a fresh interpreter: the logit methods do not reach FEAST's
    supernet, cache or routes through the shared layers."""
    overrides = FAST | {"strategy": "fedkd-nas", "num_server_rounds": 1}
    overrides |= {"out_dir": str(tmp_path), "run_name": "kd"}
    code = (
        "import sys, json\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[1] / 'support')!r})\n"
        "from local_grid import run_config, run_local\n"
        f"summary, _ = run_local(run_config(**{overrides!r}), num_nodes=3)\n"
        "assert summary['rounds'] == 1\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m in {FEAST_SPACE!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
