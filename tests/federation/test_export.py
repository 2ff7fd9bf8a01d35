"""``fedapp export`` on short real digits runs of every method, and the device's runner.

Each method runs once, one round, through the real ServerApp and ClientApp (module fixture);
its exported file is then run by onnxruntime or ``torch.jit.load`` here and its accuracy on the
run's test split compared with what the run's own final test recorded for that point in
summary.json: a wrong point, a missing BN recalibration or a wrong normalisation would move it.

The runner (scripts/deploy/serve_onnx.py) runs in a subprocess whose imports of torch, Flower
and fedapp fail (a ``sitecustomize`` on its path refuses them, and its own timing processes
inherit that): what it imports beyond onnxruntime and NumPy would stop it. A fresh venv with
only those two packages would prove the same only with PyPI or a warm pip cache at hand, and
costs half a minute; docs/deployment.md measures such a venv once.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch
from digits_runs import (
    DIGITS_FEAST,
    DIGITS_FEDDISTILL,
    DIGITS_FIARSE,
    DIGITS_HETEROFL,
    DIGITS_SCALEFL,
    DITTO_DIGITS,
    FEDDF_DIGITS,
    SMALL_FEDAVG,
)
from local_grid import APP_DIR, preset_overrides, run_config, run_local

from fedapp.tools import export
from fedapp.tools.cli import main

FEDAVG_DIGITS = preset_overrides("fedavg-digits") | SMALL_FEDAVG
#: A short run of every method that serves models from the server's state, and its nodes.
SERVED: dict[str, tuple[dict[str, Any], int]] = {
    "feast": (DIGITS_FEAST | {"num_clients": 3}, 3),
    "superfednas": (DIGITS_FEAST | {"strategy": "superfednas", "num_clients": 3}, 3),
    "deepfednas": (DIGITS_FEAST | {"strategy": "deepfednas", "num_clients": 3}, 3),
    "heterofl": (DIGITS_HETEROFL | {"num_clients": 3}, 3),
    "scalefl": (DIGITS_SCALEFL, 4),
    "fiarse": (DIGITS_FIARSE | {"num_clients": 3}, 3),
    "feddf": (FEDDF_DIGITS, 4),
    "fedavg": (FEDAVG_DIGITS, 4),
    "ditto": (DITTO_DIGITS, 4),
    "flwr:fedadam": (FEDAVG_DIGITS | {"strategy": "flwr:fedadam"}, 4),
}
CLIENT_HELD = {"feddistill": (DIGITS_FEDDISTILL, 3)}
RUNNER = APP_DIR / "scripts" / "deploy" / "serve_onnx.py"

RunOf = Callable[[str], Path]


@pytest.fixture(scope="module")
def run_of(tmp_path_factory: pytest.TempPathFactory) -> RunOf:
    """The folder of a method's one-round run, run on first use and shared by the module."""
    out = tmp_path_factory.mktemp("runs")
    done: dict[str, Path] = {}

    def run(method: str) -> Path:
        if method not in done:
            overrides, nodes = (SERVED | CLIENT_HELD)[method]
            name = method.replace(":", "-")
            config = run_config(
                **overrides | {"num_server_rounds": 1, "out_dir": str(out), "run_name": name}
            )
            run_local(config, num_nodes=nodes)
            done[method] = out / name
        return done[method]

    return run


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file of a folder by its sha256."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def _recorded_accuracy(summary: dict[str, Any], point: int) -> float:
    """The run's final-test accuracy of a point: its row, or the global model's."""
    rows = {row["index"]: row["accuracy"] for row in summary.get("variants", [])}
    return rows[point] if rows else summary.get("global_test_accuracy", summary["test_accuracy"])


def _labels(path: Path, images: np.ndarray, per_image: bool = False) -> np.ndarray:
    """What the exported file predicts, run as a device runs it (all images in one call, or
    one image per call)."""
    if path.suffix == ".onnx":
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        calls = np.split(images, len(images)) if per_image else [images]
        return np.concatenate([session.run(None, {"images": x})[0].argmax(1) for x in calls])
    with torch.no_grad():
        return torch.jit.load(str(path))(torch.from_numpy(images)).argmax(1).numpy()


def _export(run_dir: Path, out: Path, *options: str) -> dict[str, Any]:
    assert main(["export", str(run_dir), *options, "--out", str(out), "--json"]) == 0
    return json.loads((out / "manifest.json").read_text())


def _test_split(run_dir: Path) -> Any:
    return export.read_run(run_dir).test_split()


@pytest.mark.parametrize("method", list(SERVED))
def test_each_method_exports_a_point_that_predicts_what_its_run_measured(
    method: str, run_of: RunOf, tmp_path: Path
) -> None:
    run_dir = run_of(method)
    before = _snapshot(run_dir)
    summary = _summary(run_dir)
    indices = [row["index"] for row in summary.get("variants", [])] or [0]
    point = indices[len(indices) // 2]  # a sub-model where the method has several
    test = _test_split(run_dir)
    for fmt in export.FORMATS:
        manifest = _export(run_dir, tmp_path / fmt, "--point", str(point), "--format", fmt)
        (entry,) = manifest["models"]
        path = tmp_path / fmt / entry["file"]
        assert (
            entry["point"] == point
            and entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        )
        recorded = _recorded_accuracy(summary, point)
        assert entry["test_accuracy"] == recorded and len(entry["test_accuracy_ci95"]) == 2
        accuracy = float(np.mean(_labels(path, test.images) == test.labels))
        assert accuracy == pytest.approx(recorded, abs=1e-3), (method, fmt)
        assert entry["check"]["agreement"] >= 0.999 and entry["check"]["images"] == len(test.labels)
        assert manifest["input"]["dtype"] == "uint8" and manifest["input"]["shape"][0] == "batch"
    assert _snapshot(run_dir) == before  # export only reads the run folder


def test_ditto_exports_its_global_model_with_the_global_accuracy(
    run_of: RunOf, tmp_path: Path
) -> None:
    run_dir = run_of("ditto")
    manifest = _export(run_dir, tmp_path / "ditto", "--all", "--format", "torchscript")
    summary = _summary(run_dir)
    (entry,) = manifest["models"]
    assert entry["test_accuracy"] == summary["global_test_accuracy"]
    assert entry["test_accuracy_ci95"] == summary["global_test_accuracy_ci95"]


def test_all_int8_and_the_choice_of_a_point_by_macs_and_by_budget(
    run_of: RunOf, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = run_of("heterofl")
    rows = _summary(run_dir)["variants"]
    manifest = _export(run_dir, tmp_path / "all", "--all", "--int8")
    test = _test_split(run_dir)
    assert [m["point"] for m in manifest["models"]] == [r["index"] for r in rows]
    for entry in manifest["models"]:
        int8 = entry["int8"]
        labels = _labels(tmp_path / "all" / int8["file"], test.images, per_image=True)
        assert int8["accuracy"] == pytest.approx(np.mean(labels == test.labels))
        assert int8["bytes"] < entry["bytes"]
    limit = (rows[1]["macs"] + rows[2]["macs"]) / 2
    by_macs = _export(
        run_dir, tmp_path / "by-macs", "--macs", str(limit), "--format", "torchscript"
    )
    assert by_macs["models"][0]["point"] == rows[1]["index"]  # the largest within the limit
    best = max((r for r in rows if r["nominal_macs"] <= limit), key=lambda r: r["accuracy"])
    by_budget = _export(run_dir, tmp_path / "b", "--budget", str(limit), "--format", "torchscript")
    assert by_budget["models"][0]["point"] == best["index"]  # the most accurate within it
    for option, value in (("--budget", "1e3"), ("--macs", "1e3"), ("--point", "99")):
        out = tmp_path / f"refused-{option.strip('-')}"
        assert main(["export", str(run_dir), option, value, "--out", str(out)]) == 2
        message = capsys.readouterr().err
        assert ("the smallest needs 23,861 MACs" if value == "1e3" else "no point 99") in message
        assert not out.exists()


def test_a_method_whose_models_live_on_the_clients_says_so(
    run_of: RunOf, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["export", str(run_of("feddistill")), "--all", "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert "'feddistill' keeps its models on the clients" in message
    assert "Traceback" not in message and not out.exists()


def test_folders_that_are_not_finished_runs_and_outs_it_will_not_write(
    run_of: RunOf, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = run_of("fedavg")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    for name in ("config.json", "model_best.pt"):  # a run that never reached its final test
        (unfinished / name).write_bytes((run_dir / name).read_bytes())
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [
        (tmp_path / "nothing", tmp_path / "o1", "not the folder of a finished run"),
        (unfinished, tmp_path / "o2", "has no summary.json: not the folder of a finished run"),
        (run_dir, run_dir / "exported", "inside the run folder"),
        (run_dir, taken, "exists and is not an empty folder"),
    ]
    for source, out, expected in cases:
        assert main(["export", str(source), "--all", "--out", str(out)]) == 2
        assert expected in capsys.readouterr().err
    assert not (run_dir / "exported").exists() and [p.name for p in taken.iterdir()] == ["keep.txt"]


def test_a_file_that_fails_its_check_is_an_error_that_leaves_no_out(
    run_of: RunOf,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(export, "LOGIT_TOLERANCE", 0.0)  # onnxruntime's float32 is never exact
    out = tmp_path / "exports" / "out"
    assert main(["export", str(run_of("feast")), "--point", "8", "--out", str(out)]) == 2
    message = capsys.readouterr().err
    assert "point 8 as onnx does not predict what fedapp does" in message
    assert "max |logit difference|" in message and "nothing was written" in message
    assert list((tmp_path / "exports").iterdir()) == []  # neither out nor its staging folder


def _env_without(tmp_path: Path, packages: set[str], path: str = "") -> dict[str, str]:
    """An environment whose Python refuses to import ``packages`` (and finds ``path``)."""
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {sorted(packages)!r}:\n"
        "            raise ModuleNotFoundError(f'{name} is not on this device', name=name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
    )
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(blocker), path])))


def test_an_install_without_the_export_extra_is_told_which_to_add(tmp_path: Path) -> None:
    env = _env_without(tmp_path, {"onnxruntime", "onnxscript", "onnx"}, str(APP_DIR))
    command = ["export", str(tmp_path), "--all", "--out", str(tmp_path / "out")]
    result = subprocess.run(
        [sys.executable, "-m", "fedapp.tools.cli", *command],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert 'pip install "fedapp[export]"' in result.stderr


def _serve(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(RUNNER), *args], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_device_runner_needs_only_onnxruntime_and_numpy_and_its_latencies_choose_a_point(
    run_of: RunOf, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = _env_without(tmp_path, {"torch", "flwr", "fedapp"})
    refused = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True
    )
    assert "torch is not on this device" in refused.stderr  # the blocker works
    run_dir = run_of("heterofl")
    exported = tmp_path / "exported"
    manifest = _export(run_dir, exported, "--all")
    table = tmp_path / "latencies.csv"
    _serve(env, "measure", str(exported), "--batch", "1", "--batch", "8", "--repeats", "3",
           "--warmup", "1", "--out", str(table))  # fmt: skip
    rows = list(csv.DictReader(table.open()))
    assert {(int(r["point"]), int(r["batch"])) for r in rows} == {
        (m["point"], b) for m in manifest["models"] for b in (1, 8)
    }
    assert all(float(r["ms_per_image"]) > 0 and float(r["process_peak_mb"]) > 0 for r in rows)

    test = _test_split(run_dir)
    np.save(tmp_path / "images.npy", test.images)
    entry = manifest["models"][-1]
    _serve(env, "predict", str(exported / entry["file"]), str(tmp_path / "images.npy"),
           "--out", str(tmp_path / "labels.npy"))  # fmt: skip
    labels = np.load(tmp_path / "labels.npy")
    assert np.mean(labels == test.labels) == pytest.approx(entry["check"]["exported_accuracy"])

    accuracy = {r["index"]: r["accuracy"] for r in _summary(run_dir)["variants"]}
    batch1 = {int(r["point"]): float(r["ms_per_image"]) for r in rows if r["batch"] == "1"}
    for limit in sorted(batch1.values()):
        expected = max((p for p, ms in batch1.items() if ms <= limit), key=accuracy.__getitem__)
        chosen = _export(run_dir, tmp_path / f"at-{limit}", "--latency-ms", str(limit),
                         "--latencies", str(table), "--format", "torchscript")  # fmt: skip
        assert chosen["models"][0]["point"] == expected
    other = tmp_path / "other"
    assert main(["export", str(run_of("scalefl")), "--latency-ms", "1e3", "--latencies",
                 str(table), "--out", str(other)]) == 2  # fmt: skip
    assert "a latency table of another run" in capsys.readouterr().err
