"""Benchmark (c): time to build the canonical 56-target variant cache with the vectorised GA.

The CIFAR-100 supernet, the paper's two segments (50 targets 50M-600M with rho0 0.31 and seeds
42-91; 6 targets 25M-75M with rho0 0.40 and seeds 42-47), population 256 x 512 generations per
target. It is timed with one process and with ``--workers`` processes (real runs, no
extrapolation), then the found architectures are scored against the FEAST authors' cache for the
same targets with the same fitness (higher is better). Everything here counts MACs with a 10-class
head, as the authors' search did, so both sides face the same constraint.

Run: ``python benchmarks/model_space_ga.py [--workers 2]``; ``--smoke``: population 8 x 2
generations (seconds; the fitness comparison then means nothing).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fedapp.models.arch import load_supernet
from fedapp.models.cache import Segment, load_cache, search_segments
from fedapp.models.fitness import fitness_terms
from fedapp.models.ga import GAParams

SEGMENTS = [Segment(50e6, 600e6, 50, 0.31, 42), Segment(25e6, 75e6, 6, 0.40, 42)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="population 8 x 2 generations")
    args = parser.parse_args()
    params = GAParams(population=8, generations=2) if args.smoke else GAParams()
    config = load_supernet("feast-cifar100", num_classes=10)
    reference = load_cache("feast-cifar100-reference", config)
    print(
        f"{os.cpu_count()} CPUs; 56 targets x population {params.population} x "
        f"{params.generations} generations\n"
    )
    print("| processes | build time (s) | per target (s) |")
    print("|---:|---:|---:|")
    runs = {}
    for workers in sorted({1, args.workers}):
        start = time.perf_counter()
        runs[workers] = search_segments(config, SEGMENTS, params, workers=workers)
        seconds = time.perf_counter() - start
        print(f"| {workers} | {seconds:.1f} | {seconds / len(runs[workers]):.2f} |")
    ours = runs[1]
    assert all(a == b for a, b in zip(ours, runs[args.workers], strict=True)), "not deterministic"

    by_target = {int(v.target_macs): v.arch for v in reference.variants}
    wins, gaps = 0, []
    for found in ours:
        ref_arch = by_target[int(found.mac_limit)]
        ref_fit = fitness_terms(
            config, config.genes(ref_arch)[None, :], found.mac_limit, found.rho0
        ).fitness[0]
        wins += found.fitness >= ref_fit - 1e-9
        gaps.append(found.fitness - ref_fit)
    print(
        f"\nfitness vs the authors' cache at the same 56 targets: ours >= theirs on {wins}/56, "
        f"mean difference {np.mean(gaps):+.1f} (min {min(gaps):+.1f}, max {max(gaps):+.1f})"
    )
    print(
        f"identical results with 1 and {args.workers} processes; unique architectures: "
        f"{len({r.arch for r in ours})}"
    )


if __name__ == "__main__":
    main()
