"""FedDF: uniform per-prototype FedAvg, the AVGLOGITS ensemble teacher, best-on-validation early
stopping of the server distillation, and a two-round federation of heterogeneous prototypes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from digits_runs import FEDDF_DIGITS
from flwr.app import ConfigRecord
from local_grid import local_federation, run_config
from torch import nn

from fedapp.apps.server_app import run_experiment
from fedapp.data.registry import DatasetInfo, ImageArrays, load_dataset
from fedapp.methods.feddf.server import prototype_state, uniform_average
from fedapp.run.federated_data import HIDDEN_LABEL
from fedapp.training.distillation import kd_loss, predict_logits
from fedapp.training.ensemble_distillation import DistillSettings, distil, ensemble_logits
from fedapp.wire.records import from_record, to_record

CPU = torch.device("cpu")
#: digits, 4 clients whose Zipf budgets (56k, 164k, 229k, 134k MACs) afford lenet5-x0.5 (19k) or
#: lenet5-x1.0 (67k) as their largest candidate: two prototypes.


def _digits(count: int) -> tuple[ImageArrays, DatasetInfo]:
    data = load_dataset("digits", "")
    return ImageArrays(data.train.images[:count], data.train.labels[:count]), data.info


def _constant_model(hidden: int | None, bias: list[float]) -> nn.Module:
    """A model of the given shape whose logits are ``bias`` for every input."""
    layers: list[nn.Module] = [nn.Flatten()]
    if hidden is not None:
        layers.append(nn.Linear(64, hidden))
    layers.append(nn.Linear(hidden or 64, len(bias)))
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for layer in model[1:]:
            layer.weight.zero_()
            layer.bias.zero_()
        model[-1].bias.copy_(torch.tensor(bias))
    return model


def test_per_prototype_fedavg_is_uniform_and_leaves_other_prototypes_alone() -> None:
    state = {
        "a/w": np.zeros(2, np.float32),
        "b/w": np.zeros(1, np.float32),
        "c/w": np.full(3, 7.0, np.float32),
    }
    replies = [
        ("a", {"w": np.array([1.0, 2.0], np.float32)}),
        ("b", {"w": np.array([5.0], np.float32)}),
        ("a", {"w": np.array([3.0, 6.0], np.float32)}),
        ("a", {"w": np.array([2.0, 1.0], np.float32)}),
    ]
    new = uniform_average(state, replies)
    np.testing.assert_allclose(new["a/w"], [2.0, 3.0])  # (1+3+2)/3, (2+6+1)/3
    np.testing.assert_allclose(new["b/w"], [5.0])
    np.testing.assert_array_equal(new["c/w"], [7.0, 7.0, 7.0])  # nobody trained c
    assert prototype_state(new, "a") == {"w": new["a/w"]}


def test_ensemble_teacher_is_the_mean_of_all_models_logits() -> None:
    images, info = _digits(5)
    models = [
        _constant_model(None, [1.0, 0, 0, 0, 0, 0, 0, 0, 0, 4.0]),
        _constant_model(8, [3.0, 0, 0, 0, 0, 0, 0, 0, 2.0, 0]),  # another architecture
        _constant_model(None, [2.0, 0, 0, 0, 0, 0, 0, 0, 1.0, -1.0]),
    ]
    teacher = ensemble_logits(models, images, info, CPU)
    expected = np.array([2.0, 0, 0, 0, 0, 0, 0, 0, 1.0, 1.0], np.float32)
    assert teacher.shape == (5, 10)
    np.testing.assert_allclose(teacher, np.tile(expected, (5, 1)), atol=1e-6)


def _scripted_distillation(accuracies: list[float], settings: DistillSettings):
    """Distil random teacher logits into a linear student whose validation follows a script;
    returns (outcome, student, the student's weights at each validation)."""
    images, info = _digits(64)
    images = ImageArrays(images.images, np.full(64, HIDDEN_LABEL))
    torch.manual_seed(0)
    student = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    teacher = np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32)
    snapshots: list[dict[str, torch.Tensor]] = []

    def validate(model: nn.Module) -> float:
        snapshots.append({k: v.clone() for k, v in model.state_dict().items()})
        return accuracies[len(snapshots) - 1]

    outcome = distil(
        student, images, teacher, info, settings, validate, torch.Generator().manual_seed(0), CPU
    )
    return outcome, student, snapshots


SCRIPT = DistillSettings(
    steps=100, eval_every=2, patience=4, batch_size=16, lr=1e-2, grad_clip=5.0, temperature=1.0
)


def test_distillation_stops_early_and_returns_the_best_on_validation_student() -> None:
    # validations at steps 0, 2, 4, 6, 8: best at step 4; 4 steps later without a better one: stop
    outcome, student, snapshots = _scripted_distillation([0.2, 0.5, 0.9, 0.4, 0.3, 0.95], SCRIPT)
    assert len(snapshots) == 5 and outcome.steps_run == 8 and outcome.stopped_early
    assert outcome.best_step == 4 and outcome.best_accuracy == 0.9 and outcome.start_accuracy == 0.2
    final = student.state_dict()
    for name, value in snapshots[2].items():
        torch.testing.assert_close(final[name], value)
    assert not torch.equal(final["1.weight"], snapshots[4]["1.weight"])  # not the last one


def test_distillation_keeps_the_fedavg_start_when_nothing_beats_it() -> None:
    outcome, student, snapshots = _scripted_distillation([0.9] + [0.1] * 10, SCRIPT)
    assert outcome.best_step == 0 and outcome.steps_run == 4
    torch.testing.assert_close(student.state_dict()["1.weight"], snapshots[0]["1.weight"])


def test_distillation_moves_the_student_towards_the_teacher() -> None:
    settings = DistillSettings(
        steps=60, eval_every=60, patience=60, batch_size=32, lr=1e-2, grad_clip=5.0, temperature=1.0
    )
    outcome, student, snapshots = _scripted_distillation([0.0, 1.0], settings)
    images, info = _digits(64)
    teacher = torch.from_numpy(np.random.default_rng(0).normal(size=(64, 10)).astype(np.float32))
    before = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    before.load_state_dict(snapshots[0])
    gap_before = kd_loss(torch.from_numpy(predict_logits(before, images, info, CPU)), teacher)
    gap_after = kd_loss(torch.from_numpy(predict_logits(student, images, info, CPU)), teacher)
    assert gap_after < 0.8 * gap_before
    assert outcome.steps_run == 60 and not outcome.stopped_early


def test_two_round_federation_of_the_served_prototypes(tmp_path) -> None:
    config = run_config(**(FEDDF_DIGITS | {"out_dir": str(tmp_path), "run_name": "feddf"}))
    cfg, grid, nodes, strategy = local_federation(config, num_nodes=4)
    initial = strategy.initial_state()
    # each node's prototype is the largest candidate its budget affords (budgets 1e4..3e5 MACs)
    served = {p.partition_id: strategy.prototype_of(p) for p in nodes.profiles.values()}
    names = [c.name for c in sorted(set(served.values()), key=lambda c: c.macs)]
    assert [c.name for c in strategy.served] == names and len(names) >= 2
    assert (strategy.public.labels == HIDDEN_LABEL).all()  # the server never uses public labels
    messages = list(strategy.configure_train(1, to_record(initial), ConfigRecord(), grid))
    for message in messages:  # a client receives exactly its own prototype's weights
        prototype = str(message.content["config"]["prototype"])
        sent = from_record(message.content["arrays"])
        assert set(sent) == set(prototype_state(initial, prototype))

    summary = run_experiment(grid, cfg)
    assert summary["test_accuracy"] == summary["population_accuracy"]
    prototypes = {p["name"]: p for p in summary["prototypes"]}
    assert list(prototypes) == names
    for name in names:
        assert prototypes[name]["clients"] == sum(c.name == name for c in served.values())
    expected = np.mean([prototypes[served[pid].name]["accuracy"] for pid in sorted(served)])
    assert summary["test_accuracy"] == pytest.approx(expected, rel=1e-12)
    assert summary["largest_prototype_test_accuracy"] == prototypes[names[-1]]["accuracy"]
    assert len(summary["distillation"]) == 2 * len(names)  # 2 rounds x every prototype
    assert all(row["best_accuracy"] >= row["start_accuracy"] for row in summary["distillation"])
    assert summary["comm"]["client_rounds"] == 8 and summary["compute_proxy_total_macs"] > 0
    assert summary["resources"]["comm_mb_total"] > 0
    files = {p.name for p in (tmp_path / "feddf").iterdir()}
    assert {"variants.csv", "population.csv", "distillation.csv", "communication.csv"} <= files
    saved = json.loads((tmp_path / "feddf" / "summary.json").read_text())
    assert saved["strategy"] == "feddf" and f"val-acc-{names[0]}" in (
        json.loads((tmp_path / "feddf" / "metrics.jsonl").read_text().splitlines()[0])
    )
