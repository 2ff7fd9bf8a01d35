"""BN recalibration: exact cumulative averages, determinism, and post-hoc extraction."""

from __future__ import annotations

import torch

from fedapp.models.arch import Arch, load_supernet
from fedapp.models.bn_calibration import recalibrate_bn
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.models.ga import GAParams
from fedapp.models.posthoc import extract_posthoc, posthoc_rho0

CONFIG = load_supernet("feast-small", image_size=8)
ARCH = Arch((1, 0, 2, 1), (0.25, 0.5, 0.25, 0.5), (1, 2, 0, 3, 1))


def _calibration_set() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(n, 1, 8, 8, generator=gen) * 2 + 1 for n in (16, 16, 7)]


def _augmented(batches: list[torch.Tensor]):
    """Random 'transforms' drawn from the global RNG, as a data loader would."""
    for x in batches:
        yield x + 0.1 * torch.randn_like(x), torch.zeros(len(x), dtype=torch.long)


def test_statistics_are_the_sample_weighted_average_of_batch_statistics() -> None:
    subnet = ElasticResNet(CONFIG, seed=0).subnet(ARCH).eval()
    batches = _calibration_set()
    assert recalibrate_bn(subnet, batches) == 39
    with torch.no_grad():
        feats = [subnet.stem.conv(x) for x in batches]
    sizes = torch.tensor([len(x) for x in batches], dtype=torch.float64)
    means = torch.stack([f.double().mean(dim=(0, 2, 3)) for f in feats])
    variances = torch.stack([f.double().var(dim=(0, 2, 3), unbiased=True) for f in feats])
    bn = subnet.stem.bn
    expected_mean = (sizes[:, None] * means).sum(0) / sizes.sum()
    expected_var = (sizes[:, None] * variances).sum(0) / sizes.sum()
    torch.testing.assert_close(bn.running_mean.double(), expected_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var.double(), expected_var, rtol=1e-5, atol=1e-6)
    assert bn.momentum == CONFIG.bn_momentum and not subnet.training


def test_recalibration_is_deterministic_for_a_seed() -> None:
    supernet = ElasticResNet(CONFIG, seed=0)
    batches = _calibration_set()

    def stats(seed: int) -> dict[str, torch.Tensor]:
        subnet = supernet.subnet(ARCH)
        recalibrate_bn(subnet, _augmented(batches), seed=seed)
        return {k: v for k, v in subnet.state_dict().items() if "running" in k}

    a, b, c = stats(3), stats(3), stats(4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_recalibrating_the_active_supernet_changes_only_its_slices() -> None:
    supernet = ElasticResNet(CONFIG, seed=0)
    before = {k: v.clone() for k, v in supernet.state_dict().items()}
    supernet.activate(ARCH)
    recalibrate_bn(supernet, _calibration_set())
    after = supernet.state_dict()
    c = CONFIG.channels(ARCH)[0]
    assert not torch.equal(after["stem.bn.running_mean"][:c], before["stem.bn.running_mean"][:c])
    assert torch.equal(after["stem.bn.running_mean"][c:], before["stem.bn.running_mean"][c:])
    assert torch.equal(after["stages.1.1.bn1.running_mean"], before["stages.1.1.bn1.running_mean"])
    # Same numbers as recalibrating the extracted subnet.
    subnet = ElasticResNet(CONFIG, seed=0).subnet(ARCH)
    recalibrate_bn(subnet, _calibration_set())
    torch.testing.assert_close(after["stem.bn.running_var"][:c], subnet.stem.bn.running_var)


def test_posthoc_extraction_searches_extracts_and_recalibrates() -> None:
    supernet = ElasticResNet(CONFIG, seed=0)
    found, subnet = extract_posthoc(
        supernet, 1.5e6, _calibration_set(), seed=1, params=GAParams(32, 10)
    )
    assert found.macs <= 1.5e6 and found.rho0 == posthoc_rho0(1.5e6) == 0.40
    assert not subnet.training
    reference = supernet.subnet(found.arch)
    recalibrate_bn(reference, _calibration_set(), seed=1)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(subnet(x), reference.eval()(x))
