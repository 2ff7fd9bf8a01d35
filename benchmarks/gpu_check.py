"""GPU check of the canonical FEAST configuration: seconds per round, GPU memory, utilisation.

Runs `conf/feast-cifar100.toml` (the 55.68M-parameter supernet, the authors' 56-variant cache,
batch 64, one local epoch, routed co-training) for a few rounds through the real `flwr run` with
Ray GPU client resources, on CIFAR-shaped synthetic data (32x32x3, 100 classes, written as an
.npz: no data set can be downloaded on the device machine). While it runs, `nvidia-smi` is
sampled every 0.5 s. Synthetic images take the `npz` path, so CIFAR's RandAugment is not part of
the measured data loading.

    python benchmarks/gpu_check.py --rounds 3 --clients 10 --per-client 500
    python benchmarks/gpu_check.py --nodes 2 ...    # the same across a 2-node Ray cluster
    python benchmarks/gpu_check.py --smoke          # CPU: 2 clients, 1 round, tiny data, the
                                                    # small supernet: checks the script anywhere

With ``--nodes 2`` the run attaches (RAY_ADDRESS) to a local Ray cluster of two nodes on 127.0.0.1
(tests/support/ray_cluster.py: ``ray start --head`` and ``ray start --address``), each with half the
cores and every GPU (on a one-GPU machine both nodes' clients share it), as a user's cluster of two
GPU machines would run; the table then also gives each node's ClientApp CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import numpy as np
from flwr_runs import ROOT, flwr_run_once

sys.path.insert(0, str(ROOT / "tests" / "support"))
from ray_cluster import LocalRayCluster

CLASSES = 100


def synthetic_cifar(path: Path, train: int, test: int, seed: int = 0) -> Path:
    """Random uint8 images of CIFAR's shape with uniform labels, as an .npz file."""
    rng = np.random.default_rng(seed)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (train, 32, 32, 3), dtype=np.uint8),
        y_train=rng.integers(0, CLASSES, train),
        x_test=rng.integers(0, 256, (test, 32, 32, 3), dtype=np.uint8),
        y_test=rng.integers(0, CLASSES, test),
    )
    return path


class GpuSampler:
    """`nvidia-smi` polling in the background (utilisation %, memory MiB of GPU 0); no samples
    where there is no nvidia-smi."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> GpuSampler:
        if shutil.which("nvidia-smi"):
            with self.log.open("w") as out:
                self.proc = subprocess.Popen(
                    [
                        "nvidia-smi",
                        "--query-gpu=utilization.gpu,memory.used",
                        "--format=csv,noheader,nounits",
                        "-i",
                        "0",
                        "-lms",
                        "500",
                    ],
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def samples(self) -> list[tuple[float, float]]:
        if not self.log.exists():
            return []
        rows = [line.split(",") for line in self.log.read_text().splitlines() if "," in line]
        return [(float(u), float(m)) for u, m in rows]


def visible_gpus() -> int:
    """GPUs nvidia-smi lists (0 without one): each local Ray node is given all of them."""
    if not shutil.which("nvidia-smi"):
        return 0
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=10, help="all of them train every round")
    parser.add_argument("--per-client", type=int, default=500, help="synthetic images per client")
    parser.add_argument("--gpus-per-client", type=float, default=0.25)
    parser.add_argument("--nodes", type=int, default=1, help="Ray nodes; >1: a local cluster")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run to check the script")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.clients, args.per_client, args.gpus_per_client = 1, 2, 40, 0.0
    elif args.gpus_per_client > 0 and visible_gpus() == 0:
        sys.exit(
            "gpu_check: nvidia-smi lists no GPU here; on a CPU machine run --smoke (its CPU "
            "path), or --gpus-per-client 0 to measure the CPU"
        )

    config = tomllib.loads((ROOT / "conf" / "feast-cifar100.toml").read_text())
    held = 40 if args.smoke else 500
    config |= {
        "num-clients": args.clients,
        "fraction-train": 1.0,
        "min-train-clients": args.clients,
        "num-server-rounds": args.rounds,
        "eval-every": args.rounds,
        "dataset": "npz",
        "calibration-size": held,
        "validation-size": held,
        "partitioner": "iid",
        "feast-space.anchor-variants": "0,55",
        "device": "cpu" if args.smoke else "auto",
    }
    if args.smoke:  # the preset's method section goes through, on a supernet a CPU trains fast
        config |= {
            "feast-space.supernet": "feast-small",
            "feast-space.variant-cache": "feast-small",
            "feast-space.anchor-variants": "",
        }
    node_cpus = max((os.cpu_count() or 2) // args.nodes, 1)
    federation = (
        f"num-supernodes={args.clients} client-resources-num-cpus={min(2, node_cpus)} "
        f"client-resources-num-gpus={args.gpus_per_client}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train = args.clients * args.per_client + 2 * held
        config["data-dir"] = str(synthetic_cifar(work / "cifar-shaped.npz", train, held))
        with contextlib.ExitStack() as stack:
            env: dict[str, str] = {}
            if args.nodes > 1:
                cluster = stack.enter_context(
                    LocalRayCluster(
                        work,
                        nodes=args.nodes,
                        cpus=node_cpus,
                        gpus=visible_gpus(),
                    )
                )
                cluster.watch()
                env["RAY_ADDRESS"] = cluster.address
            gpu = stack.enter_context(GpuSampler(work / "gpu.csv"))
            wall, summary = flwr_run_once(config, federation, work, **env)
            per_node = cluster.actor_cpu_seconds() if args.nodes > 1 else {}
        rows = [
            json.loads(x)
            for x in (work / "out" / "bench" / "metrics.jsonl").read_text().splitlines()
        ]
        samples = gpu.samples()
    round_seconds = [r["seconds"] - r.get("seconds-evaluate", 0.0) for r in rows]
    result = {
        "rounds": args.rounds,
        "clients_per_round": args.clients,
        "examples_per_client": args.per_client,
        "seconds_per_round_median": statistics.median(round_seconds),
        "seconds_per_round": round_seconds,
        "client_training_seconds_sum": summary["timing"]["client_training_seconds_sum"],
        "wall_seconds": wall,
        "gpu_samples": len(samples),
        "gpu_utilisation_mean": statistics.fmean(u for u, _ in samples) if samples else None,
        "gpu_utilisation_max": max((u for u, _ in samples), default=None),
        "gpu_memory_max_mib": max((m for _, m in samples), default=None),
        "ray_nodes": args.nodes,
        "client_cpu_seconds_per_node": per_node,
    }
    print(
        "| Ray nodes | rounds | clients/round | s/round (median, no validation) | "
        "GPU util mean / max | GPU memory max | ClientApp CPU s per node |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    util = (
        f"{result['gpu_utilisation_mean']:.0f} % / {result['gpu_utilisation_max']:.0f} %"
        if samples
        else "no GPU"
    )
    memory = f"{result['gpu_memory_max_mib']:.0f} MiB" if samples else "-"
    nodes = ", ".join(f"{seconds:.0f}" for seconds in per_node.values()) or "-"
    print(
        f"| {args.nodes} | {args.rounds} | {args.clients} | "
        f"{result['seconds_per_round_median']:.1f} | {util} | {memory} | {nodes} |"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
