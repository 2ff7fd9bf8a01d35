"""FedDistill client: Jeong et al. 2018 federated distillation, PFLlib's formulation.

No weights travel. The client trains its own kept model on its private shard with
``CE + lambda * MSE(output, global logit of the sample's label)`` (samples whose label has no
global logit yet contribute zero to the MSE term, as in PFLlib), records the detached logits of
every training sample by label, and uploads the per-label mean logits with the per-label counts
(a label it never saw is a zero row with count 0).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Message, MetricRecord, RecordDict
from torch import nn

from fedapp.methods.common.local_round import local_sgd, round_generator
from fedapp.methods.common.own_model import keep_own_model, load_own_model, own_candidate
from fedapp.methods.feddistill.keys import GLOBAL_LOGITS, GLOBAL_PRESENT, LABEL_COUNTS, LABEL_LOGITS
from fedapp.methods.feddistill.settings import FedDistillSettings
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.training.loops import (
    backward,
    resolve_device,
    train_epochs,
)
from fedapp.training.train_metrics import FORWARD_BACKWARD_FACTOR
from fedapp.wire.messages import (
    ARRAYS,
    COMPUTE_METRIC,
    METRICS,
    NUM_EXAMPLES,
    TRAIN_LOSS,
    TRAIN_SECONDS,
)
from fedapp.wire.records import from_record, to_record


def distillation_loss(
    output: torch.Tensor,
    labels: torch.Tensor,
    global_logits: torch.Tensor,
    present: torch.Tensor,
    weight: float,
) -> torch.Tensor:
    """CE + weight * MSE(output, target), target = the global logit of each sample's label where
    one exists, else the sample's own detached output (zero distance); MSE over batch x classes."""
    has_global = present[labels].bool()
    target = torch.where(has_global[:, None], global_logits[labels], output.detach())
    return nn.functional.cross_entropy(output, labels) + weight * nn.functional.mse_loss(
        output, target
    )


class LabelLogits:
    """Running per-label sums of detached logits (PFLlib's per-label lists, kept as sums)."""

    def __init__(self, num_classes: int) -> None:
        self.sums = torch.zeros(num_classes, num_classes, dtype=torch.float64)
        self.counts = torch.zeros(num_classes, dtype=torch.float64)

    def add(self, output: torch.Tensor, labels: torch.Tensor) -> None:
        self.sums.index_add_(0, labels.cpu(), output.detach().cpu().double())
        self.counts += torch.bincount(labels.cpu(), minlength=len(self.counts)).double()

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        """(per-label mean logits, counts), float32; zero rows for labels never seen."""
        means = self.sums / self.counts.clamp(min=1)[:, None]
        return means.float().numpy(), self.counts.float().numpy()


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """Local epochs on the private shard with the FD loss; upload per-label mean logits."""
    start = time.perf_counter()
    info = run.info
    device = resolve_device(run.training.device)
    generator = round_generator(message, run, node)  # before the model: a new one is seeded
    model, _ = load_own_model(run, node, info)
    received = from_record(message.content[ARRAYS])
    global_logits = torch.as_tensor(received[GLOBAL_LOGITS], device=device)
    present = torch.as_tensor(received[GLOBAL_PRESENT], device=device)
    _, loader, optimizer = local_sgd(model, message, run, node, generator=generator)
    recorded = LabelLogits(info.num_classes)

    def loss_of(x: torch.Tensor, y: torch.Tensor, _: torch.Tensor, __: float) -> torch.Tensor:
        output = model(x)
        recorded.add(output, y)
        return distillation_loss(
            output, y, global_logits, present, run.section(FedDistillSettings).kd_weight
        )

    stats = train_epochs(
        model, loader, optimizer, backward(loss_of), epochs=run.training.local_epochs, device=device
    )
    keep_own_model(node, model)
    means, counts = recorded.means()
    macs = own_candidate(run, info, node.budget).macs
    metrics = {
        NUM_EXAMPLES: len(loader.dataset),
        TRAIN_LOSS: stats.loss,
        TRAIN_SECONDS: time.perf_counter() - start,
        COMPUTE_METRIC: float(FORWARD_BACKWARD_FACTOR * macs * stats.examples),
    }
    arrays = {LABEL_LOGITS: means, LABEL_COUNTS: counts}
    return RecordDict({ARRAYS: to_record(arrays), METRICS: MetricRecord(metrics)})
