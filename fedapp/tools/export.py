"""``fedapp export``: serve each device the model it can afford, as one standalone file.

A finished run's state (``model_best.pt``, the checkpoint its final test measured) holds every
model its method serves: FEAST's and the SuperFedNAS/DeepFedNAS transfers' cached variants,
HeteroFL's widths, ScaleFL's levels (each with its deepest exit), FIARSE's masked models (dense,
pruned weights zero), FedDF's prototypes, the global model of FedAvg, Ditto and Flower's
strategies. The method itself lists them (``servable_points``), built exactly as its final test
built them (BN recalibrated where the point keeps statistics), so the exported network is the
measured one. Each is wrapped with fedapp's input normalisation (uint8 NCHW pixels in, logits
out, any batch size) and written as ONNX or TorchScript, then verified: the file, run by
onnxruntime or ``torch.jit.load``, must predict what fedapp's own model predicts on the run's
test split (:data:`MIN_AGREEMENT` of the images, accuracy within :data:`MAX_ACCURACY_GAP`,
logits within :data:`LOGIT_TOLERANCE`). Files and ``manifest.json`` are written into a
temporary folder beside ``--out`` and moved there whole only when every check passed; the run
folder is only read.

Which point: ``--point`` by index, ``--macs`` the largest point within a MAC count (the papers'
largest-affordable serving), ``--budget`` the most accurate point a budget affords (the FEAST
authors' serving), ``--latency-ms`` with ``--latencies`` the most accurate point whose batch-1
latency, measured on the device by ``scripts/deploy/serve_onnx.py``, is within the limit, or
``--all``. "Most accurate" reads the test accuracies of the run's summary.json, the only
per-point accuracies a run keeps: a choice made on them is biased upwards, as the summary's own
``population_accuracy_best_affordable`` is.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import asdict, dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedapp.data.extras import EXPORT, needs_extra
from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.data.transforms import Normalise
from fedapp.evaluation.intervals import HIGH, LOW, SUMMARY_SUFFIX
from fedapp.evaluation.operating_points import OperatingPoint
from fedapp.evaluation.results import (
    BEST_MODEL_FILE,
    CONFIG_FILE,
    SUMMARY_FILE,
    RunRecorder,
    read_json,
)
from fedapp.methods.common.strategy import HeterogeneousStrategy, build_strategy, point_evaluator
from fedapp.run.config import APP_DIR, ConfigError, fused_run_config, parse_saved_config
from fedapp.run.federated_data import server_set
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.training.distillation import predict_logits

FORMATS = ("onnx", "torchscript")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".pt"}
MANIFEST_FILE = "manifest.json"
INPUT_NAME, OUTPUT_NAME = "images", "logits"

#: An exported file passes when it predicts fedapp's label on at least this share of the test
#: images, its accuracy is within MAX_ACCURACY_GAP of fedapp's, and no logit differs by more
#: than LOGIT_TOLERANCE times the largest |logit| (at least 1): float32 arithmetic that the
#: runtime reorders or fuses (conv + BN) drifts with the logits' size.
MIN_AGREEMENT = 0.999
MAX_ACCURACY_GAP = 0.001
LOGIT_TOLERANCE = 1e-4
#: Images per call when running an exported file over the test split.
CHECK_BATCH = 256


class ExportCheckFailed(ValueError):
    """An exported file does not predict what fedapp's evaluation of its point predicts."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="a finished run's folder (<out-dir>/<run-name>)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--point", type=int, help="the operating point with this index")
    which.add_argument("--macs", type=float, help="the largest point within this many MACs")
    which.add_argument("--budget", type=float, help="the most accurate point within this budget")
    which.add_argument(
        "--latency-ms",
        type=float,
        help="the most accurate point within this batch-1 latency (needs --latencies)",
    )
    which.add_argument("--all", action="store_true", help="every operating point")
    parser.add_argument(
        "--latencies",
        type=Path,
        help="a device's latency table (scripts/deploy/serve_onnx.py measure) of this run's points",
    )
    parser.add_argument("--format", choices=FORMATS, default="onnx")
    parser.add_argument(
        "--int8", action="store_true", help="also an int8 ONNX file (dynamic quantisation)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder to create (absent or empty)"
    )


# ---- the run's points -------------------------------------------------------------------------


@dataclass(frozen=True)
class FinishedRun:
    """A finished run read back: its summary, its strategy rebuilt on the nodes it profiled, and
    the checkpoint its final test measured."""

    run_dir: Path
    summary: dict[str, Any]
    strategy: HeterogeneousStrategy
    state: dict[str, np.ndarray]

    @property
    def info(self) -> DatasetInfo:
        return self.strategy.info

    def test_split(self) -> ImageArrays:
        return server_set(self.strategy.run.data, "test")

    def figures(self, point: OperatingPoint) -> dict[str, Any]:
        """The run's test accuracy of a point and its 95 % interval, from summary.json: the
        point's row where the method reports several, else the global model's accuracy (for
        Ditto its global model's, not the personal models' mean)."""
        rows = {row["index"]: row for row in self.summary.get("variants", [])}
        if rows:
            if point.index not in rows:
                raise ConfigError(f"{self.run_dir}: summary.json has no row of point {point.index}")
            row = rows[point.index]
            return {"test_accuracy": row["accuracy"], "test_accuracy_ci95": [row[LOW], row[HIGH]]}
        key = "global_test_accuracy" if "global_test_accuracy" in self.summary else "test_accuracy"
        return {
            "test_accuracy": self.summary[key],
            "test_accuracy_ci95": self.summary.get(key + SUMMARY_SUFFIX),
        }


def read_run(run_dir: Path) -> FinishedRun:
    """The finished run in ``run_dir``; ConfigError naming what makes it none."""
    run_dir = run_dir.expanduser()
    for name in (CONFIG_FILE, SUMMARY_FILE, BEST_MODEL_FILE):
        if not (run_dir / name).is_file():
            raise ConfigError(
                f"{run_dir} has no {name}: not the folder of a finished run "
                "(give <out-dir>/<run-name> of a run that ran its final test)"
            )
    cfg = parse_saved_config(read_json(run_dir / CONFIG_FILE), fused_run_config(APP_DIR, {}))
    summary = read_json(run_dir / SUMMARY_FILE)
    if "node_profiles" not in summary:
        raise ConfigError(f"{run_dir}: summary.json lists no node_profiles (an older fedapp's)")
    strategy = build_strategy(cfg, profiled_nodes(cfg.num_clients, summary))
    return FinishedRun(
        run_dir, summary, strategy, RunRecorder.load_state(run_dir / BEST_MODEL_FILE)
    )


def profiled_nodes(num_clients: int, summary: Mapping[str, Any]) -> NodeRegistry:
    """The nodes the run profiled, as its summary recorded them (partition id as node id):
    the points of some methods depend on them (FIARSE's grid starts at the smallest budget)."""
    nodes = NodeRegistry(num_clients)
    for p in summary["node_profiles"]:
        pid = int(p["partition"])
        nodes.profiles[pid] = NodeProfile(
            pid, pid, num_clients, int(p["examples"]), float(p["budget"]), str(p["device"])
        )
    return nodes


def chosen_points(
    run: FinishedRun, points: Sequence[OperatingPoint], args: argparse.Namespace
) -> list[OperatingPoint]:
    """The points the command line asks for; ConfigError for a choice the run cannot meet."""
    if args.all:
        return list(points)
    if args.point is not None:
        by_index = {p.index: p for p in points}
        if args.point not in by_index:
            raise ConfigError(
                f"no point {args.point} in {run.run_dir}: its points are "
                f"{', '.join(str(i) for i in by_index)}"
            )
        return [by_index[args.point]]
    if args.latency_ms is not None:
        return [fastest_enough(run, points, args.latencies, args.latency_ms)]
    limit = args.macs if args.macs is not None else args.budget
    affordable = [p for p in points if served_macs(p) <= limit]
    if not affordable:
        smallest = min(served_macs(p) for p in points)
        raise ConfigError(
            f"{'--macs' if args.macs is not None else '--budget'} {limit:,.0f} affords no point "
            f"of {run.run_dir}: the smallest needs {smallest:,} MACs"
        )
    if args.macs is not None:
        return [max(affordable, key=served_macs)]
    return [max(affordable, key=lambda p: run.figures(p)["test_accuracy"])]


def served_macs(point: OperatingPoint) -> int:
    """The MACs by which a budget affords the point (a cache's nominal figure where it has one)."""
    return point.macs if point.nominal_macs is None else point.nominal_macs


def fastest_enough(
    run: FinishedRun, points: Sequence[OperatingPoint], table: Path | None, limit_ms: float
) -> OperatingPoint:
    """The most accurate point whose float32 file ran one image within ``limit_ms`` on the
    device that measured ``table``; the table must measure points of this run."""
    if table is None:
        raise ConfigError("--latency-ms needs --latencies (a table of serve_onnx.py measure)")
    by_index = {p.index: p for p in points}
    measured: dict[int, float] = {}
    with table.expanduser().open(newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                index, macs, batch = int(row["point"]), int(row["macs"]), int(row["batch"])
                precision, ms = row["precision"], float(row["ms_per_image"])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(
                    f"{table} is not a latency table of serve_onnx.py measure (columns point, "
                    f"macs, precision, batch, ms_per_image): {dict(row)}"
                ) from None
            if index not in by_index or macs != by_index[index].macs:
                raise ConfigError(
                    f"{table} measures point {index} of {macs:,} MACs, which {run.run_dir} does "
                    "not have: a latency table of another run"
                )
            if precision == "float32" and batch == 1:
                measured[index] = ms
    if not measured:
        raise ConfigError(f"{table} has no float32 measurement at batch 1")
    fast = [by_index[i] for i, ms in measured.items() if ms <= limit_ms]
    if not fast:
        raise ConfigError(
            f"no point measured in {table} runs one image within {limit_ms:g} ms "
            f"(the quickest: {min(measured.values()):.3f} ms)"
        )
    return max(fast, key=lambda p: run.figures(p)["test_accuracy"])


# ---- files --------------------------------------------------------------------------------------


class ServedNetwork(nn.Module):
    """A point's network with fedapp's evaluation normalisation inside: a device feeds the
    data set's uint8 pixels (N, C, H, W) and gets logits, as fedapp's evaluation computes them."""

    def __init__(self, model: nn.Module, info: DatasetInfo) -> None:
        super().__init__()
        self.model = model
        self.normalise = Normalise(info)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(self.normalise(images))


def write_onnx(network: nn.Module, example: torch.Tensor, path: Path) -> None:
    """ONNX by torch's ``torch.export``-based exporter (``dynamo=True``), not the legacy
    TorchScript-based one: torch 2.9+ deprecates that and says it will be removed, while this one
    gave the same bytes for the same model in every run tried here. The batch axis is dynamic;
    the weights live inside the file (no external data)."""
    batch = torch.export.Dim("batch")
    with redirect_stdout(StringIO()):  # its progress lines are not ours to print
        program = torch.onnx.export(
            network,
            (example,),
            dynamo=True,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: batch},),
            external_data=False,
        )
    program.save(path, external_data=False)


def write_torchscript(network: nn.Module, example: torch.Tensor, path: Path) -> None:
    """A traced TorchScript module (the point's architecture is fixed, so tracing holds it
    whole). torch deprecates ``torch.jit`` in favour of ``torch.export``; its warning is
    silenced here because the format is what some runtimes still load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        # the elastic layers' shape tests become constants: intended, the point is fixed
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.jit.trace(network, example).save(str(path))


def onnx_logits(path: Path, images: np.ndarray, batch: int = CHECK_BATCH) -> np.ndarray:
    """The ONNX file's logits for uint8 images, ``batch`` per call, by onnxruntime on the CPU."""
    with needs_extra(EXPORT, "checking an ONNX file"):
        import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate(
        [
            session.run([OUTPUT_NAME], {INPUT_NAME: images[i : i + batch]})[0]
            for i in range(0, len(images), batch)
        ]
    )


def torchscript_logits(path: Path, images: np.ndarray) -> np.ndarray:
    """The TorchScript file's logits for uint8 images, loaded as a device would load it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation, as above
        module = torch.jit.load(str(path), map_location="cpu").eval()
    with torch.no_grad():
        return np.concatenate(
            [
                module(torch.from_numpy(images[i : i + CHECK_BATCH])).numpy()
                for i in range(0, len(images), CHECK_BATCH)
            ]
        )


WRITERS: dict[str, Callable[[nn.Module, torch.Tensor, Path], None]] = {
    "onnx": write_onnx,
    "torchscript": write_torchscript,
}
RUNNERS: dict[str, Callable[[Path, np.ndarray], np.ndarray]] = {
    "onnx": onnx_logits,
    "torchscript": torchscript_logits,
}


def quantise_int8(float_path: Path, int8_path: Path) -> None:
    """onnxruntime's dynamic quantisation: int8 weights, no calibration data (for boards without
    a GPU; its accuracy is measured, not assumed). Activations are quantised with a scale taken
    per call over the whole batch, so an image's label can depend on the images beside it: the
    manifest's int8 accuracy is measured one image per call, as a device serving single images
    runs it."""
    with needs_extra(EXPORT, "fedapp export --int8"):
        from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process goes to the root logger, every call
    try:
        quantize_dynamic(float_path, int8_path, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def file_facts(path: Path) -> dict[str, Any]:
    """A file's name, size in bytes and sha256."""
    return {
        "file": path.name,
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


# ---- the check ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """An exported file's predictions against fedapp's on the run's test split."""

    images: int
    agreement: float  # share of images where both predict the same label
    fedapp_accuracy: float
    exported_accuracy: float
    max_logit_diff: float
    logit_scale: float  # the largest |logit| fedapp's model gives (at least 1)

    @classmethod
    def of(cls, reference: np.ndarray, exported: np.ndarray, labels: np.ndarray) -> Check:
        return cls(
            images=len(labels),
            agreement=float(np.mean(reference.argmax(1) == exported.argmax(1))),
            fedapp_accuracy=float(np.mean(reference.argmax(1) == labels)),
            exported_accuracy=float(np.mean(exported.argmax(1) == labels)),
            max_logit_diff=float(np.max(np.abs(reference - exported))),
            logit_scale=max(1.0, float(np.max(np.abs(reference)))),
        )

    def failures(self) -> list[str]:
        """What falls outside the tolerances, each with its figures."""
        gap = abs(self.exported_accuracy - self.fedapp_accuracy)
        found = []
        if self.agreement < MIN_AGREEMENT:
            found.append(f"same label on {100 * self.agreement:.2f}% of the images (< 99.9%)")
        if gap > MAX_ACCURACY_GAP:
            found.append(
                f"accuracy {100 * self.exported_accuracy:.2f}% against fedapp's "
                f"{100 * self.fedapp_accuracy:.2f}% (> 0.1 point apart)"
            )
        if not self.max_logit_diff <= LOGIT_TOLERANCE * self.logit_scale:
            found.append(
                f"max |logit difference| {self.max_logit_diff:.2e} (> {LOGIT_TOLERANCE:g} x "
                f"the largest |logit| {self.logit_scale:.3g})"
            )
        return found


def export_point(
    run: FinishedRun,
    point: OperatingPoint,
    fmt: str,
    int8: bool,
    folder: Path,
    test: ImageArrays,
) -> dict[str, Any]:
    """Write one point's file (and its int8 variant) into ``folder``, check it against fedapp's
    own model on the test split, and return its manifest entry; ExportCheckFailed naming the
    figures where the file does not predict what fedapp does."""
    evaluator = point_evaluator(run.strategy.run)
    network = ServedNetwork(evaluator.model(point).cpu(), run.info).eval()
    reference = predict_logits(network.model, test, run.info, torch.device("cpu"))
    path = folder / f"point-{point.index}{SUFFIXES[fmt]}"
    WRITERS[fmt](network, torch.from_numpy(test.images[:2]), path)
    check = Check.of(reference, RUNNERS[fmt](path, test.images), test.labels)
    failures = check.failures()
    if failures:
        raise ExportCheckFailed(
            f"point {point.index} as {fmt} does not predict what fedapp does on the "
            f"{check.images} test images: {'; '.join(failures)}; nothing was written"
        )
    entry = {
        **file_facts(path),
        "point": point.index,
        "macs": point.macs,
        "params": point.params,
        **run.figures(point),
        "check": asdict(check),
    }
    if int8:
        int8_path = path.with_suffix(".int8.onnx")
        quantise_int8(path, int8_path)
        quantised = onnx_logits(int8_path, test.images, batch=1)
        entry["int8"] = file_facts(int8_path) | {
            "accuracy": float(np.mean(quantised.argmax(1) == test.labels)),
            "accuracy_batch": 1,
            "agreement_with_float32": float(np.mean(quantised.argmax(1) == reference.argmax(1))),
        }
    return entry


# ---- the command --------------------------------------------------------------------------------


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` that becomes ``out`` when the block ends without an
    error, and is removed otherwise: ``out`` is either complete or absent (left as it was)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder: nothing was written")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield staging
        os.replace(staging, out)  # an empty ``out`` is replaced, atomically
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def manifest(run: FinishedRun, fmt: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    """What a device needs besides the files: the input it takes, the classes it gives, each
    file's point, cost, accuracy, size, checksum and check."""
    info = run.info
    return {
        "run": {
            "dir": str(run.run_dir),
            "strategy": run.summary["strategy"],
            "dataset": run.summary["dataset"],
            "best_round": run.summary.get("best_round"),
            "test_images": run.summary.get("test_images"),
        },
        "format": fmt,
        "input": {
            "name": INPUT_NAME,
            "shape": ["batch", info.channels, info.image_size, info.image_size],
            "dtype": "uint8",
            "layout": "NCHW, the data set's pixels 0..255; the file normalises them",
            "normalisation": {"mean": list(info.mean), "std": list(info.std)},
        },
        "output": {"name": OUTPUT_NAME, "shape": ["batch", info.num_classes], "dtype": "float32"},
        "classes": {"count": info.num_classes, "labels": "argmax index = the data set's label"},
        "tolerances": {
            "min_agreement": MIN_AGREEMENT,
            "max_accuracy_gap": MAX_ACCURACY_GAP,
            "max_logit_diff_per_logit_scale": LOGIT_TOLERANCE,
        },
        "models": models,
    }


def export(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Read the run, choose its points, write and check each file, then the manifest."""
    if args.int8 and args.format != "onnx":
        raise ConfigError("--int8 quantises an ONNX file: use it with --format onnx")
    if args.format == "onnx":
        with needs_extra(EXPORT, "fedapp export --format onnx"):
            import onnxruntime  # noqa: F401  (fail before any work, naming the install)
            import onnxscript  # noqa: F401
    run_dir: Path = args.run_dir.expanduser().resolve()
    out: Path = args.out.expanduser().resolve()
    if out == run_dir or run_dir in out.parents:
        raise ConfigError(f"--out {out} is inside the run folder, which export never changes")
    run = read_run(run_dir)
    chosen = chosen_points(run, run.strategy.servable_points(run.state), args)
    test = run.test_split()
    with staged_folder(out) as folder:
        models = [export_point(run, p, args.format, args.int8, folder, test) for p in chosen]
        data = manifest(run, args.format, models)
        (folder / MANIFEST_FILE).write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        f"point {m['point']}: {out / m['file']} | {m['macs'] / 1e6:.2f}M MACs | "
        f"{m['params'] / 1e6:.3f}M params | run's test accuracy {100 * m['test_accuracy']:.2f}% | "
        f"{m['bytes'] / 1e6:.2f} MB | same label on {100 * m['check']['agreement']:.2f}% of "
        f"{m['check']['images']} test images, max |logit diff| {m['check']['max_logit_diff']:.1e}"
        + (
            f" | int8 {m['int8']['bytes'] / 1e6:.2f} MB, accuracy "
            f"{100 * m['int8']['accuracy']:.2f}%"
            if "int8" in m
            else ""
        )
        for m in models
    ]
    return data | {"out": str(out)}, "\n".join([*lines, f"manifest: {out / MANIFEST_FILE}"])
