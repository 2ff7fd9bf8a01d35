"""HeteroFL client: train the leading-slice sub-model of one width with static BN, the Scaler and
masked cross-entropy (Diao et al., ICLR 2021).

The server sends the width and the weights (no BN statistics: static BN keeps none); the client
trains them on its shard and replies with the weights plus the mask of the classes it holds, which
the server needs to restrict its classifier rows when averaging.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict

from fedapp.data.transforms import mixed_cross_entropy
from fedapp.methods.common.local_round import local_sgd, train_local_epochs
from fedapp.methods.heterofl.keys import LABEL_MASK, WIDTH_KEY
from fedapp.models.counter import count
from fedapp.models.substrate import width_arch
from fedapp.models.width_scaling import width_model
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.run.run_models import substrate_config
from fedapp.training.loops import backward
from fedapp.training.train_metrics import train_metrics
from fedapp.wire.messages import ARRAYS, CONFIG, METRICS
from fedapp.wire.records import load_into, to_record


def class_mask(labels: np.ndarray, num_classes: int) -> torch.Tensor:
    """Boolean mask of the classes that occur in ``labels``."""
    mask = torch.zeros(num_classes, dtype=torch.bool)
    mask[torch.from_numpy(np.unique(labels))] = True
    return mask


def masked_logits(logits: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Logits of absent classes set to 0 (HeteroFL fills with 0, not -inf): the softmax still
    gives them mass, but their rows receive no gradient."""
    return logits.masked_fill(~present.to(logits.device), 0.0)


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round of local SGD on the node's width, then the weights and the class mask back."""
    started = time.perf_counter()
    info = run.info
    config = substrate_config(run.substrate, info)
    settings = message.content[CONFIG]
    rate = float(settings[WIDTH_KEY])
    model = width_model(config, rate)
    load_into(model, message.content[ARRAYS])
    present = class_mask(node.shard(run.data).labels, info.num_classes)
    generator, loader, optimizer = local_sgd(model, message, run, node)

    def loss_of(x: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float) -> torch.Tensor:
        return mixed_cross_entropy(masked_logits(model(x), present), y_a, y_b, lam)

    # static BN cannot normalise a lone example by its batch statistics
    stats = train_local_epochs(
        model, loader, optimizer, backward(loss_of), run.training, generator, min_batch=2
    )
    macs = count(config, width_arch(config, rate)).macs
    seconds = time.perf_counter() - started
    metrics = MetricRecord(
        train_metrics(len(loader.dataset), stats, seconds, macs * stats.examples)
    )
    arrays = {**model.state_dict(), LABEL_MASK: present.numpy().astype(np.float32)}
    return RecordDict({ARRAYS: to_record(arrays), METRICS: metrics})
