"""fedapp's FEAST supernet against an independent build of the authors' network.

The reference network below is written from the published facts alone (docs/methods/feast.md):
stem conv3x3 + BN + ReLU; per stage 1 + d blocks of conv3x3 (stride on the first) + BN + ReLU,
conv3x3 + BN + ReLU, add the shortcut (first block: AvgPool(stride, ceil) + conv1x1 + BN), ReLU;
global average pool and a linear head. Channels are make_divisible(base x w) and middle channels
make_divisible(round(out x e)). fedapp's weights are copied in and the logits must agree.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedapp.models.arch import Arch, SupernetConfig, load_supernet
from fedapp.models.cache import load_cache
from fedapp.models.elastic_resnet import ElasticResNet, ResNet, state_shapes
from fedapp.models.routing import envelope
from fedapp.models.slicing import leading_slice

STEM, BASES, STRIDES = 64, (128, 256, 512, 1024), (1, 2, 2, 2)
WIDTHS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: Reference-cache rows: the smallest, a middle one (33: 352M MACs stated, 522M built), the largest.
INDICES = (0, 33, 55)


def divisible(value: float) -> int:
    """Nearest multiple of 8, at least 8, plus 8 where rounding lost more than 10 %."""
    out = max(8, int(value + 4) // 8 * 8)
    return out + 8 if out < 0.9 * value else out


class ReferenceBlock(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int, first: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(
                nn.AvgPool2d(stride, ceil_mode=True) if stride > 1 else nn.Identity(),
                nn.Conv2d(cin, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            if first
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ReferenceNet(nn.Module):
    def __init__(self, arch: Arch, classes: int) -> None:
        super().__init__()
        stem = divisible(STEM * WIDTHS[arch.w[0]])
        layers: list[nn.Module] = [nn.Conv2d(3, stem, 3, 1, 1, bias=False), nn.BatchNorm2d(stem)]
        cin = stem
        for j, (base, stride) in enumerate(zip(BASES, STRIDES, strict=True)):
            cout = divisible(base * WIDTHS[arch.w[j + 1]])
            mid = divisible(round(cout * arch.e[j]))
            for b in range(1 + arch.d[j]):
                layers.append(ReferenceBlock(cin, mid, cout, stride if b == 0 else 1, b == 0))
                cin = cout
        self.stem_conv, self.stem_bn, *blocks = layers
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem_bn(self.stem_conv(x)))
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def trained_like() -> tuple[SupernetConfig, list[Arch], ElasticResNet]:
    """The authors' supernet over the three variants' envelope, with BN statistics and affine
    parameters drawn at random so that every BN and every ReLU matters."""
    config = load_supernet("feast-cifar100")
    archs = [load_cache("feast-cifar100-reference", config).variants[i].arch for i in INDICES]
    net = ElasticResNet(config, envelope(config, archs), seed=0).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.BatchNorm2d):
                c = module.num_features
                module.weight.copy_(0.5 + torch.rand(c, generator=generator))
                module.bias.copy_(0.2 * torch.randn(c, generator=generator))
                module.running_mean.copy_(0.1 * torch.randn(c, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(c, generator=generator))
    return config, archs, net


def reference_with(net: ElasticResNet, arch: Arch, classes: int) -> ReferenceNet:
    """The reference network for ``arch`` holding fedapp's weights (tensors in build order)."""
    state = net.state_dict()
    shapes = state_shapes(net.config, arch)
    source = [state[name][leading_slice(shape)] for name, shape in shapes.items()]
    reference = ReferenceNet(arch, classes).eval()
    target = reference.state_dict()
    assert [tuple(t.shape) for t in source] == [tuple(t.shape) for t in target.values()]
    reference.load_state_dict(dict(zip(target, source, strict=True)))
    return reference


@pytest.mark.parametrize("position", range(len(INDICES)), ids=[f"variant-{i}" for i in INDICES])
def test_logits_equal_the_authors_network(trained_like, position: int) -> None:
    config, archs, net = trained_like
    arch = archs[position]
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    reference = reference_with(net, arch, config.num_classes)
    net.activate(arch)
    with torch.no_grad():
        expected = reference(x)
        logits = net(x)
    assert expected.std() > 0.05  # logits spread enough for the comparison to mean something
    assert (logits - expected).abs().max() <= 1e-5


def test_the_resnet_block_is_another_network(trained_like) -> None:
    """Without the ReLU after the second BN the same weights give other logits."""
    config, archs, net = trained_like
    other = ResNet(config.with_overrides(block="resnet"), archs[0]).eval()
    state = net.state_dict()
    other.load_state_dict(
        {k: state[k][leading_slice(v.shape)] for k, v in other.state_dict().items()}
    )
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    reference = reference_with(net, archs[0], config.num_classes)
    with torch.no_grad():
        assert (other(x) - reference(x)).abs().max() > 1e-3


def test_initialisation_is_a_setting() -> None:
    """PyTorch's default draws conv weights within 1/sqrt(fan_in); Kaiming (fan-out) does not."""
    small = load_supernet("feast-small")
    arch = small.max_arch()
    conv = ResNet(small.with_overrides(init="pytorch-default"), arch).stages[1][0].conv1.weight
    bound = 1 / (conv.shape[1] * conv.shape[2] * conv.shape[3]) ** 0.5
    assert conv.abs().max() <= bound
    kaiming = ResNet(small.with_overrides(init="kaiming-fan-out"), arch).stages[1][0].conv1
    assert kaiming.weight.abs().max() > bound


@pytest.mark.parametrize(
    ("key", "value"), [("block", "bottleneck"), ("mid_rounding", "ceil"), ("init", "xavier")]
)
def test_bad_supernet_settings_name_what_is_allowed(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"{key} = '{value}' is not one of"):
        load_supernet("feast-small").with_overrides(**{key: value})
