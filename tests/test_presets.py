"""Every shipped preset is a valid run config on top of the pyproject defaults."""

from __future__ import annotations

import tomllib

import pytest
from local_grid import APP_DIR, run_config

from fedapp.config import parse_run_config

PRESETS = sorted((APP_DIR / "conf").glob("*.toml"))


def test_there_are_presets() -> None:
    assert {p.stem for p in PRESETS} >= {"fedavg-mnist5k", "fedavg-digits"}


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_is_valid(preset) -> None:
    overrides = tomllib.loads(preset.read_text())
    cfg = parse_run_config(run_config(**{k.replace("-", "_"): v for k, v in overrides.items()}))
    assert cfg.as_run_config() | overrides == cfg.as_run_config()
