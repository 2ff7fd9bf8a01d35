"""FedDF client: FedAvg's local SGD, on this client's prototype (the largest candidate of the
run's family its budget affords, named by the server); it sends the trained prototype back."""

from __future__ import annotations

from flwr.app import Message, RecordDict

from fedapp.clients.feast import FORWARD_BACKWARD_FACTOR
from fedapp.clients.fedavg import train_named_model
from fedapp.config import RunConfig
from fedapp.federated_data import population
from fedapp.messages import CONFIG, METRICS, NUM_EXAMPLES
from fedapp.models.families import describe
from fedapp.profiles import LocalNode
from fedapp.strategies.base import COMPUTE_METRIC


def train(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """``local-epochs`` of SGD on the received prototype; reports its training compute."""
    prototype = str(message.content[CONFIG]["prototype"])
    reply = train_named_model(prototype, message, cfg, node)
    metrics = reply.metric_records[METRICS]
    macs = describe(prototype, population(cfg).info, cfg.batch_size).macs
    examples_seen = int(metrics[NUM_EXAMPLES]) * cfg.local_epochs
    metrics[COMPUTE_METRIC] = float(FORWARD_BACKWARD_FACTOR * macs * examples_seen)
    return reply
