"""The whole-model client half: load the received model, train it on the local shard, send it
back (FedAvg's client; Ditto's global copy and FedDF's prototypes train so)."""

from __future__ import annotations

from flwr.app import Message, MetricRecord, RecordDict

from fedapp.methods.common.local_round import local_sgd
from fedapp.models.zoo import build_model, forward_macs
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.training.loops import resolve_device, train_supervised
from fedapp.training.proximal import add_proximal_term
from fedapp.training.train_metrics import train_metrics
from fedapp.wire.messages import ARRAYS, METRICS
from fedapp.wire.records import load_into, to_record


def train_named_model(
    name: str, message: Message, run: RunContext, node: LocalNode, proximal_mu: float = 0.0
) -> RecordDict:
    """Local SGD on the received weights of the named model (FedDF: the client's prototype),
    pulled towards them by ``proximal_mu`` (FedProx; 0: plain SGD); reports the compute proxy
    (3 x forward MACs x examples trained)."""
    info = run.info
    model = build_model(name, info)
    load_into(model, message.content[ARRAYS])
    device = resolve_device(run.training.device)
    _, loader, optimizer = local_sgd(model, message, run, node)
    if proximal_mu > 0:
        anchor = [p.detach().to(device).clone() for p in model.parameters()]
        add_proximal_term(optimizer, anchor, proximal_mu)
    stats = train_supervised(model, loader, optimizer, run.training.local_epochs, device)
    forward = forward_macs(name, info) * stats.examples
    metrics = MetricRecord(train_metrics(len(loader.dataset), stats, stats.seconds, forward))
    return RecordDict({ARRAYS: to_record(model.state_dict()), METRICS: metrics})
