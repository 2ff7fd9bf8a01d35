"""scripts/migrate_run_folders.py: a run folder as an earlier fedapp wrote it (flat method keys, no
intervals) becomes, file for file, the folder it is today; one already up to date is left alone."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import shutil
from pathlib import Path

import pytest
from local_grid import APP_DIR, run_config

from fedapp.evaluation.intervals import HIGH, LOW
from fedapp.run.config import ConfigError, config_differences, parse_run_config

SCRIPT = APP_DIR / "scripts" / "migrate_run_folders.py"
KEPT_RUN = APP_DIR / "docs" / "results" / "runs" / "weight-sharing-fmnist" / "feast" / "run"


def _script():
    spec = importlib.util.spec_from_file_location("migrate_run_folders", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat_spellings(config: dict, migration) -> dict:
    """A config.json as fedapp wrote it before method sections (and before the later keys)."""
    new_to_old = {new: old for old, news in migration.SECTIONED_KEYS.items() for new in news}
    return {
        new_to_old.get(key, key): value
        for key, value in config.items()
        if key not in migration.LATER_KEYS
    }


def test_a_config_with_flat_keys_becomes_todays() -> None:
    migration = _script()
    cfg = parse_run_config(run_config(scalefl__kd_weight=0.3, fiarse__grid_points=4))
    today = json.loads(json.dumps(cfg.as_run_config()))
    saved = _flat_spellings(today, migration)
    assert saved["scalefl-kd-gamma"] == 0.3 and saved["fiarse-grid-points"] == 4
    with pytest.raises(ConfigError, match="'scalefl-kd-gamma' is unknown"):
        parse_run_config(saved)  # fedapp itself no longer reads the old spelling
    assert json.loads(json.dumps(migration.current_config(saved).as_run_config())) == today
    assert config_differences(migration.current_config(saved).as_run_config(), cfg) == {}


def _without_intervals(variants_csv: str) -> str:
    rows = list(csv.DictReader(io.StringIO(variants_csv)))
    out = io.StringIO()
    columns = [c for c in rows[0] if c not in (LOW, HIGH, "images")]
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def test_a_kept_run_written_before_sections_and_intervals_migrates_to_its_files(
    tmp_path: Path,
) -> None:
    migration = _script()
    run_dir = tmp_path / "run"
    shutil.copytree(KEPT_RUN, run_dir)
    config, summary = (
        json.loads((KEPT_RUN / name).read_text()) for name in ("config.json", "summary.json")
    )
    old_summary = {
        k: v for k, v in summary.items() if k != "test_images" and not k.endswith("_ci95")
    }
    old_summary["variants"] = [
        {k: v for k, v in point.items() if k not in (LOW, HIGH, "images")}
        for point in summary["variants"]
    ]
    (run_dir / "config.json").write_text(json.dumps(_flat_spellings(config, migration)))
    (run_dir / "summary.json").write_text(json.dumps(old_summary))
    (run_dir / "variants.csv").write_text(
        _without_intervals((KEPT_RUN / "variants.csv").read_text()), newline=""
    )

    assert migration.main([str(tmp_path)]) == 0
    for name in ("config.json", "summary.json", "variants.csv"):
        assert (run_dir / name).read_bytes() == (KEPT_RUN / name).read_bytes(), name
    assert migration.migrate(run_dir, write=False) == []  # up to date: nothing to rewrite


def test_a_folder_it_cannot_read_is_named_and_the_rest_go_on(tmp_path: Path, capsys) -> None:
    migration = _script()
    shutil.copytree(KEPT_RUN, tmp_path / "good")
    shutil.copytree(KEPT_RUN, tmp_path / "torn")
    (tmp_path / "torn" / "config.json").write_text('{"seed": 4')
    shutil.copytree(KEPT_RUN, tmp_path / "no-points")
    (tmp_path / "no-points" / "summary.json").write_text('{"variants": [{"index": 0}]}')
    (tmp_path / "no-points" / "variants.csv").write_text("index\n0\n")
    assert migration.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'torn'}: not migrated" in out and "torn or corrupt" in out
    assert f"{tmp_path / 'no-points'}: not migrated" in out  # a point without its accuracy
    assert f"{tmp_path / 'good'}: up to date" in out
