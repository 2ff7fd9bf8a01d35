"""Training and evaluation loops shared by every method, on either side: seeding, loaders,
one optimizer step, local epochs, plain evaluation. Torch and explicit arguments only."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.data.transforms import ImageDataset, eval_transform, mix_batch, train_transform
from fedapp.random_streams import Stream, stream_seed
from fedapp.wire.messages import ACCURACY, LOSS


@dataclass(frozen=True)
class TrainStats:
    """What one local training call did."""

    loss: float
    examples: int
    steps: int
    seconds: float
    #: Forward MACs of every example trained, summed (0 where the steps do not count them).
    forward_macs: int = 0


@dataclass(frozen=True)
class StepOutcome:
    """What the gradient computation of one mini-batch reports."""

    loss: float  # the loss reported for the batch
    forward_macs: int = 0  # per example, summed over the step's forward passes (0: not counted)


#: Accumulates the gradients of one (possibly mixed) mini-batch: (x, y_a, y_b, lam) -> outcome.
Gradients = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], StepOutcome]
#: The loss of one (possibly mixed) mini-batch: (x, y_a, y_b, lam) -> scalar tensor.
BatchLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; 'cuda' without a GPU is a clear error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' was requested but no CUDA GPU is visible")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_local_work(seed: int, stream: Stream, *parts: int) -> torch.Generator:
    """Fix all randomness of one piece of local work by its stream (run seed, purpose, round,
    partition, ...).

    Seeds torch's global generator (dropout, augmentation) and returns a generator for the data
    order, so a round's result depends on its own stream only, not on what the process ran before
    (which differs between a Ray actor, a fresh device process and a resumed run).
    """
    derived = stream_seed(seed, stream, *parts)
    torch.manual_seed(derived)
    return torch.Generator().manual_seed(derived)


def train_loader(
    arrays: ImageArrays, info: DatasetInfo, batch_size: int, generator: torch.Generator
) -> DataLoader:
    """Shuffled, augmented batches of a client's shard, in an order fixed by the generator.

    A last batch of one image is left out: batch normalisation cannot train on a single image
    (a shard one above a multiple of the batch size would stop the round)."""
    dataset = ImageDataset(arrays, train_transform(info))
    lone_last = len(dataset) > batch_size and len(dataset) % batch_size == 1
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=generator, drop_last=lone_last
    )


def eval_loader(arrays: ImageArrays, info: DatasetInfo, batch_size: int) -> DataLoader:
    """Batches of a held-out set in its stored order, without augmentation."""
    return DataLoader(ImageDataset(arrays, eval_transform(info)), batch_size=batch_size)


def sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def backward(loss_of: BatchLoss) -> Gradients:
    """The gradients of one loss per mini-batch; that loss is what the step reports."""

    def gradients(x: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float) -> StepOutcome:
        loss = loss_of(x, y_a, y_b, lam)
        loss.backward()
        return StepOutcome(loss.item())

    return gradients


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    gradients: Gradients,
    *,
    generator: torch.Generator | None = None,
    mix: bool = False,
    grad_clip: float | None = None,
) -> StepOutcome:
    """One optimizer step on one mini-batch: Mixup/CutMix when ``mix`` (drawn from
    ``generator``), the method's gradients, their norm clipped when ``grad_clip`` is set."""
    if mix:
        if generator is None:
            raise ValueError("mixing batches needs the local work's generator")
        x, y_a, y_b, lam = mix_batch(x, y, generator)
    else:
        y_a, y_b, lam = y, y, 1.0
    optimizer.zero_grad(set_to_none=True)
    outcome = gradients(x, y_a, y_b, lam)
    if grad_clip is not None:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return outcome


def train_epochs(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    gradients: Gradients,
    *,
    epochs: int,
    device: torch.device,
    generator: torch.Generator | None = None,
    mix: bool = False,
    grad_clip: float | None = None,
    min_batch: int = 1,
) -> TrainStats:
    """Every method's local loop: ``epochs`` passes over the loader, one :func:`optimizer_step`
    per mini-batch (batches under ``min_batch`` examples skipped); the mean reported loss over
    the examples trained, and their forward MACs."""
    start = time.perf_counter()
    model.to(device).train()
    loss_sum, examples, steps, forward_macs = 0.0, 0, 0, 0
    for _ in range(epochs):
        for x, y in loader:
            if len(y) < min_batch:
                continue
            x, y = x.to(device), y.to(device)
            outcome = optimizer_step(
                model, optimizer, x, y, gradients, generator=generator, mix=mix, grad_clip=grad_clip
            )
            loss_sum += outcome.loss * len(y)
            examples += len(y)
            forward_macs += outcome.forward_macs * len(y)
            steps += 1
    seconds = time.perf_counter() - start
    return TrainStats(loss_sum / max(examples, 1), examples, steps, seconds, forward_macs)


def train_supervised(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
) -> TrainStats:
    """Plain cross-entropy training; returns the mean loss over all examples seen."""
    gradients = backward(lambda x, y, _, __: nn.functional.cross_entropy(model(x), y))
    return train_epochs(model, loader, optimizer, gradients, epochs=epochs, device=device)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> dict[str, float]:
    """Mean cross-entropy and top-1 accuracy over a loader."""
    model.to(device).eval()
    loss_sum, correct, total = 0.0, 0, 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        total += len(y)
    return {
        LOSS: loss_sum / max(total, 1),
        ACCURACY: correct / max(total, 1),
        "examples": total,
    }
