"""FedDF client: FedAvg's local SGD, on this client's prototype (the largest candidate of the
run's family its budget affords, named by the server); it sends the trained prototype back."""

from __future__ import annotations

from flwr.app import Message, RecordDict

from fedapp.methods.common.whole_model_client import train_named_model
from fedapp.methods.feddf.keys import PROTOTYPE
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.wire.messages import CONFIG


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """``local-epochs`` of SGD on the received prototype (with FedAvg's compute proxy)."""
    return train_named_model(str(message.content[CONFIG][PROTOTYPE]), message, run, node)
