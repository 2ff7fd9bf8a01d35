"""Elastic supernet: activation, static extraction, gradients and tensor naming."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedapp.models.arch import Arch, load_supernet
from fedapp.models.cache import load_cache
from fedapp.models.elastic_resnet import ElasticResNet, ResNet, state_shapes


@pytest.fixture(scope="module")
def cifar_supernet() -> ElasticResNet:
    return ElasticResNet(load_supernet("feast-cifar100"), seed=0)


def _random_archs(config, n: int, seed: int) -> list[Arch]:
    rng = np.random.default_rng(seed)
    genes = (rng.random((n, config.num_genes)) * config.gene_high).astype(int)
    return [config.arch_from_genes(g) for g in genes]


def _randomise_bn(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial running statistics and affine parameters, so extraction is really tested."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def test_static_subnet_equals_active_supernet_on_cached_variants(cifar_supernet) -> None:
    _randomise_bn(cifar_supernet, 1)
    cache = load_cache("feast-cifar100-reference")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for index in (0, 22, 55):
        arch = cache.variants[index].arch
        cifar_supernet.activate(arch)
        static = cifar_supernet.subnet(arch).eval()
        with torch.no_grad():
            diff = (cifar_supernet.eval()(x) - static(x)).abs().max().item()
        assert diff <= 1e-5, (index, diff)
        assert isinstance(static, ResNet) and not isinstance(static, ElasticResNet)


def test_static_subnet_equals_active_supernet_on_random_archs() -> None:
    config = load_supernet("feast-small")
    net = ElasticResNet(config, seed=3)
    _randomise_bn(net, 2)
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    for arch in _random_archs(config, 8, seed=5):
        net.activate(arch)
        with torch.no_grad():
            diff = (net.eval()(x) - net.subnet(arch).eval()(x)).abs().max().item()
        assert diff <= 1e-5, (arch, diff)


def test_gradients_land_on_the_leading_slices_and_match_the_static_subnet() -> None:
    config = load_supernet("feast-small", image_size=8)
    net = ElasticResNet(config, seed=0).train()
    arch = _random_archs(config, 1, seed=11)[0]
    net.activate(arch)
    static = net.subnet(arch).train()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([0, 1, 2, 3])
    F.cross_entropy(net(x), y).backward()
    F.cross_entropy(static(x), y).backward()
    params = dict(net.named_parameters())
    for name, p in static.named_parameters():
        grad = params[name].grad
        index = tuple(slice(0, n) for n in p.shape)
        torch.testing.assert_close(grad[index], p.grad, rtol=1e-4, atol=1e-6)
        outside = grad.clone()
        outside[index] = 0
        assert outside.abs().max() == 0, name
    # Blocks beyond the active depth get no gradient at all.
    static_names = set(dict(static.named_parameters()))
    assert all(p.grad is None for n, p in params.items() if n not in static_names)


def test_training_updates_only_the_active_running_statistics() -> None:
    config = load_supernet("feast-small", image_size=8)
    net = ElasticResNet(config, seed=0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    arch = Arch((0, 0, 0, 0), (0.25,) * 4, (0, 1, 0, 0, 0))
    net.activate(arch)
    net.train()(torch.randn(4, 1, 8, 8))
    after = net.state_dict()
    stem_c = config.channels(arch)[0]
    assert not torch.equal(
        after["stem.bn.running_mean"][:stem_c], before["stem.bn.running_mean"][:stem_c]
    )
    assert torch.equal(
        after["stem.bn.running_mean"][stem_c:], before["stem.bn.running_mean"][stem_c:]
    )
    assert torch.equal(after["stages.0.1.bn1.running_var"], before["stages.0.1.bn1.running_var"])


def test_state_shapes_name_every_tensor_of_the_module() -> None:
    for name in ("feast-small", "feast-tinyimagenet"):
        config = load_supernet(name)
        for arch in _random_archs(config, 3, seed=9):
            expected = {k: tuple(v.shape) for k, v in ResNet(config, arch).state_dict().items()}
            assert state_shapes(config, arch) == expected


def test_sub_supernet_has_the_shapes_of_its_bounds_and_refuses_larger_archs() -> None:
    config = load_supernet("feast-small")
    bounds = Arch((1, 2, 0, 2), (0.5,) * 4, (1, 2, 3, 0, 1))
    net = ElasticResNet(config, bounds=bounds)
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == state_shapes(config, bounds)
    net.activate(Arch((0, 2, 0, 1), (0.25,) * 4, (1, 0, 3, 0, 0)))
    with pytest.raises(ValueError, match="does not fit"):
        net.activate(Arch((2, 0, 0, 0), (0.25,) * 4, (0,) * 5))
    with pytest.raises(ValueError, match="does not fit"):
        net.subnet(Arch((0, 0, 0, 0), (0.25,) * 4, (0, 0, 0, 1, 0)))


def test_seed_makes_initial_weights_reproducible_without_touching_global_rng() -> None:
    config = load_supernet("feast-small", image_size=8)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = ElasticResNet(config, seed=4).state_dict()
    assert torch.equal(torch.rand(1), expected_next)
    b = ElasticResNet(config, seed=4).state_dict()
    c = ElasticResNet(config, seed=5).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["stem.conv.weight"], c["stem.conv.weight"])
