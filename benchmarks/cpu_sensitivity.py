"""How the quickstart's work depends on the CPU: kernel instruction sets, and torch threads when
the cores are busy or oversubscribed.

(a) One round of the quickstart's local training (round 1's five clients, one local epoch each,
through the real ClientApp in this process, one torch thread as in a 1-CPU Ray actor, the
better of two calls per client) with
torch's CPU kernels limited to an instruction set (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA): a
CPU or a VM's CPU model without AVX-512 or without AVX runs these kernels.
(b) One validation of the quickstart (5 anchors: BN recalibration and the 400 validation images,
what the ServerApp does every 5 rounds) with 1 and with 2 torch threads.
(c) As (a), in two processes at once (two 1-CPU Ray actors on this machine), each with 1 torch
thread (what Ray sets where OMP_NUM_THREADS is unset, and what fedapp's ClientApp now sets in
any case) and with one thread per core (what an inherited OMP_NUM_THREADS gave before): the
slower one's training time.
Settings alternate within each repetition, so every ratio is measured side by side; each
setting runs in a fresh process (the limits are read when torch loads).

    python benchmarks/cpu_sensitivity.py [--reps 2]
    python benchmarks/cpu_sensitivity.py --smoke   # (a) and (b) once each, own kernels, 1 thread
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fedapp.run.context import data_layout, run_context

ROOT = Path(__file__).resolve().parents[1]

ISA_LIMITS = {
    "AVX-512 (this CPU's own)": {},
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "SSE4.1 (no AVX)": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def local_training_seconds(threads: int = 1) -> float:
    """Round 1's five clients, one local epoch each: seconds of ClientApp train."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from flwr.common.serde import message_from_proto, message_to_proto
    from local_grid import local_federation, preset_overrides, run_config

    from fedapp.apps.client_app import app as client_app

    torch.set_num_threads(threads)
    fed = local_federation(run_config(**(preset_overrides("quickstart") | {"local_epochs": 1})), 20)
    messages = fed.strategy.configure_round(1, fed.strategy.initial_state(), fed.grid)
    seconds = 0.0
    for message in messages:
        message.metadata.__dict__["_message_id"] = "m"
        delivered = message_from_proto(message_to_proto(message))
        runs = []
        for _ in range(2):  # the better of two: the first also creates oneDNN's kernels
            start = time.perf_counter()
            client_app(delivered, fed.grid.contexts[message.metadata.dst_node_id])
            runs.append(time.perf_counter() - start)
        seconds += min(runs)
    return seconds


def validation_seconds(threads: int) -> float:
    """The quickstart's validation of its 5 anchors on its initial supernet."""
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from local_grid import preset_overrides, run_config

    from fedapp.methods.common.strategy import point_evaluator
    from fedapp.models.elastic_resnet import ElasticResNet
    from fedapp.run.config import parse_run_config
    from fedapp.run.feast_space import model_space
    from fedapp.run.federated_data import population, server_set

    torch.set_num_threads(threads)
    cfg = parse_run_config(run_config(**preset_overrides("quickstart")))
    info = population(data_layout(cfg)).info
    space = model_space(run_context(cfg).feast_space, info)
    model = ElasticResNet(space.config, seed=cfg.seed)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    evaluator = point_evaluator(run_context(cfg))
    validation = server_set(data_layout(cfg), "validation")
    anchors = space.anchors(run_context(cfg).feast_space.anchor_variants)
    start = time.perf_counter()
    evaluator.variants(space.config, space.cache, state, anchors, validation)
    return time.perf_counter() - start


def measure(kind: str, env: dict[str, str], arg: str = "") -> tuple[float, float]:
    """Run one measurement in a fresh process; (seconds, load average at its start)."""
    load = _load()
    result = subprocess.run(
        [sys.executable, __file__, "--child", kind, arg],
        env=os.environ | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["seconds"], load


def measure_pair(threads: int) -> tuple[float, float]:
    """(a) in two fresh processes started together; (the slower one's training seconds, load)."""
    load = _load()
    command = [sys.executable, __file__, "--child", "train", str(threads)]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [child.communicate()[0] for child in children]
    if any(child.returncode != 0 for child in children):
        raise RuntimeError(f"a training child failed: {command}")
    return max(json.loads(out.strip().splitlines()[-1])["seconds"] for out in outputs), load


def print_ratios(setting: str, measured: str, ratio: str, runs: dict[Any, list[float]]) -> None:
    """One markdown table: each setting's median seconds and its ratio to the first setting's."""
    base = statistics.median(next(iter(runs.values())))
    print(f"\n| {setting} | {measured} (s, median) | {ratio} |\n|---|---:|---:|")
    for name, values in runs.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="(a) and (b) once, no (c)")
    args = parser.parse_args()
    if args.child:
        kind, arg = args.child
        measured = local_training_seconds if kind == "train" else validation_seconds
        seconds = measured(int(arg))
        print(json.dumps({"seconds": seconds}))
        return
    limits = dict(list(ISA_LIMITS.items())[:1]) if args.smoke else ISA_LIMITS
    training: dict[str, list[float]] = {name: [] for name in limits}
    validation: dict[int, list[float]] = {1: []} if args.smoke else {1: [], 2: []}
    pairs: dict[int, list[float]] = {} if args.smoke else {1: [], os.cpu_count() or 1: []}
    if args.smoke:
        args.reps = 1
    loads: list[float] = []
    for _ in range(args.reps):
        for name, env in limits.items():
            seconds, load = measure("train", env, "1")
            training[name].append(seconds)
            loads.append(load)
        for threads in validation:
            seconds, load = measure("validate", {}, str(threads))
            validation[threads].append(seconds)
            loads.append(load)
        for threads in pairs:
            seconds, load = measure_pair(threads)
            pairs[threads].append(seconds)
            loads.append(load)
    print_ratios("torch / oneDNN kernels", "local training of one round", "x AVX-512", training)
    print_ratios("ServerApp torch threads", "validation of 5 anchors", "x 1 thread", validation)
    if pairs:
        print_ratios("torch threads per actor, 2 at once", "round 1, slower actor", "x 1", pairs)
    print(
        f"\n{os.cpu_count()} cores; 1-minute load average at the measurements' starts: "
        f"{min(loads):.1f}-{max(loads):.1f}; {args.reps} repetitions, settings alternating"
    )


if __name__ == "__main__":
    main()
