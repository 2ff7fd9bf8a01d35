"""Routing: affordable sets, envelopes (paper Table 9), the round trip via the sub-supernet."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedapp.models.arch import Arch, load_supernet
from fedapp.models.budgets import BudgetError
from fedapp.models.cache import load_cache
from fedapp.models.elastic_resnet import ElasticResNet, state_shapes
from fedapp.models.routing import affordable, envelope, route
from fedapp.models.slicing import SliceAccumulator, extract


@pytest.mark.parametrize(
    ("index", "millions", "count"),
    [(0, 0.50, 1), (3, 2.41, 4), (22, 10.02, 23), (38, 20.61, 39), (55, 35.60, 56)],
)
def test_envelope_parameters_at_cached_budgets_match_table_9(index, millions, count) -> None:
    cache = load_cache("feast-cifar100-reference")
    r = route(cache, cache.variants[index].nominal_macs)
    assert round(r.params / 1e6, 2) == millions
    assert len(r.affordable) == count and r.largest == index


def test_global_envelope_of_the_reference_cache_is_not_the_full_supernet() -> None:
    cache = load_cache("feast-cifar100-reference")
    env = envelope(cache.config, cache.archs)
    assert env.d == (8, 8, 8, 8) and env.w == (9, 6, 6, 7, 7)


def test_budget_below_the_smallest_variant_is_an_error_that_says_so() -> None:
    cache = load_cache("feast-cifar100-reference")
    with pytest.raises(BudgetError, match=r"below the smallest cached variant \(24,967,328 MACs\)"):
        affordable(cache, 24_967_327)


def test_routed_shapes_are_leading_slices_of_the_global_tensors() -> None:
    cache = load_cache("feast-cifar100-reference")
    full = state_shapes(cache.config, cache.config.max_arch())
    for budget in (25e6, 1.5e9):
        for name, shape in route(cache, budget).shapes.items():
            assert len(shape) == len(full[name])
            assert all(s <= g for s, g in zip(shape, full[name], strict=True))


def test_round_trip_through_the_sub_supernet() -> None:
    """Extract -> client model -> same outputs as the global supernet -> aggregate back."""
    cache = load_cache("feast-small")
    config = cache.config
    supernet = ElasticResNet(config, seed=0).eval()
    global_state = {k: v.numpy().copy() for k, v in supernet.state_dict().items()}
    r = route(cache, cache.variants[4].macs)
    payload = extract(global_state, r.shapes)
    client = ElasticResNet(config, bounds=r.envelope)
    client.load_state_dict({k: torch.from_numpy(v) for k, v in payload.items()})
    client.eval()
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    for i in r.affordable:
        arch = cache.variants[i].arch
        supernet.activate(arch)
        client.activate(arch)
        with torch.no_grad():
            assert (supernet(x) - client(x)).abs().max().item() <= 1e-6
    # The client's whole state folds back by name; unrouted positions keep their values.
    acc = SliceAccumulator(global_state)
    returned = {k: v.numpy() + 1.0 for k, v in client.state_dict().items()}
    acc.add(returned, 10.0)
    new = acc.result()
    w = "stages.3.0.conv1.weight"
    m, c = returned[w].shape[:2]
    np.testing.assert_allclose(new[w][:m, :c], global_state[w][:m, :c] + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(new[w][m:], global_state[w][m:])
    deep = "stages.0.2.conv1.weight"
    if deep not in returned:
        np.testing.assert_array_equal(new[deep], global_state[deep])


def test_envelope_takes_the_largest_depth_and_width_per_position() -> None:
    config = load_supernet("feast-cifar100")
    a = Arch((1, 5, 0, 2), (0.1,) * 4, (3, 0, 4, 1, 0))
    b = Arch((4, 2, 3, 0), (0.22,) * 4, (1, 2, 0, 0, 5))
    assert envelope(config, [a, b]) == Arch((4, 5, 3, 2), (0.25,) * 4, (3, 2, 4, 1, 5))
