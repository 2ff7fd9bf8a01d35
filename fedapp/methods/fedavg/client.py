"""FedAvg client: local SGD on the whole received model."""

from __future__ import annotations

from flwr.app import Message, RecordDict

from fedapp.methods.common.whole_model_client import train_named_model
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round of local SGD on the run's model."""
    return train_named_model(run.model, message, run, node)
