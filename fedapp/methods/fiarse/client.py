"""FIARSE client (Wu et al., NeurIPS 2024): train the importance-aware sub-model, send its delta.

The payload is the full-shape substrate with every masked value below its tensor's threshold set
to zero; the thresholds come in the config. Each forward runs on ``w * 1[|w| >= t]`` with the
threshold-controlled gradient (fedapp.models.masks), so masked values get exactly zero gradient
and, with SGD without weight decay, stay bit-identical (a zero gradient leaves a zero momentum
buffer). Momentum is the run's ``momentum``, shared with the other methods; the authors use plain
SGD (``momentum = 0``) with 100 local steps per round.
The reply is ``end - start`` of every state entry (BN statistics included); the server averages
each position over the clients whose delta there is non-zero.
"""

from __future__ import annotations

import time

import torch
from flwr.app import Message, MetricRecord, RecordDict
from torch.func import functional_call

from fedapp.data.transforms import mixed_cross_entropy
from fedapp.methods.common.local_round import local_sgd, train_local_epochs
from fedapp.methods.fiarse.keys import MASK_MACS, THRESHOLDS
from fedapp.models.masks import full_model, masked_names, masked_parameters
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.run.run_models import substrate_config
from fedapp.training.loops import backward
from fedapp.training.train_metrics import train_metrics
from fedapp.wire.messages import ARRAYS, CONFIG, METRICS
from fedapp.wire.records import load_into, to_record


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round of masked local SGD; the reply is the change of every state entry."""
    started = time.perf_counter()
    info = run.info
    config = message.content[CONFIG]
    model = full_model(substrate_config(run.substrate, info))
    load_into(model, message.content[ARRAYS])
    start = {k: v.clone() for k, v in model.state_dict().items()}
    names = masked_names(model)
    thresholds = dict(zip(names, (float(t) for t in config[THRESHOLDS]), strict=True))
    # No weight decay: it would move masked values, which must stay bit-identical.
    generator, loader, optimizer = local_sgd(model, message, run, node, weight_decay=0.0)

    def loss_of(x: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float) -> torch.Tensor:
        logits = functional_call(model, masked_parameters(model, names, thresholds), (x,))
        return mixed_cross_entropy(logits, y_a, y_b, lam)

    stats = train_local_epochs(
        model, loader, optimizer, backward(loss_of), run.training, generator, clip=False
    )
    delta = {k: v.cpu() - start[k] for k, v in model.state_dict().items()}
    seconds = time.perf_counter() - started
    forward_macs = float(config[MASK_MACS]) * stats.examples
    metrics = MetricRecord(train_metrics(len(loader.dataset), stats, seconds, forward_macs))
    return RecordDict({ARRAYS: to_record(delta), METRICS: metrics})
