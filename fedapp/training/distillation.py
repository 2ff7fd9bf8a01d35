"""Knowledge distillation on the public set, shared by every method that exchanges predictions
(FedKD-NAS, Local-KD, FedMD, FedDistill) or distils on the server (FedDF).

The public set is a server-held split of the training pool (``federated_data.public_images``
gives clients its images without labels).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.data.transforms import ImageDataset, eval_transform, train_transform
from fedapp.training.loops import eval_loader

PREDICT_BATCH_SIZE = 256


def kd_loss(student: torch.Tensor, target: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """T^2 * KL(softmax(target / T) || softmax(student / T)), averaged over the batch."""
    return (temperature**2) * nn.functional.kl_div(
        nn.functional.log_softmax(student / temperature, dim=1),
        nn.functional.log_softmax(target / temperature, dim=1),
        reduction="batchmean",
        log_target=True,
    )


@torch.no_grad()
def predict_logits(
    model: nn.Module, images: ImageArrays, info: DatasetInfo, device: torch.device
) -> np.ndarray:
    """A model's logits on a set of images (eval mode, no augmentation), float32 (M, C)."""
    model.to(device).eval()
    batches = [
        model(x.to(device)).float().cpu() for x, _ in eval_loader(images, info, PREDICT_BATCH_SIZE)
    ]
    return torch.cat(batches).numpy()


class WithTargets(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Images paired with per-image target vectors (logits or soft labels) instead of labels."""

    def __init__(self, images: ImageArrays, targets: np.ndarray, augment: bool, info: DatasetInfo):
        if len(images.images) != len(targets):
            raise ValueError(f"{len(images.images)} images but {len(targets)} target rows")
        transform = train_transform(info) if augment else eval_transform(info)
        self._images = ImageDataset(images, transform)
        self._targets = torch.as_tensor(np.asarray(targets, dtype=np.float32))

    def __len__(self) -> int:
        return len(self._targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._images[index][0], self._targets[index]


def target_loader(
    images: ImageArrays,
    targets: np.ndarray,
    info: DatasetInfo,
    batch_size: int,
    generator: torch.Generator,
    augment: bool = False,
) -> DataLoader:
    """Shuffled (image, target row) batches in an order fixed by the generator."""
    dataset = WithTargets(images, targets, augment, info)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)


def endless(loader: DataLoader) -> Iterator:
    """Cycle through a loader forever (pairs public batches with private ones of another size)."""
    while True:
        yield from loader
