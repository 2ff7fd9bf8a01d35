"""Local training and evaluation loops shared by every client trainer and the server."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.data.transforms import ImageDataset, eval_transform, train_transform


@dataclass(frozen=True)
class TrainStats:
    """What one local training call did."""

    loss: float
    examples: int
    steps: int
    seconds: float


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present; 'cuda' without a GPU is a clear error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' was requested but no CUDA GPU is visible")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_local_work(*seeds: int) -> torch.Generator:
    """Fix all randomness of one piece of local work by (run seed, round, partition, ...).

    Seeds torch's global generator (dropout, augmentation) and returns a generator for the data
    order, so a round's result depends on its own seeds only, not on what the process ran before
    (which differs between a Ray actor, a fresh device process and a resumed run).
    """
    mixed = 0
    for s in seeds:
        mixed = (mixed * 1_000_003 + int(s)) % (2**63 - 1)
    torch.manual_seed(mixed)
    return torch.Generator().manual_seed(mixed)


def train_loader(
    arrays: ImageArrays, info: DatasetInfo, batch_size: int, generator: torch.Generator
) -> DataLoader:
    """Shuffled, augmented batches of a client's shard, in an order fixed by the generator."""
    dataset = ImageDataset(arrays, train_transform(info))
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)


def eval_loader(arrays: ImageArrays, info: DatasetInfo, batch_size: int) -> DataLoader:
    """Batches of a held-out set in its stored order, without augmentation."""
    return DataLoader(ImageDataset(arrays, eval_transform(info)), batch_size=batch_size)


def sgd(model: nn.Module, lr: float, momentum: float, weight_decay: float) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)


def train_supervised(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
) -> TrainStats:
    """Plain cross-entropy training; returns the mean loss over all examples seen."""
    start = time.perf_counter()
    model.to(device).train()
    loss_sum, examples, steps = 0.0, 0, 0
    for _ in range(epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            examples += len(y)
            steps += 1
    return TrainStats(loss_sum / max(examples, 1), examples, steps, time.perf_counter() - start)


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
        "loss": loss_sum / max(total, 1),
        "accuracy": correct / max(total, 1),
        "examples": total,
    }
