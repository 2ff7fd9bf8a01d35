"""The FAB that `flwr run .` packs is the fedapp package and its configs, nothing else.

Kept run folders (`fedapp compare --out docs/results/runs/...`) hold a Flower home with an
unpacked copy of the app; if the FAB took them in, the next run would fail on Flower's depth
limit and every FAB would carry the results.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk
from flwr.cli.utils import filter_paths_for_publish
from local_grid import APP_DIR


def _fab_paths(app: Path) -> list[str]:
    with zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))) as fab:
        return fab.namelist()


def test_fab_holds_the_package_and_configs_only() -> None:
    paths = _fab_paths(APP_DIR)
    assert "fedapp/apps/server_app.py" in paths and "conf/quickstart.toml" in paths
    assert not [p for p in paths if p.split("/")[0] in {"docs", "tests", "benchmarks", "scripts"}]


def test_a_kept_run_folder_does_not_enter_the_fab() -> None:
    nested = "docs/results/runs/cmp/feast/flwr-home/apps/fedapp.0.1.0/docs/results/runs/cmp/x/run"
    files = {
        ".gitignore": (APP_DIR / ".gitignore").read_bytes(),
        "pyproject.toml": b"",
        "fedapp/apps/server_app.py": b"",
        f"{nested}/summary.json": b"{}",
    }
    kept = sorted(filter_paths_for_publish(files))
    assert kept == [".gitignore", "fedapp/apps/server_app.py", "pyproject.toml"]
