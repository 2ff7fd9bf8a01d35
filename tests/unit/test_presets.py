"""Every shipped preset is a valid run config on top of the pyproject defaults."""

from __future__ import annotations

import tomllib

import pytest
from flwr.common.config import flatten_dict
from local_grid import APP_DIR, run_config

from fedapp.run.config import fused_run_config, parse_run_config
from fedapp.run.context import run_context

PRESETS = sorted((APP_DIR / "conf").glob("*.toml"))


def test_there_are_presets() -> None:
    assert {p.stem for p in PRESETS} >= {"quickstart", "fedavg-mnist5k", "fedavg-digits"}


def test_the_defaults_are_the_quickstart() -> None:
    quickstart = flatten_dict(tomllib.loads((APP_DIR / "conf" / "quickstart.toml").read_text()))
    assert parse_run_config(run_config()).as_run_config() | quickstart == (
        parse_run_config(run_config()).as_run_config()
    )


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_is_valid(preset) -> None:
    overrides = flatten_dict(tomllib.loads(preset.read_text()))
    cfg = parse_run_config(fused_run_config(APP_DIR, overrides))
    assert cfg.as_run_config() | overrides == cfg.as_run_config()


#: classes, channels, image size of the GPU presets' data sets (not downloadable here)
HUB_SHAPES = {"cifar100": (100, 3, 32), "cinic10": (10, 3, 32), "tinyimagenet": (200, 3, 64)}


@pytest.mark.parametrize("name", ["feast-cifar100", "feast-cinic10", "feast-tinyimagenet"])
def test_gpu_feast_presets_afford_their_cache(name) -> None:
    from fedapp.data.registry import DatasetInfo
    from fedapp.run.feast_space import model_space

    overrides = tomllib.loads((APP_DIR / "conf" / f"{name}.toml").read_text())
    cfg = parse_run_config(run_config(**{k.replace("-", "_"): v for k, v in overrides.items()}))
    classes, channels, size = HUB_SHAPES[cfg.dataset]
    info = DatasetInfo(cfg.dataset, classes, channels, size, (0.5,) * 3, (0.25,) * 3, "cifar", True)
    spec = run_context(cfg).feast_space
    space = model_space(spec, info)  # loads no data set
    assert len(space.cache) == 56
    if cfg.budget_rng == "authors":  # their draw starts just below the cache, then is raised
        assert 0 < space.cache.min_macs - cfg.budget_min < 10_000
        assert cfg.budget_floor == space.cache.min_macs
    else:
        assert space.cache.min_macs == cfg.budget_min
    assert space.anchors(spec.anchor_variants) == [0, 3, 22, 38, 55]
