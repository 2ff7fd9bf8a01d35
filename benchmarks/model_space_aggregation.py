"""Benchmark (a): aggregating 10 routed updates vs dense FedAvg of 10 full supernets.

The canonical CIFAR-100 supernet (55.7M parameters, float32) with the reference cache; budgets
follow FEAST §3 (100 clients, Zipf s=1.2 over [smallest variant, 1500M]) and each round's cohort of
10 is drawn with the round's seed. Three aggregations run side by side on every cohort:

- routed:  ``SliceAccumulator`` over the 10 routed envelopes (what FEAST sends back);
- dense:   a plain weighted average of 10 full supernets, tensor by tensor (the FedAvg baseline);
- dense via SliceAccumulator: the same 10 full supernets through the accumulator (how the app's
           FedAvg strategy aggregates), for reference.

Times are medians over interleaved repetitions; peak extra memory is measured separately with
tracemalloc (numpy reports its buffers to it) as the peak above what was allocated before.

Run: ``python benchmarks/model_space_aggregation.py [--rounds 3] [--reps 3]``; ``--smoke``: one
round of a cohort of 2, one repetition (about 1 GB instead of 2.5 GB).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable, Mapping

import numpy as np

from fedapp.models.cache import load_cache
from fedapp.models.elastic_resnet import state_shapes
from fedapp.models.routing import route
from fedapp.models.slicing import SliceAccumulator, extract, is_averaged
from fedapp.partitions.budgets import zipf_budgets

State = dict[str, np.ndarray]
Replies = list[tuple[State, float]]


def dense_fedavg(replies: Replies) -> State:
    """Weighted average of whole states (step counters from the first), float32 throughout."""
    total = sum(w for _, w in replies)
    out: State = {}
    for name, first in replies[0][0].items():
        if not is_averaged(name):
            out[name] = first.copy()
            continue
        acc = first * np.float32(replies[0][1] / total)
        for state, weight in replies[1:]:
            acc += state[name] * np.float32(weight / total)
        out[name] = acc
    return out


def accumulate(old: Mapping[str, np.ndarray], replies: Replies) -> State:
    acc = SliceAccumulator(old)
    for state, weight in replies:
        acc.add(state, weight)
    return acc.result()


def peak_extra_mb(run: Callable[[], object]) -> float:
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    result = run()
    peak = tracemalloc.get_traced_memory()[1]
    del result
    tracemalloc.stop()
    return (peak - base) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="cohorts to aggregate")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions per cohort")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="1 round, cohort of 2, 1 repetition")
    args = parser.parse_args()
    cohort_size = 2 if args.smoke else 10
    if args.smoke:
        args.rounds, args.reps = 1, 1

    cache = load_cache("feast-cifar100-reference")
    config = cache.config
    rng = np.random.default_rng(args.seed)
    global_state = {
        name: rng.standard_normal(shape, dtype=np.float32) if shape else np.array(0, np.int64)
        for name, shape in state_shapes(config, config.max_arch()).items()
    }
    full_params = sum(t.size for n, t in global_state.items() if is_averaged(n))
    budgets = zipf_budgets(100, cache.min_macs, 1.5e9, 1.2, seed=args.seed)
    state_mib = sum(t.nbytes for t in global_state.values()) / 2**20
    print(
        f"supernet {config.name}: {full_params / 1e6:.2f}M averaged values per full update; "
        f"the new global state itself takes {state_mib:.0f} MiB of each peak"
    )
    print(f"medians of {args.reps} interleaved repetitions per cohort\n")
    print(
        "| round | routed values (M) | routed (s) | dense (s) | dense via accumulator (s) "
        "| routed/dense | peak extra MB routed | peak extra MB dense |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for round_ in range(1, args.rounds + 1):
        cohort = np.random.default_rng(round_).choice(100, size=cohort_size, replace=False)
        weights = [float(w) for w in np.random.default_rng(round_).integers(50, 1800, size=10)]
        weights = weights[:cohort_size]
        routed: Replies = []
        for client, weight in zip(cohort, weights, strict=True):
            payload = extract(global_state, route(cache, budgets[client]).shapes)
            routed.append(({k: v + np.float32(0.01) for k, v in payload.items()}, weight))
        dense: Replies = [
            ({k: v + np.float32(0.01) for k, v in global_state.items()}, w) for w in weights
        ]
        runs = {
            "routed": lambda routed=routed: accumulate(global_state, routed),
            "dense": lambda dense=dense: dense_fedavg(dense),
            "dense_acc": lambda dense=dense: accumulate(global_state, dense),
        }
        for run in runs.values():
            run()  # warm-up: first-touch page faults of fresh output buffers
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.reps):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        t = {name: statistics.median(v) for name, v in times.items()}
        memory = {name: peak_extra_mb(runs[name]) for name in ("routed", "dense")}
        routed_values = sum(v.size for s, _ in routed for n, v in s.items() if is_averaged(n))
        ratios.append(t["routed"] / t["dense"])
        print(
            f"| {round_} | {routed_values / 1e6:.1f} | {t['routed']:.3f} | {t['dense']:.3f} | "
            f"{t['dense_acc']:.3f} | {ratios[-1]:.3f} | {memory['routed']:.0f} | "
            f"{memory['dense']:.0f} |"
        )
        del routed, dense, runs
    print(
        f"\nrouted/dense time ratio: mean {statistics.mean(ratios):.3f} over {args.rounds} rounds"
    )


if __name__ == "__main__":
    main()
