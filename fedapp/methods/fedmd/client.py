"""FedMD client (Li & Wang 2019): transfer learning, then per round digest and revisit.

One TRAIN message of round r does, in this order:
1. on its first message only: transfer learning, i.e. train on the LABELED public set, then on
   the private shard (fixed epochs: the authors' early stopping needs a validation set the
   client does not have);
2. when the message carries a consensus (computed from round r-1's uploads on round r-1's
   alignment subset): digest, i.e. fit the model's logits to it with L1 loss (the authors'
   mean_absolute_error, Adam 1e-3), then revisit, i.e. cross-entropy on the private shard;
3. upload the model's logits on round r's fresh, stratified alignment subset.
So the digest -> revisit order of the paper holds, and round r's upload is what the paper's
round r+1 communicates.

Labeled public data is FedMD's documented exception in this project: elsewhere clients see only
the public images (``fedapp.run.federated_data.public_images``), but FedMD's protocol gives
every party the labeled public set for its transfer-learning step, so its clients derive
``server_set(run.data, 'public')`` with labels. The labels also make the alignment subsets
stratified.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict
from torch import nn
from torch.utils.data import DataLoader

from fedapp.data.registry import ImageArrays
from fedapp.methods.common.local_round import round_generator, shard_loader
from fedapp.methods.common.own_model import keep_own_model, load_own_model, own_candidate
from fedapp.methods.fedmd.keys import CONSENSUS, CONSENSUS_ROUND
from fedapp.methods.fedmd.settings import FedMDSettings
from fedapp.partitions.apportion import apportion
from fedapp.random_streams import Stream, stream_rng
from fedapp.run.context import RunContext
from fedapp.run.federated_data import server_set
from fedapp.run.profiles import LocalNode
from fedapp.training.distillation import predict_logits, target_loader
from fedapp.training.loops import (
    backward,
    resolve_device,
    train_epochs,
    train_loader,
    train_supervised,
)
from fedapp.training.train_metrics import FORWARD_BACKWARD_FACTOR
from fedapp.wire.messages import (
    ARRAYS,
    COMPUTE_METRIC,
    CONFIG,
    LOGITS,
    METRICS,
    NUM_EXAMPLES,
    SERVER_ROUND,
    TRAIN_LOSS,
    TRAIN_SECONDS,
)
from fedapp.wire.records import from_record, to_record

#: The authors' optimiser for every FedMD step (transfer, digest, revisit).
ADAM_LR = 1e-3
PUBLIC_BATCH_SIZE = 128  # the authors' pre-training batch
DIGEST_BATCH_SIZE = 256  # the authors' logits_matching_batchsize (balanced configs)


def alignment_indices(labels: np.ndarray, size: int, seed: int, server_round: int) -> np.ndarray:
    """A stratified sample of ``size`` public indices, fixed by (seed, round), sorted.

    Each class gets its proportional share, rounded down; the leftover places go to the classes
    with the largest remainders (ties to the lower class).
    """
    classes, counts = np.unique(labels, return_counts=True)
    share = apportion(counts, size)
    rng = stream_rng(seed, Stream.FEDMD_ALIGNMENT, server_round)
    chosen = [
        rng.choice(np.flatnonzero(labels == c), size=n, replace=False)
        for c, n in zip(classes, share, strict=True)
    ]
    return np.sort(np.concatenate(chosen))


def alignment_set(run: RunContext, server_round: int) -> ImageArrays:
    """Round ``server_round``'s alignment subset of the public set (labels kept, unused)."""
    public = server_set(run.data, "public")
    index = alignment_indices(
        public.labels, run.section(FedMDSettings).alignment_size, run.training.seed, server_round
    )
    return ImageArrays(public.images[index], public.labels[index])


def digest_loss(logits: torch.Tensor, consensus: torch.Tensor) -> torch.Tensor:
    """L1 distance of the logits to the consensus, mean over examples and classes (Keras MAE)."""
    return nn.functional.l1_loss(logits, consensus)


def digest(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device,
) -> int:
    """Fit the model's logits to the consensus; returns the examples seen."""
    gradients = backward(lambda x, target, _, __: digest_loss(model(x), target))
    return train_epochs(model, loader, optimizer, gradients, epochs=epochs, device=device).examples


def adam(model: nn.Module) -> torch.optim.Adam:
    return torch.optim.Adam(model.parameters(), lr=ADAM_LR)


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One FedMD round of this client (see the module docstring for the order of steps)."""
    start = time.perf_counter()
    info = run.info
    device = resolve_device(run.training.device)
    server_round = int(message.content[CONFIG][SERVER_ROUND])
    generator = round_generator(message, run, node)  # before the model: a new one is seeded
    fedmd = run.section(FedMDSettings)
    model, fresh = load_own_model(run, node, info)
    private = shard_loader(run, node, generator)
    trained, private_loss = 0, float("nan")
    if fresh:  # transfer learning: labeled public set, then private data
        public = train_loader(server_set(run.data, "public"), info, PUBLIC_BATCH_SIZE, generator)
        stats = train_supervised(model, public, adam(model), fedmd.pretrain_public_epochs, device)
        trained += stats.examples
        stats = train_supervised(model, private, adam(model), fedmd.pretrain_private_epochs, device)
        trained, private_loss = trained + stats.examples, stats.loss
    received = from_record(message.content[ARRAYS])
    consensus_round = int(received[CONSENSUS_ROUND])
    if consensus_round > 0:
        targets = target_loader(
            alignment_set(run, consensus_round),
            received[CONSENSUS],
            info,
            DIGEST_BATCH_SIZE,
            generator,
        )
        trained += digest(model, targets, adam(model), fedmd.digest_epochs, device)
        stats = train_supervised(model, private, adam(model), fedmd.revisit_epochs, device)
        trained, private_loss = trained + stats.examples, stats.loss
    uploaded = predict_logits(model, alignment_set(run, server_round), info, device)
    keep_own_model(node, model)
    macs = own_candidate(run, info, node.budget).macs
    metrics = {
        NUM_EXAMPLES: len(private.dataset),
        TRAIN_SECONDS: time.perf_counter() - start,
        COMPUTE_METRIC: float(macs * (FORWARD_BACKWARD_FACTOR * trained + len(uploaded))),
    }
    if np.isfinite(private_loss):
        metrics[TRAIN_LOSS] = private_loss
    return RecordDict({ARRAYS: to_record({LOGITS: uploaded}), METRICS: MetricRecord(metrics)})
