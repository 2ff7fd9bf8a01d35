"""Per-data-set image transforms, a torch Dataset over uint8 arrays, and batch Mixup/CutMix.

The CIFAR recipe follows FEAST's ``mixaug`` pipeline: RandomCrop(size, padding 4), horizontal
flip, RandAugment(2, 6), then normalisation; evaluation only normalises. Mixup/CutMix works on a
whole batch after the per-image transforms, as in the reference trainer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from fedapp.data.registry import DatasetInfo, ImageArrays

Transform = Callable[[torch.Tensor], torch.Tensor]


class Normalise:
    """uint8 CHW -> float CHW in [0, 1], then (x - mean) / std per channel: the same operations
    as torchvision's ``v2.ToDtype(float32, scale=True)`` + ``v2.Normalize``, in plain torch, so
    that data sets without augmentation never import torchvision (about 1 s per process)."""

    def __init__(self, info: DatasetInfo) -> None:
        self._mean = torch.tensor(info.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(info.std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32).mul_(1.0 / 255).sub_(self._mean).div_(self._std)


def train_transform(info: DatasetInfo) -> Transform:
    """uint8 CHW tensor -> augmented, normalised float CHW tensor (augmentation per data set)."""
    if info.augmentation == "none":
        return Normalise(info)
    if info.augmentation != "cifar":
        raise ValueError(f"unknown augmentation {info.augmentation!r}; known: 'cifar', 'none'")
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomCrop(info.image_size, padding=4),
            v2.RandomHorizontalFlip(),
            v2.RandAugment(num_ops=2, magnitude=6),
            Normalise(info),
        ]
    )


def eval_transform(info: DatasetInfo) -> Transform:
    """uint8 CHW tensor -> normalised float CHW tensor, no randomness."""
    return Normalise(info)


def _per_pixel(transform: Transform) -> bool:
    """Whether ``transform`` is per-pixel arithmetic only (no augmentation): then applying it to a
    stack of images gives bit for bit what applying it image by image gives, at a fraction of
    the cost."""
    return isinstance(transform, Normalise)


class ImageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Serves ``(transform(image), label)`` pairs from uint8 NCHW arrays.

    A DataLoader fetches a batch through ``__getitems__``: a per-pixel transform then runs once
    on the batch's stacked images instead of once per image (the same values, since every
    element goes through the same arithmetic); random augmentations still run per image.
    """

    def __init__(self, arrays: ImageArrays, transform: Transform) -> None:
        # One copy up front: the registry's arrays are read-only, which torch.from_numpy rejects.
        self._images = torch.tensor(arrays.images, dtype=torch.uint8)
        self._labels = arrays.labels.tolist()
        self._transform = transform
        self._batched = _per_pixel(transform)

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self._transform(self._images[index]), self._labels[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        if not self._batched:
            return [self[i] for i in indices]
        images = self._transform(self._images[indices])
        return list(zip(images.unbind(0), (self._labels[i] for i in indices), strict=True))


def mix_batch(
    x: torch.Tensor,
    y: torch.Tensor,
    generator: torch.Generator,
    mixup_alpha: float = 0.4,
    cutmix_alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Mix a batch with Mixup (prob. 1/2) or CutMix; returns ``(x_mixed, y_a, y_b, lam)``.

    ``y_a`` is ``y`` and ``y_b`` is ``y`` permuted like the partner images, so the loss is
    ``lam * CE(z, y_a) + (1 - lam) * CE(z, y_b)``. For CutMix, ``lam`` is recomputed from the
    pasted box after clipping it to the image, so it equals the true unmixed-area fraction.
    All randomness comes from the CPU ``generator``, which makes the result reproducible.
    """
    if mixup_alpha <= 0 or cutmix_alpha <= 0:
        raise ValueError(
            f"mixup_alpha and cutmix_alpha must be > 0, got {mixup_alpha} and {cutmix_alpha}"
        )
    use_mixup = bool(torch.rand(1, generator=generator) < 0.5)
    # torch's Beta sampler takes no generator; derive a numpy one from it instead.
    beta_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    alpha = mixup_alpha if use_mixup else cutmix_alpha
    lam = float(np.random.default_rng(beta_seed).beta(alpha, alpha))
    perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
    y_b = y[perm]
    if use_mixup:
        return lam * x + (1.0 - lam) * x[perm], y, y_b, lam

    height, width = x.shape[-2:]
    cut = (1.0 - lam) ** 0.5
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy = int(torch.randint(0, height, (1,), generator=generator))
    cx = int(torch.randint(0, width, (1,), generator=generator))
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
    mixed = x.clone()
    mixed[..., top:bottom, left:right] = x[perm, ..., top:bottom, left:right]
    lam = 1.0 - (bottom - top) * (right - left) / (height * width)
    return mixed, y, y_b, lam


def mixed_cross_entropy(
    logits: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float
) -> torch.Tensor:
    """Cross-entropy against the two label sets of a mixed batch, weighted by ``lam``."""
    return lam * F.cross_entropy(logits, y_a) + (1.0 - lam) * F.cross_entropy(logits, y_b)
