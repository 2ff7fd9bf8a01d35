"""Benchmark (b): one training step through the elastic supernet vs the extracted static subnet.

For cached variants of the canonical CIFAR-100 supernet (reference cache, 100 classes), one step
is zero_grad + forward + cross-entropy + backward on a CPU batch of 32. Three models run the same
variant side by side, interleaved repetition by repetition so machine load hits all alike:

- static:  ``ElasticResNet.subnet(arch)``, plain nn.Conv2d/BatchNorm2d/Linear modules;
- routed:  the client's routed sub-supernet for a budget equal to the variant's MACs (what a FEAST
           client trains), activated at the variant;
- full:    the whole 55.7M-parameter supernet activated at the variant.

The full supernet pays for gradient buffers of the whole tensors it touches (autograd writes a
slice's gradient into a zero tensor of the parent's shape), a fixed cost that small variants feel
most; a routed client's tensors are its envelope, so it does not. A second table times inference
(eval mode, no gradients), which is how the server evaluates and calibrates variants.

Run: ``python benchmarks/model_space_training_step.py [--reps 7] [--threads 2]``; ``--smoke``:
the smallest anchor only, batch 2, one repetition.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedapp.models.cache import load_cache
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.models.routing import route
from fedapp.models.slicing import leading_slice

ANCHORS = (0, 3, 22, 38, 55)


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()


@torch.no_grad()
def infer(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model(x)


def median_times(
    models: dict[str, nn.Module], run: Callable[..., None], reps: int, batch: int
) -> dict[str, float]:
    """Median seconds of ``run(model, x, y)`` per model, interleaved across models."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 100, (batch,), generator=gen)
    for model in models.values():
        run(model, x, y)  # warm-up: allocator and oneDNN kernels
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(reps):
        for name, model in models.items():
            start = time.perf_counter()
            run(model, x, y)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def table(title: str, rows: list[tuple[int, float, dict[str, float]]]) -> None:
    print(f"{title}\n")
    print(
        "| variant | MACs | static (ms) | routed (ms) | full (ms) | routed/static | full/static |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for index, macs, t in rows:
        print(
            f"| #{index} | {macs / 1e6:.1f}M | {t['static'] * 1e3:.1f} | "
            f"{t['routed'] * 1e3:.1f} | {t['full'] * 1e3:.1f} | "
            f"{t['routed'] / t['static']:.3f} | {t['full'] / t['static']:.3f} |"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--smoke", action="store_true", help="anchor 0, batch 2, 1 repetition")
    args = parser.parse_args()
    anchors = ANCHORS[:1] if args.smoke else ANCHORS
    if args.smoke:
        args.batch, args.reps = 2, 1
    torch.set_num_threads(args.threads)

    cache = load_cache("feast-cifar100-reference")
    supernet = ElasticResNet(cache.config, seed=0)
    state = supernet.state_dict()
    print(
        f"torch {torch.__version__}, {args.threads} threads, batch {args.batch}, "
        f"median of {args.reps} interleaved repetitions\n"
    )
    train_rows, eval_rows = [], []
    for index in anchors:
        variant = cache.variants[index]
        supernet.activate(variant.arch)
        static = supernet.subnet(variant.arch)
        r = route(cache, variant.macs)
        routed = ElasticResNet(cache.config, bounds=r.envelope)
        routed.load_state_dict({k: state[k][leading_slice(s)] for k, s in r.shapes.items()})
        routed.activate(variant.arch)
        models = {"static": static, "routed": routed, "full": supernet}
        for model in models.values():
            model.train()
        train_rows.append((index, variant.macs, median_times(models, step, args.reps, args.batch)))
        for model in models.values():
            model.eval()
        eval_rows.append((index, variant.macs, median_times(models, infer, args.reps, args.batch)))
    table("Training step (zero_grad + forward + backward):", train_rows)
    table("Inference (eval mode, no gradients):", eval_rows)


if __name__ == "__main__":
    main()
