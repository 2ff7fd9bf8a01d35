"""The ResNet18 substrate is a configuration of the elastic family, counted exactly."""

from __future__ import annotations

import pytest
import torch
from local_grid import run_config
from test_models_counter import _torch_macs

from fedapp.data.registry import DatasetInfo
from fedapp.models.arch import Arch, load_supernet
from fedapp.models.counter import count
from fedapp.models.elastic_resnet import ElasticResNet, ResNet, state_shapes
from fedapp.models.substrate import width_arch
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import run_context
from fedapp.run.run_models import substrate_config

HETEROFL_RATES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)


def _built(config, arch: Arch) -> tuple[int, int]:
    model = ResNet(config, arch)
    shape = (config.in_channels, config.image_size, config.image_size)
    return _torch_macs(model, shape), sum(p.numel() for p in model.parameters())


def test_cifar_resnet18_has_the_standard_counts_by_counter_and_by_torch() -> None:
    config = load_supernet("resnet18-cifar")
    full = width_arch(config, 1.0)
    assert full == config.max_arch()
    cost = count(config, full)
    assert (cost.params, cost.macs) == (11_220_132, 555_468_800)
    assert _built(config, full) == (cost.macs, cost.params)


def test_resnet18_layout_basic_blocks_and_identity_shortcuts() -> None:
    config = load_supernet("resnet18-cifar")
    model = ResNet(config, config.max_arch())
    assert [len(stage) for stage in model.stages] == [2, 2, 2, 2]
    # stage 0 keeps 64 channels at stride 1: identity; the others project with a strided 1x1 conv
    assert config.projected == (False, True, True, True)
    assert model.stages[0][0].shortcut is None
    projection = model.stages[1][0].shortcut
    assert isinstance(projection.pool, torch.nn.Identity) and projection.conv.stride == (2, 2)
    block = model.stages[2][1]
    assert block.conv1.weight.shape == block.conv2.weight.shape == (256, 256, 3, 3)
    assert isinstance(model.stem.pool, torch.nn.Identity) and model.stem.conv.stride == (1, 1)


@pytest.mark.parametrize("name", ["resnet18-cifar", "resnet18-tinyimagenet", "resnet18-small"])
def test_every_width_level_counts_like_torch_and_names_leading_slices(name: str) -> None:
    config = load_supernet(name)
    # full-size nets: the counter vs torch at the two extremes only (seconds on one thread)
    rates = config.width_multipliers if name == "resnet18-small" else (1 / 16, 1.0)
    full_shapes = state_shapes(config, config.max_arch())
    for rate in rates:
        arch = width_arch(config, rate)
        cost = count(config, arch)
        assert _built(config, arch) == (cost.macs, cost.params), rate
        for key, shape in state_shapes(config, arch).items():
            assert all(s <= f for s, f in zip(shape, full_shapes[key], strict=True)), key


def test_channels_are_ceil_of_multiplier_times_width_without_divisor() -> None:
    config = load_supernet("resnet18-cifar")
    stem, outs, mids = config.channels(width_arch(config, 0.4))
    assert (stem, outs, mids) == (26, (26, 52, 103, 205), (26, 52, 103, 205))
    assert config.channels(width_arch(config, 1 / 16))[1] == (4, 8, 16, 32)
    assert config.channels(width_arch(config, 0.6))[1] == (39, 77, 154, 308)


def test_small_substrate_spans_the_quickstart_budgets() -> None:
    config = load_supernet("resnet18-small")
    macs = [count(config, width_arch(config, r)).macs for r in HETEROFL_RATES]
    assert macs == [305_786, 941_427, 3_578_676, 13_529_824, 53_962_304]
    assert count(config, config.max_arch()).params == 1_323_684
    tiny = load_supernet("resnet18-tinyimagenet")
    assert (tiny.stem_conv_size, tiny.stage_sizes) == (64, (32, 16, 8, 4))


def test_identity_shortcut_needs_equal_widths_on_both_ends() -> None:
    config = load_supernet("resnet18-small")
    with pytest.raises(ValueError, match="identity shortcut"):
        config.validate(Arch((1,) * 4, (1.0,) * 4, (6, 3, 3, 3, 3)))
    config.validate(Arch((1,) * 4, (1.0,) * 4, (3, 3, 6, 6, 6)))  # projections may change width


def test_elastic_substrate_runs_each_width_as_its_static_slice() -> None:
    config = load_supernet("resnet18-small", image_size=8)
    net = ElasticResNet(config, seed=0).eval()
    x = torch.randn(2, 1, 8, 8)
    for rate in HETEROFL_RATES:
        arch = width_arch(config, rate)
        net.activate(arch)
        assert torch.allclose(net(x), net.subnet(arch).eval()(x), atol=1e-5)


def test_width_arch_rejects_unknown_rates() -> None:
    with pytest.raises(ValueError, match=r"0\.3 is not one of resnet18-small"):
        width_arch(load_supernet("resnet18-small"), 0.3)


def test_run_substrate_is_sized_to_the_data_set_and_checked() -> None:
    cfg = parse_run_config(run_config())
    assert run_context(cfg).substrate == "resnet18-small"
    info = DatasetInfo("digits", 10, 1, 8, (0.5,), (0.25,), "none", False)
    sized = substrate_config(run_context(cfg).substrate, info)
    assert (sized.in_channels, sized.image_size, sized.num_classes) == (1, 8, 10)
    with pytest.raises(ConfigError, match=r"'substrate.supernet' = 'resnet19'.*resnet18-cifar"):
        parse_run_config(run_config(substrate__supernet="resnet19"))
