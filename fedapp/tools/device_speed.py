"""``fedapp profile``: measure a device's training speed and propose its compute budget in MACs.

fedapp's budgets are forward MACs per example of the largest model a client can afford (FEAST
§3). A device learns its own by timing a fixed reference workload: training steps (forward,
backward, SGD update) of fedapp's ``cnn-small`` on 1x28x28 inputs at batch 32, for a few
seconds after a warm-up. Its sustained training rate in MACs per second is::

    rate = steps * 3 * forward MACs per example * batch / seconds

(the backward pass costs about twice the forward one: gradients with respect to the inputs and
to the weights). The proposed budget is the forward cost of the model whose training step, at
the same rate and batch, takes ``step-seconds`` (default 0.5 s)::

    budget = rate * step-seconds / (3 * batch)

so a device twice as fast gets twice the budget, and a round (``local-epochs * examples / batch``
steps) takes a predictable time on every device. With 0.5 s, 2 cores of an x86 server measured
about 100 GMAC/s, i.e. a ~500M budget, in the middle of the default range [25M, 1.5G]; boards an
order of magnitude slower land near its bottom. The small reference model under-uses wide
hardware (GPUs, many cores), so the proposal is conservative there; the rule is linear, hence
monotone in the measured speed. Pass the result to the SuperNode as ``--node-config budget=...``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

from fedapp.evaluation.fleets import class_entry

REFERENCE_MODEL = "cnn-small"
REFERENCE_INPUT = (1, 28, 28)
REFERENCE_CLASSES = 10
#: Training MACs per example = this * forward MACs (forward + about twice that for backward).
TRAIN_MAC_FACTOR = 3
PROFILE_HELP = "measure this device's training speed and propose its MAC budget"


@dataclass(frozen=True)
class Measurement:
    """What the reference workload did on this device."""

    device: str
    batch_size: int
    forward_macs_per_example: int
    steps: int
    seconds: float

    @property
    def macs_per_second(self) -> float:
        """Sustained training rate (forward + backward MACs per second)."""
        per_step = TRAIN_MAC_FACTOR * self.forward_macs_per_example * self.batch_size
        return self.steps * per_step / self.seconds


def propose_budget(macs_per_second: float, step_seconds: float, batch_size: int) -> float:
    """Forward MACs per example of the model whose training step at ``batch_size`` takes
    ``step_seconds`` at the measured rate (the rule in the module docstring)."""
    if not (math.isfinite(macs_per_second) and macs_per_second > 0):
        raise ValueError(f"measured rate must be a positive number, got {macs_per_second!r}")
    if step_seconds <= 0 or batch_size < 1:
        raise ValueError("step-seconds must be > 0 and batch size >= 1")
    return macs_per_second * step_seconds / (TRAIN_MAC_FACTOR * batch_size)


def forward_macs(model: Any, example: Any) -> int:
    """Forward MACs of one example through the convolutions and linear layers (as the counter
    of fedapp.models.counter does: BN, activations and pooling are free)."""
    import torch
    from torch import nn

    total = 0

    def count(module: nn.Module, _: Any, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            kernel = module.kernel_size[0] * module.kernel_size[1]
            total += output[0].numel() * (module.in_channels // module.groups) * kernel
        elif isinstance(module, nn.Linear):
            total += module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    try:
        with torch.no_grad():
            model.eval()(example[:1])
    finally:
        for hook in hooks:
            hook.remove()
    return total


def measure(seconds: float, batch_size: int = 32, device: str = "cpu") -> Measurement:
    """Train the reference model for about ``seconds`` (after one warm-up step) and count."""
    import torch
    from torch import nn

    from fedapp.models.cnn import build_cnn
    from fedapp.training.loops import resolve_device

    torch_device = resolve_device(device)
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = build_cnn(REFERENCE_MODEL, REFERENCE_INPUT[0], REFERENCE_CLASSES)
    x = torch.randn((batch_size, *REFERENCE_INPUT), generator=generator).to(torch_device)
    y = torch.randint(0, REFERENCE_CLASSES, (batch_size,), generator=generator).to(torch_device)
    model.to(torch_device)
    macs = forward_macs(model, x)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    model.train()
    step()  # warm-up: allocator, kernels, lazy initialisation
    if torch_device.type == "cuda":
        torch.cuda.synchronize()
    steps, start = 0, time.perf_counter()
    while steps == 0 or time.perf_counter() - start < seconds:
        step()
        steps += 1
        if torch_device.type == "cuda":
            torch.cuda.synchronize()
    return Measurement(str(torch_device), batch_size, macs, steps, time.perf_counter() - start)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fedapp profile``."""
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="how long to time training (default 5)"
    )
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.5,
        help="target seconds per training step of the proposed model (default 0.5)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    parser.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda", "auto"), help="default cpu"
    )


def memory_mb() -> float:
    """The device's physical memory in MB (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        return 0.0


def profile(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """Run the measurement; the facts as a JSON-able dict and as text (``fedapp profile``)."""
    import torch

    if args.seconds <= 0:
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    result = measure(args.seconds, args.batch_size, args.device)
    rate = result.macs_per_second
    budget = round(propose_budget(rate, args.step_seconds, args.batch_size))
    data = {
        "host": {
            "machine": platform.machine(),
            "system": platform.system(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        },
        "workload": {"model": REFERENCE_MODEL, "input": list(REFERENCE_INPUT)} | asdict(result),
        "macs_per_second": rate,
        "step_seconds": args.step_seconds,
        "budget": budget,
        "node_config": f"budget={budget}",
        "memory_mb": memory_mb(),
    }
    text = "\n".join(
        [
            f"device: {platform.machine()} {result.device}, {torch.get_num_threads()} torch "
            f"threads, torch {torch.__version__}",
            f"reference: {REFERENCE_MODEL} 1x28x28, batch {result.batch_size}, "
            f"{result.forward_macs_per_example / 1e6:.2f}M forward MACs/example",
            f"measured: {result.steps} steps in {result.seconds:.2f} s = "
            f"{rate / 1e9:.2f} GMAC/s of training",
            f"proposed budget: {budget / 1e6:.1f}M MACs "
            f"(a training step of {args.step_seconds:g} s at batch {result.batch_size})",
            f'SuperNode: --node-config "partition-id=... num-partitions=... budget={budget}"',
            "",
            "its class in a fleet file (conf/fleets; fill in the links, e.g. from iperf3):",
            class_entry(
                f"{platform.machine()}-{result.device}",
                rate,
                memory_mb(),
                f"fedapp profile --seconds {args.seconds:g} on this device",
            ),
        ]
    )
    return data, text
