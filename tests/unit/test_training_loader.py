"""A client's training batches: a lone last image is left out, so batch norm can train."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedapp.data.registry import ImageArrays, load_dataset
from fedapp.training.loops import train_loader


def _shard(size: int) -> tuple[ImageArrays, object]:
    digits = load_dataset("digits")
    train = digits.train
    return ImageArrays(train.images[:size], train.labels[:size]), digits.info


@pytest.mark.parametrize(
    ("size", "batches"), [(33, [32]), (34, [32, 2]), (64, [32, 32]), (1, [1]), (20, [20])]
)
def test_batch_sizes(size: int, batches: list[int]) -> None:
    shard, info = _shard(size)
    loader = train_loader(shard, info, 32, torch.Generator().manual_seed(0))
    assert [len(labels) for _, labels in loader] == batches


def test_a_batch_norm_network_trains_on_a_shard_one_above_the_batch_size() -> None:
    shard, info = _shard(33)
    # BN over one value per channel, as after a ResNet's last stage on 8x8 images
    model = nn.Sequential(nn.Flatten(), nn.LazyLinear(8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    for images, labels in train_loader(shard, info, 32, torch.Generator().manual_seed(0)):
        nn.functional.cross_entropy(model(images), labels).backward()
