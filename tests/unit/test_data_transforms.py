"""Transforms, ImageDataset and the batch Mixup/CutMix helper."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from fedapp.data.registry import DatasetInfo, ImageArrays, load_dataset
from fedapp.data.transforms import (
    ImageDataset,
    eval_transform,
    mix_batch,
    mixed_cross_entropy,
    train_transform,
)


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist-5k")


@pytest.fixture(scope="module")
def cifar_like(mnist) -> tuple[DatasetInfo, torch.Tensor]:
    """Real MNIST digits padded to 32x32 RGB, with the CIFAR-100 info and augmentation."""
    images = torch.tensor(mnist.train.images[:16]).repeat(1, 3, 1, 1)
    images = F.pad(images, (2, 2, 2, 2))
    info = DatasetInfo(
        "cifar100", 100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), "cifar", True
    )
    return info, images


def test_eval_transform_normalises(mnist) -> None:
    image = torch.tensor(mnist.train.images[0])
    out = eval_transform(mnist.info)(image)
    assert out.shape == (1, 28, 28) and out.dtype == torch.float32
    expected = (image.float() / 255.0 - 0.1307) / 0.3081
    assert torch.allclose(out, expected, atol=1e-6)


def test_no_augmentation_means_train_equals_eval(mnist) -> None:
    image = torch.tensor(mnist.train.images[1])
    assert torch.equal(train_transform(mnist.info)(image), eval_transform(mnist.info)(image))


def test_cifar_train_transform_augments(cifar_like) -> None:
    info, images = cifar_like
    transform = train_transform(info)
    torch.manual_seed(0)
    outs = torch.stack([transform(image) for image in images])
    assert outs.shape == (16, 3, 32, 32) and outs.dtype == torch.float32
    assert torch.isfinite(outs).all()
    # Random crop/flip/RandAugment: the same image twice almost surely differs.
    assert not torch.equal(transform(images[0]), transform(images[0]))
    with pytest.raises(ValueError, match="unknown augmentation"):
        train_transform(dataclasses.replace(info, augmentation="heavy"))


def test_image_dataset_serves_tensor_and_int(mnist) -> None:
    arrays = ImageArrays(mnist.train.images[:10], mnist.train.labels[:10])
    dataset = ImageDataset(arrays, eval_transform(mnist.info))
    assert len(dataset) == 10
    image, label = dataset[3]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert isinstance(label, int) and label == int(mnist.train.labels[3])


def _batch(size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    # Distinct labels let the test read the partner permutation off y_b; Gaussian pixels make
    # every pixel pair differ so the CutMix box can be measured exactly.
    x = torch.randn(size, 3, 16, 16, generator=torch.Generator().manual_seed(123))
    return x, torch.arange(size)


def test_mix_batch_contract_and_both_branches() -> None:
    x, y = _batch()
    branches = set()
    for seed in range(40):
        mixed, y_a, y_b, lam = mix_batch(x, y, torch.Generator().manual_seed(seed))
        assert 0.0 <= lam <= 1.0 and mixed.shape == x.shape
        assert torch.equal(y_a, y) and torch.equal(torch.sort(y_b).values, y)
        partner = x[y_b]
        if torch.allclose(mixed, lam * x + (1 - lam) * partner, atol=1e-6):
            branches.add("mixup")
            continue
        # CutMix: every pixel comes from the image or its partner; lam = own-pixel fraction.
        own = (mixed == x).all(dim=1)
        assert ((mixed == x) | (mixed == partner)).all()
        moved = y_b != y
        fraction = own[moved].float().mean(dim=(1, 2))
        assert torch.allclose(fraction, torch.full_like(fraction, lam), atol=1e-6)
        branches.add("cutmix")
    assert branches == {"mixup", "cutmix"}


def test_mix_batch_is_deterministic_by_generator() -> None:
    x, y = _batch()
    first = mix_batch(x, y, torch.Generator().manual_seed(7))
    second = mix_batch(x, y, torch.Generator().manual_seed(7))
    assert torch.equal(first[0], second[0]) and torch.equal(first[2], second[2])
    assert first[3] == second[3]
    with pytest.raises(ValueError, match="> 0"):
        mix_batch(x, y, torch.Generator(), mixup_alpha=0.0)


def test_mixed_cross_entropy_weights_both_targets() -> None:
    logits = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    y_a, y_b = torch.tensor([0, 1, 2, 3, 0, 1]), torch.tensor([3, 2, 1, 0, 3, 2])
    expected = 0.3 * F.cross_entropy(logits, y_a) + 0.7 * F.cross_entropy(logits, y_b)
    assert torch.allclose(mixed_cross_entropy(logits, y_a, y_b, 0.3), expected)
    assert torch.allclose(mixed_cross_entropy(logits, y_a, y_b, 1.0), F.cross_entropy(logits, y_a))
