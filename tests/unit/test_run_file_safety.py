"""Files written whole or not at all and read back as untrusted, paths kept inside out-dir,
loads that never unpickle code, and a shard cache that no other run's split can leak into.

The whole-run checks (a torn summary, metrics line, checkpoint or model met on resume, two runs
into one folder) are in tests/federation/test_run_file_safety.py.
"""

from __future__ import annotations

import ast
import json
import os
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from local_grid import preset_overrides, run_config

from fedapp.data import registry
from fedapp.data.registry import DatasetUnavailableError, load_dataset
from fedapp.evaluation.results import (
    CHECKPOINT_FILE,
    RunFileError,
    RunRecorder,
    read_json,
    read_jsonl,
    replace_file,
    replace_text,
    write_csv,
)
from fedapp.run.config import ConfigError, parse_run_config, protocol_keys
from fedapp.run.context import data_layout
from fedapp.run.federated_data import (
    CACHE_DIR_ENV,
    _cached_shard,
    client_shard,
    population,
    shard_cache_path,
    shard_settings,
)
from fedapp.sections import key_of

REPO = Path(__file__).resolve().parents[2]


# ---- whole or not at all --------------------------------------------------------------------


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = replace_text(tmp_path / "summary.json", '{"kept": true}\n')

    def torn(tmp: Path) -> None:
        assert tmp.parent == tmp_path and tmp.suffix == ".json"  # beside it, same suffix
        tmp.write_text('{"half": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_file(path, torn)
    assert read_json(path) == {"kept": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_csv_and_json_writers_leave_only_whole_files(tmp_path: Path) -> None:
    rows = [{"round": 1, "accuracy": 0.5}, {"round": 2, "accuracy": 0.75}]
    write_csv(tmp_path / "rows.csv", rows)
    assert (tmp_path / "rows.csv").read_text().splitlines() == [
        "round,accuracy",
        "1,0.5",
        "2,0.75",
    ]
    recorder = RunRecorder(tmp_path)
    recorder.write_json("config.json", {"seed": 1})
    assert read_json(tmp_path / "config.json") == {"seed": 1}
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_temporary_file_a_crash_left_is_removed_when_the_run_starts_again(
    tmp_path: Path,
) -> None:
    leftover = tmp_path / ".summary.4242.tmp.json"
    leftover.write_text('{"half": ')
    RunRecorder(tmp_path)
    assert not leftover.exists()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"round": 1}\n{"round": 2, "acc', "line 2 ends without its newline"),
        ('{"round": 1}\n{"round": 2, "acc\n{"round": 3}\n', "line 2: "),
        ('{"round": 1}\n[1, 2]\n', "line 2 is not a round's row"),
    ],
)
def test_a_torn_or_corrupt_metrics_line_is_an_error_naming_the_file(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(text)
    with pytest.raises(RunFileError) as refused:
        read_jsonl(path)
    assert str(path) in str(refused.value) and "torn or corrupt" in str(refused.value)
    assert reason in str(refused.value)


def test_a_resume_drops_only_a_torn_last_line(tmp_path: Path, caplog) -> None:
    """A crash while appending a round's row leaves it cut short; that round's checkpoint was
    never written, so the row is dropped (and said so) where a complete bad line is an error."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2}\n{"round": 3, "accur')
    recorder = RunRecorder(tmp_path, resume_after=2)
    assert recorder.rows == [{"round": 1}, {"round": 2}]
    assert path.read_text() == '{"round": 1}\n{"round": 2}\n'
    assert f"{path} ends in a torn line" in caplog.text


@pytest.mark.parametrize("text", ['{"seed": 1', '{"seed": 1,}\n', ""])
def test_a_torn_json_file_is_an_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(RunFileError, match=f"{path} is torn or corrupt"):
        read_json(path)


def test_a_torn_checkpoint_or_model_is_an_error_naming_it(tmp_path: Path) -> None:
    recorder = RunRecorder(tmp_path)
    state = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    recorder.save_checkpoint(3, state, {"best": {"round": 2}, "accounts": "{}", "elapsed": 1.5})
    recorder.save_state("model_best.pt", state)
    for name in (CHECKPOINT_FILE, "model_best.pt"):
        whole = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(RunFileError, match=f"{tmp_path / CHECKPOINT_FILE} is torn or corrupt"):
        RunRecorder.load_checkpoint(tmp_path)
    with pytest.raises(RunFileError, match=f"{tmp_path / 'model_best.pt'} is torn or corrupt"):
        RunRecorder.load_state(tmp_path / "model_best.pt")


# ---- loads that never unpickle code ---------------------------------------------------------


def _torch_loads(path: Path) -> list[tuple[int, bool]]:
    """(line, passes weights_only=True) of every torch.load call in a Python file."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
        ):
            safe = any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value
                for k in node.keywords
            )
            calls.append((node.lineno, safe))
    return calls


def test_every_torch_load_in_the_tree_passes_weights_only() -> None:
    files = [
        p
        for top in ("fedapp", "scripts", "benchmarks", "tests")
        for p in (REPO / top).rglob("*.py")
    ]
    calls = {f"{p.relative_to(REPO)}:{line}": safe for p in files for line, safe in _torch_loads(p)}
    assert "fedapp/evaluation/results.py" in " ".join(calls)  # the scan sees fedapp's own load
    assert [where for where, safe in calls.items() if not safe] == []


def test_a_checkpoint_with_its_extras_loads_with_weights_only(tmp_path: Path) -> None:
    state = {"w": np.ones((2, 2), np.float32)}
    extra = {"best": {"round": 1, "val-accuracy": 0.5}, "accounts": "{}", "elapsed": 2.0}
    RunRecorder(tmp_path).save_checkpoint(1, state, extra)
    saved = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)
    assert saved["round"] == 1 and saved["extra"] == extra


# ---- run-name stays inside out-dir ----------------------------------------------------------


def _cfg(tmp_path: Path, **extra: Any):
    return parse_run_config(
        run_config(**preset_overrides("fedavg-digits") | {"out_dir": str(tmp_path)} | extra)
    )


@pytest.mark.parametrize("name", ["../elsewhere", "a/../../b", "/tmp/elsewhere", ".", "./"])
def test_a_run_name_outside_out_dir_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=f"'run-name' = {name!r} is not allowed: must be a rel"):
        _cfg(tmp_path, run_name=name)


@pytest.mark.parametrize("name", ["", "fedavg-iid", "feast/run", "a/b/c"])
def test_run_names_inside_out_dir_are_kept(tmp_path: Path, name: str) -> None:
    assert _cfg(tmp_path, run_name=name).run_name == name  # feast/run: fedapp compare's


# ---- a corrupt .npz -------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "bit flipped", "empty", "not a zip"])
def test_a_corrupt_npz_is_unavailable_naming_the_file(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "own.npz"
    np.savez(path, x_train=np.zeros((10, 8, 8), np.uint8), y_train=np.arange(10))
    whole = path.read_bytes()
    damaged = {
        "truncated": whole[: len(whole) // 2],
        "bit flipped": whole[:200] + bytes([whole[200] ^ 0xFF]) + whole[201:],
        "empty": b"",
        "not a zip": b"hello" * 40,
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(DatasetUnavailableError, match=f"cannot read {path} as an .npz file"):
        load_dataset("npz", str(path))


# ---- the shard cache ------------------------------------------------------------------------

#: A value other than the fedavg-digits preset's for every run-wide protocol key (a new protocol
#: key needs its case here: KeyError).
_OTHER_VALUES: dict[str, Any] = {
    "seed": 12,
    "num-server-rounds": 7,
    "num-clients": 5,
    "fraction-train": 0.75,
    "min-train-clients": 1,
    "dataset": "mnist-5k",
    "data-dir": "/nowhere",
    "partitioner": "dirichlet",
    "dirichlet-alpha": 0.7,
    "shards-per-client": 3,
    "calibration-size": 40,
    "validation-size": 150,
    "public-size": 60,
    "test-size": 250,
    "client-pool-size": 900,
    "budget-min": 3e6,
    "budget-max": 5e7,
    "zipf-s": 0.5,
    "budget-rng": "authors",
    "budget-floor": 4e6,
    "cohort-rng": "authors",
    "gamma": 0.5,
    "allocation-cap": 2e7,
    "device": "cuda",
    "mix-batches": False,
    "eval-every": 3,
    "max-weight-share": 0.5,
}


def _with(tmp_path: Path, **changes: Any):
    config = run_config(**preset_overrides("fedavg-digits") | {"out_dir": str(tmp_path)})
    return parse_run_config(config | changes)


def _config_keys(piece: dict[str, Any]) -> set[str]:
    """The run-config keys a piece (as a dict, nested pieces flattened) holds."""
    keys: set[str] = set()
    for name, value in piece.items():
        if isinstance(value, dict):
            keys |= _config_keys(value)
        else:
            keys.add(key_of(name))
    return keys


def test_every_key_of_the_data_layout_names_another_cache_file(tmp_path: Path) -> None:
    base = _with(tmp_path)
    path = shard_cache_path(data_layout(base), 0)
    held = _config_keys(asdict(data_layout(base)))
    assert held < protocol_keys()  # what cuts a shard is part of every comparison's experiment
    for key in sorted(held):
        value = _OTHER_VALUES[key]
        assert base.as_run_config()[key] != value, key
        assert shard_cache_path(data_layout(_with(tmp_path, **{key: value})), 0) != path, key
    for key in sorted(protocol_keys() - held):  # the rest of the experiment cuts no shard
        changed = _with(tmp_path, **{key: _OTHER_VALUES[key]})
        assert shard_cache_path(data_layout(changed), 0) == path, key
    assert shard_cache_path(data_layout(_with(tmp_path, **{"learning-rate": 0.5})), 0) == path
    # a method's model space cuts no shard: the budgets' floor is a key of its own
    other_supernet = _with(tmp_path, **{"feast-space.supernet": "feast-fmnist"})
    assert shard_cache_path(data_layout(other_supernet), 0) == path


def test_a_changed_data_file_is_never_served_from_the_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    digits = load_dataset("digits").train
    source = tmp_path / "digits.npz"
    np.savez(source, x_train=digits.images[:400, 0], y_train=digits.labels[:400])
    sizes = {"validation-size": 50, "test-size": 50}
    cfg = _with(tmp_path, dataset="npz", **{"data-dir": str(source)} | sizes)
    first = client_shard(data_layout(cfg), 1)
    path = shard_cache_path(data_layout(cfg), 1)
    assert path.is_file()

    # the same path, other images: a later run must cut its shard from the new file
    np.savez(source, x_train=255 - digits.images[:400, 0], y_train=digits.labels[:400])
    os.utime(source, ns=(path.stat().st_mtime_ns + 10**9,) * 2)
    _cached_shard.cache_clear()
    registry._load_cached.cache_clear()
    population.cache_clear()
    assert shard_cache_path(data_layout(cfg), 1) != path
    np.testing.assert_array_equal(client_shard(data_layout(cfg), 1).images, 255 - first.images)


def test_an_unreadable_cached_shard_is_dropped_and_recomputed(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    cfg = _with(tmp_path, seed=21)
    computed = client_shard(data_layout(cfg), 0)
    path = shard_cache_path(data_layout(cfg), 0)
    path.write_bytes(path.read_bytes()[:100])  # torn
    with pytest.raises(zipfile.BadZipFile):
        np.load(path)
    _cached_shard.cache_clear()
    again = client_shard(data_layout(cfg), 0)
    assert f"dropped the unreadable cached shard {path}" in caplog.text
    np.testing.assert_array_equal(again.images, computed.images)
    with np.load(path) as stored:  # replaced by a whole file
        np.testing.assert_array_equal(stored["labels"], computed.labels)


def test_shard_settings_are_json(tmp_path: Path) -> None:
    """The key is a digest of JSON: every setting must have one spelling."""
    settings = shard_settings(data_layout(_with(tmp_path)))
    assert json.loads(json.dumps(settings)) == settings
    assert settings["sources"] and settings["sources"][0][0].endswith("digits.csv.gz")
