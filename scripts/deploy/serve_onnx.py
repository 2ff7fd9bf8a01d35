#!/usr/bin/env python3
"""Serve fedapp's exported models on a device: needs only onnxruntime, NumPy and Python 3.

Copy this file and the folder ``fedapp export --format onnx`` wrote (its files and
manifest.json) to the device; a venv with ``pip install onnxruntime numpy`` runs it, with no
torch, Flower or fedapp there.

    python serve_onnx.py measure EXPORT_DIR --out latencies.csv   # every file, batch 1 and 32
    python serve_onnx.py predict EXPORT_DIR/point-0.onnx images.npy --out labels.npy
    python serve_onnx.py time EXPORT_DIR/point-0.onnx --batch 1  # one file, this process

``measure`` checks each file against the manifest's sha256, then times it at each batch size in a
fresh process (``time``): peak memory only grows within a process, so each measurement's peak is
its own. A measurement is the median of ``--repeats`` calls after ``--warmup`` calls on random
uint8 images of the manifest's input shape (latency does not depend on the pixels); its memory is
the process's peak resident set (``ru_maxrss``: the kernel's VmHWM, which counts onnxruntime's
own allocations, unlike tracemalloc) after the run, minus that peak before the model was loaded.
The table (CSV: file, point, macs, precision, batch, ms_per_image, peak_mb, process_peak_mb,
threads, machine) is what ``fedapp export --latency-ms L --latencies TABLE`` reads to choose the
most accurate point this device runs within L ms.

``predict`` takes a .npy of uint8 images (N, C, H, W), the data set's pixels: the file holds the
normalisation, and writes one label per image (.npy, or text lines on stdout). An int8 file
quantises activations per call over its batch, so its labels can depend on the images beside
each one; ``--batch 1`` gives the labels whose accuracy the manifest records.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime

MANIFEST_FILE = "manifest.json"
COLUMNS = (
    "file",
    "point",
    "macs",
    "precision",
    "batch",
    "ms_per_image",
    "peak_mb",
    "process_peak_mb",
    "threads",
    "machine",
)


def peak_rss_mb() -> float:
    """This process's peak resident set so far, in MB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6


def session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    """A CPU session of the file; ``threads`` 0: onnxruntime's default (one per core)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def input_shape(model: onnxruntime.InferenceSession) -> tuple[int, ...]:
    """The per-image shape (C, H, W) the file takes (its batch axis is dynamic)."""
    return tuple(int(d) for d in model.get_inputs()[0].shape[1:])


def time_file(path: Path, batch: int, repeats: int, warmup: int, threads: int) -> dict[str, Any]:
    """Latency per image and memory of one file at one batch size, in this process."""
    before = peak_rss_mb()
    model = session(path, threads)
    name = model.get_inputs()[0].name
    images = np.random.default_rng(0).integers(0, 256, (batch, *input_shape(model)), dtype=np.uint8)
    for _ in range(warmup):
        model.run(None, {name: images})
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        model.run(None, {name: images})
        seconds.append(time.perf_counter() - started)
    process_peak = peak_rss_mb()
    return {
        "batch": batch,
        "ms_per_image": 1000 * statistics.median(seconds) / batch,
        "peak_mb": process_peak - before,
        "process_peak_mb": process_peak,
        "threads": threads,
        "machine": platform.machine(),
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest_files(folder: Path) -> list[dict[str, Any]]:
    """(file, point, MACs, precision) of every model the manifest lists, each checked against
    its sha256 (a file damaged on its way to the device is refused, not timed)."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    if manifest.get("format") != "onnx":
        raise SystemExit(f"serve_onnx: {folder} holds {manifest.get('format')} files, not onnx")
    files = []
    for model in manifest["models"]:
        variants = [(model, "float32")] + ([(model["int8"], "int8")] if "int8" in model else [])
        for facts, precision in variants:
            path = folder / facts["file"]
            if sha256(path) != facts["sha256"]:
                raise SystemExit(f"serve_onnx: {path} is not the file the manifest lists (sha256)")
            files.append(
                {
                    "file": path,
                    "point": model["point"],
                    "macs": model["macs"],
                    "precision": precision,
                }
            )
    return files


def measure(args: argparse.Namespace) -> None:
    rows = []
    for entry in manifest_files(args.export_dir):
        for batch in args.batch or [1, 32]:
            command = [
                sys.executable,
                __file__,
                "time",
                str(entry["file"]),
                *("--batch", str(batch), "--repeats", str(args.repeats)),
                *("--warmup", str(args.warmup), "--threads", str(args.threads)),
            ]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            facts = json.loads(result.stdout)
            rows.append({**entry, "file": entry["file"].name, **facts})
            print(
                f"{entry['file'].name:<22} point {entry['point']:>3} {entry['precision']:<7} "
                f"batch {batch:>4}: {facts['ms_per_image']:8.3f} ms/image, "
                f"peak +{facts['peak_mb']:.1f} MB ({facts['process_peak_mb']:.1f} MB)",
                flush=True,
            )
    if args.out:
        with args.out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, COLUMNS)
            writer.writeheader()
            writer.writerows({k: row[k] for k in COLUMNS} for row in rows)
        print(f"latency table: {args.out}")


def time_one(args: argparse.Namespace) -> None:
    print(json.dumps(time_file(args.file, args.batch, args.repeats, args.warmup, args.threads)))


def predict(args: argparse.Namespace) -> None:
    model = session(args.file, args.threads)
    images = np.load(args.images)
    expected = input_shape(model)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != expected:
        raise SystemExit(
            f"serve_onnx: {args.images} holds {images.dtype} {images.shape}; the model takes "
            f"uint8 (N, {', '.join(map(str, expected))}) images, the data set's pixels 0..255"
        )
    name = model.get_inputs()[0].name
    labels = np.concatenate(
        [
            model.run(None, {name: images[i : i + args.batch]})[0].argmax(1)
            for i in range(0, len(images), args.batch)
        ]
    )
    if args.out:
        np.save(args.out, labels)
        print(f"{len(labels)} labels: {args.out}")
    else:
        print("\n".join(map(str, labels.tolist())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    timing = argparse.ArgumentParser(add_help=False)
    timing.add_argument("--repeats", type=int, default=50, help="timed calls (median)")
    timing.add_argument("--warmup", type=int, default=5, help="calls before timing")
    timing.add_argument("--threads", type=int, default=0, help="0: onnxruntime's default")
    p = commands.add_parser(
        "measure", parents=[timing], help="time every file of an export at each batch size"
    )
    p.add_argument("export_dir", type=Path, help="the folder fedapp export wrote")
    p.add_argument("--batch", type=int, action="append", help="repeatable; default 1 and 32")
    p.add_argument("--out", type=Path, help="the latency table (CSV) to write")
    p.set_defaults(run=measure)
    p = commands.add_parser("time", parents=[timing], help="time one file, in this process")
    p.add_argument("file", type=Path)
    p.add_argument("--batch", type=int, default=1)
    p.set_defaults(run=time_one)
    p = commands.add_parser("predict", help="labels of a .npy of uint8 images")
    p.add_argument("file", type=Path, help="an exported .onnx file")
    p.add_argument("images", type=Path, help=".npy, uint8 (N, C, H, W)")
    p.add_argument("--out", type=Path, help=".npy of labels (default: one per line on stdout)")
    p.add_argument("--batch", type=int, default=256, help="images per call")
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(run=predict)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
