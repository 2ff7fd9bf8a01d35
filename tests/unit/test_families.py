"""Candidate families of the client NAS controller: exact costs, shapes, budgets, the model key."""

from __future__ import annotations

import itertools

import pytest
import torch
from local_grid import run_config
from torch.utils.flop_counter import FlopCounterMode

from fedapp.data.registry import DatasetInfo
from fedapp.models.arch import load_supernet
from fedapp.models.budgets import BudgetError
from fedapp.models.counter import count
from fedapp.models.families import (
    FAMILY_NAMES,
    affordable,
    build_candidate,
    candidate_names,
    family_candidates,
    largest_affordable,
)
from fedapp.models.substrate import width_arch
from fedapp.models.zoo import build_model, forward_macs
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import run_context
from fedapp.run.pieces import CandidateFamily
from fedapp.run.run_models import run_family

MNIST = DatasetInfo("mnist-5k", 10, 1, 28, (0.1307,), (0.3081,), "none", False)
DIGITS = DatasetInfo("digits", 10, 1, 8, (0.0,), (1.0,), "none", False)
CIFAR = DatasetInfo("cifar10", 10, 3, 32, (0.5,) * 3, (0.25,) * 3, "cifar", True)


def test_lenet5_costs_match_the_hand_count() -> None:
    # 28x28 MNIST: conv 6@5x5 pad 2 -> 28x28, pool -> 14, conv 16@5x5 -> 10, pool -> 5
    macs = 6 * 28 * 28 * 25 + 16 * 10 * 10 * 6 * 25 + 400 * 120 + 120 * 84 + 84 * 10
    params = (6 * 25 + 6) + (16 * 150 + 16) + (400 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    lenet = {c.name: c for c in family_candidates("lenet5", MNIST, 32)}["lenet5-x1.0"]
    assert (lenet.macs, lenet.params) == (macs, params) == (416_520, 61_706)
    # half width: 3 and 8 channels, 60 and 42 hidden units
    half = {c.name: c for c in family_candidates("lenet5", MNIST, 32)}["lenet5-x0.5"]
    assert half.macs == 3 * 784 * 25 + 8 * 100 * 75 + 200 * 60 + 60 * 42 + 42 * 10


@pytest.mark.parametrize("info", [MNIST, DIGITS, CIFAR], ids=lambda i: i.name)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_candidate_builds_for_the_input_and_is_sorted_by_macs(family, info) -> None:
    candidates = family_candidates(family, info, batch_size=8)
    assert [c.macs for c in candidates] == sorted(c.macs for c in candidates)
    assert all(c.family == family for c in candidates)
    smallest = build_candidate(candidates[0].name, info).eval()
    with torch.no_grad():
        out = smallest(torch.zeros(2, info.channels, info.image_size, info.image_size))
    assert out.shape == (2, info.num_classes)
    assert sum(p.numel() for p in smallest.parameters()) == candidates[0].params


def test_forward_macs_of_any_model_name_leaves_the_global_rng_alone() -> None:
    """The compute proxy's unit: a candidate's counted MACs, a conf CNN's FLOP count / 2; the
    throw-away build does not shift the seeded training that follows it."""
    candidate = family_candidates("lenet5", MNIST, batch_size=8)[0]
    cnn = build_model("cnn-small", CIFAR)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        cnn(torch.zeros(1, CIFAR.channels, CIFAR.image_size, CIFAR.image_size))
    torch.manual_seed(0)
    expected_draw = torch.rand(1)
    torch.manual_seed(0)
    assert forward_macs(candidate.name, MNIST) == candidate.macs
    assert forward_macs("cnn-small", CIFAR) == counter.get_total_flops() // 2 > 0
    assert torch.equal(torch.rand(1), expected_draw)


def test_wider_candidates_cost_more_and_memory_grows_with_the_batch() -> None:
    small = family_candidates("mobilenetv2", MNIST, batch_size=8)
    large = family_candidates("mobilenetv2", MNIST, batch_size=64)
    assert [c.multiplier for c in small] == [0.25, 0.35, 0.5, 0.75, 1.0]
    assert all(a.params < b.params for a, b in itertools.pairwise(small))
    pairs = zip(small, large, strict=True)
    assert all(s.train_memory_bytes < g.train_memory_bytes for s, g in pairs)
    # weights + gradients + momentum are the floor of the estimate
    assert all(c.train_memory_bytes > 12 * c.params for c in small)


def test_affordable_respects_macs_and_memory_budgets() -> None:
    candidates = family_candidates("lenet5", MNIST, 32)
    budget = candidates[2].macs
    assert [c.name for c in affordable(candidates, budget)] == [c.name for c in candidates[:3]]
    memory = candidates[1].train_memory_bytes
    assert [c.name for c in affordable(candidates, budget, memory)] == [
        c.name for c in candidates[:2]
    ]
    assert largest_affordable(candidates, budget + 1).name == candidates[2].name
    with pytest.raises(BudgetError, match=r"below the smallest candidate lenet5-x0\.25"):
        largest_affordable(candidates, candidates[0].macs - 1)


def _family(**overrides: object) -> CandidateFamily:
    return run_context(parse_run_config(run_config(**overrides))).family


def test_auto_family_follows_the_data_set_and_the_key_is_checked() -> None:
    assert run_family(_family(dataset="digits"), DIGITS) == "lenet5"
    assert run_family(_family(dataset="cifar10"), DIGITS) == "mobilenetv2"  # the paper's pick
    assert run_family(_family(candidates__family="shufflenetv2"), DIGITS) == "shufflenetv2"
    own_files = CandidateFamily(family="auto", dataset="npz", batch_size=32)
    assert run_family(own_files, DIGITS) == "lenet5"  # other data: by its channels
    assert run_family(own_files, CIFAR) == "mobilenetv2"
    with pytest.raises(ConfigError, match=r"candidates\.family"):
        parse_run_config(run_config(candidates__family="vgg"))


def test_model_key_accepts_candidates_through_one_builder() -> None:
    assert "lenet5-x0.5" in candidate_names()
    assert parse_run_config(run_config(model="lenet5-x0.5")).model == "lenet5-x0.5"
    assert isinstance(build_model("lenet5-x0.5", DIGITS), torch.nn.Module)
    assert build_model("cnn-small", DIGITS)(torch.zeros(1, 1, 8, 8)).shape == (1, 10)
    with pytest.raises(ConfigError, match="'model'"):
        parse_run_config(run_config(model="lenet7"))


@pytest.mark.parametrize("info", [MNIST, CIFAR], ids=lambda i: i.name)
def test_resnet18_widths_cost_what_the_substrate_counter_says(info) -> None:
    config = load_supernet(
        "resnet18-cifar",
        in_channels=info.channels,
        image_size=info.image_size,
        num_classes=info.num_classes,
    )
    candidates = family_candidates("resnet18", info, 32)
    assert [c.multiplier for c in candidates] == [0.125, 0.25, 0.5, 1.0]
    for candidate in candidates:
        cost = count(config, width_arch(config, candidate.multiplier))
        assert (candidate.macs, candidate.params) == (cost.macs, cost.params)
    if info is CIFAR:  # the standard CIFAR ResNet18 at 10 classes
        assert candidates[-1].params == 11_173_962


@pytest.mark.parametrize(
    ("name", "lr"),
    [
        # lr 0.05 with momentum diverges for the BN families on batches of 8; 0.01 trains them
        ("mobilenetv2-x0.25", 0.01),
        ("mobilenetv2-x1.0", 0.01),
        ("shufflenetv2-x0.5", 0.01),
        ("shufflenetv2-x1.0", 0.01),
        ("lenet5-x1.0", 0.05),
        ("resnet18-x0.125", 0.01),
    ],
)
def test_every_candidate_family_trains_on_cifar_shaped_tensors(name, lr) -> None:
    """The paper's CIFAR backbones (MobileNetV2, ShuffleNetV2) and the MNIST ones (LeNet5,
    ResNet18): one short local training through the clients' loop lowers the loss."""
    from fedapp.training.loops import train_supervised

    torch.manual_seed(0)
    x = torch.randn(16, CIFAR.channels, CIFAR.image_size, CIFAR.image_size)
    y = torch.randint(0, CIFAR.num_classes, (16,))
    model = build_candidate(name, CIFAR)
    batches = [(x[:8], y[:8]), (x[8:], y[8:])]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    first = train_supervised(model, batches, optimizer, 1, torch.device("cpu")).loss
    later = train_supervised(model, batches, optimizer, 12, torch.device("cpu"))
    last = train_supervised(model, batches, optimizer, 1, torch.device("cpu")).loss
    assert later.steps == 24 and later.examples == 192
    assert last < 0.7 * first, (name, first, last)
