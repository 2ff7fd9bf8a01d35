"""Architecture encoding, channel arithmetic and supernet configuration files."""

from __future__ import annotations

import numpy as np
import pytest

from fedapp.models.arch import Arch, load_supernet, make_divisible, parse_arch


@pytest.mark.parametrize(
    ("value", "expected"),
    [(6.4, 8), (12.8, 16), (19.2, 24), (38.4, 40), (89.6, 88), (8.8, 8), (9.0, 16), (3.0, 8)],
)
def test_make_divisible_rounds_half_up_and_never_loses_ten_percent(value, expected) -> None:
    assert make_divisible(value, 8) == expected


def test_parse_arch_round_trips_and_accepts_brackets() -> None:
    text = "d=3,7,6,7 e=0.18,0.18,0.1,0.1 w=2,0,0,0,0"
    arch = parse_arch(text)
    assert arch == Arch((3, 7, 6, 7), (0.18, 0.18, 0.1, 0.1), (2, 0, 0, 0, 0))
    assert str(arch) == text
    assert parse_arch("d=[3, 7, 6, 7]; e=[0.18,0.18,0.1,0.1]; w=[2,0,0,0,0]") == arch


@pytest.mark.parametrize("bad", ["d=1,2 e=0.1", "x=1", "d=a,b e=0.1 w=1", ""])
def test_parse_arch_rejects_malformed_text(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_arch(bad)


def test_validate_names_the_offending_part() -> None:
    config = load_supernet("feast-cifar100")
    with pytest.raises(ValueError, match="depths"):
        config.validate(Arch((9, 0, 0, 0), (0.1,) * 4, (0,) * 5))
    with pytest.raises(ValueError, match="width indices"):
        config.validate(Arch((0,) * 4, (0.1,) * 4, (10, 0, 0, 0, 0)))
    with pytest.raises(ValueError, match=r"expansion ratio 0\.3"):
        config.validate(Arch((0,) * 4, (0.3, 0.1, 0.1, 0.1), (0,) * 5))
    with pytest.raises(ValueError, match="needs 4 depths"):
        config.validate(Arch((0,) * 3, (0.1,) * 4, (0,) * 5))


def test_genes_round_trip() -> None:
    config = load_supernet("feast-cifar100")
    rng = np.random.default_rng(0)
    for genes in (rng.random((20, config.num_genes)) * config.gene_high).astype(np.int64):
        assert np.array_equal(config.genes(config.arch_from_genes(genes)), genes)


def test_configs_load_by_name_and_accept_overrides() -> None:
    cifar = load_supernet("feast-cifar100")
    assert (cifar.in_channels, cifar.image_size, cifar.num_classes) == (3, 32, 100)
    assert cifar.stage_sizes == (32, 16, 8, 4)
    tiny = load_supernet("feast-tinyimagenet")
    assert (tiny.image_size, tiny.num_classes, tiny.stem_conv_size) == (64, 200, 64)
    assert tiny.stage_sizes == (32, 16, 8, 4)
    small = load_supernet("feast-small")
    assert (small.in_channels, small.image_size, small.num_classes) == (1, 28, 10)
    assert small.stage_sizes == (28, 14, 7, 4)
    digits = load_supernet("feast-small", image_size=8)
    assert digits.stage_sizes == (8, 4, 2, 1)
    assert load_supernet("feast-cifar100", num_classes=10).num_classes == 10


def test_unknown_supernet_and_fields_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"no supernet 'nope'.*feast-cifar100"):
        load_supernet("nope")
    with pytest.raises(ValueError, match="unknown supernet field"):
        load_supernet("feast-small", colour=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nstem_channels: 8\nwidth: 3\n")
    with pytest.raises(ValueError, match="unknown key"):
        load_supernet(bad)
