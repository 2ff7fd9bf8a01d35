"""Variant cache files: YAML round trip, reference import, GA builds and the shipped caches."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedapp.models.arch import CACHES_DIR, Arch, load_supernet
from fedapp.models.cache import (
    Segment,
    build_cache,
    import_cache,
    load_cache,
    save_cache,
)
from fedapp.models.counter import count
from fedapp.models.ga import GAParams

CSV_HEAD = (
    "macs,params,fitness_score,effectiveness,entropy,d,e,w_indices,job_target_macs,job_seed\n"
    '1,1,0,0,0,"[5, 6, 7, 8]","[0.18, 0.1, 0.14, 0.22]","[2, 0, 1, 1, 0]",50000000.0,42\n'
    '1,1,0,0,0,"[3, 7, 6, 7]","[0.18, 0.18, 0.1, 0.1]","[2, 0, 0, 0, 0]",25000000.0,42\n'
)


def test_reference_csv_import_recounts_and_sorts(tmp_path: Path) -> None:
    source = tmp_path / "ref.csv"
    source.write_text(CSV_HEAD)
    cache = import_cache(source, load_supernet("feast-cifar100"))
    assert [v.macs for v in cache.variants] == [24_967_328, 49_587_360]
    assert cache.variants[0].target_macs == 25e6 and cache.variants[0].seed == 42
    assert cache.source == {"method": "import", "file": "ref.csv"}


def test_yaml_round_trip_keeps_everything(tmp_path: Path) -> None:
    cache = load_cache("feast-cifar100-reference")
    path = save_cache(cache, tmp_path / "copy.yaml")
    again = load_cache(path)
    assert again.variants == cache.variants and again.source == cache.source


def test_loading_on_another_supernet_recounts(tmp_path: Path) -> None:
    ten = load_cache("feast-cifar100-reference", load_supernet("feast-cifar100", num_classes=10))
    assert ten.min_macs == 24_957_968 and ten.max_macs == 595_671_072


@pytest.mark.parametrize("path", sorted(CACHES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_caches_store_the_numbers_of_their_supernets(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    config = load_supernet(raw["supernet"], **raw["supernet_overrides"])
    stored = [(v["macs"], v["params"]) for v in raw["variants"]]
    nominal = [v.get("nominal_macs", v["macs"]) for v in raw["variants"]]
    archs = [Arch(tuple(v["d"]), tuple(v["e"]), tuple(v["w"])) for v in raw["variants"]]
    assert stored == [(c.macs, c.params) for c in (count(config, a) for a in archs)]
    assert nominal == [count(config.nominal(), a).macs for a in archs]
    assert nominal == sorted(nominal)


def test_build_is_deterministic_and_independent_of_workers() -> None:
    config = load_supernet("feast-small", image_size=8)
    segments = [Segment.parse("0.3e6:3e6:4:0.31:7")]
    params = GAParams(population=32, generations=8)
    one = build_cache(config, segments, params, workers=1)
    two = build_cache(config, segments, params, workers=2)
    assert one.variants == two.variants
    assert min(one.variants, key=lambda v: v.target_macs).seed == 7
    assert one.source["searches"] == 4
    assert all(v.macs <= v.target_macs for v in one.variants)


@pytest.mark.parametrize("bad", ["1:2:3", "a:b:c:d:e", "5e6:1e6:3:0.3:1", "1:2:0:0.3:1"])
def test_segment_parse_rejects_bad_text(bad: str) -> None:
    with pytest.raises(ValueError, match="segment"):
        Segment.parse(bad)


def test_unknown_cache_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="feast-cifar100-reference"):
        load_cache("nope")
