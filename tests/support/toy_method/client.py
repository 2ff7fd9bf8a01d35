"""The toy method's client half: whole-model local SGD for ``client-epochs`` epochs."""

from __future__ import annotations

from dataclasses import replace as with_changes

from flwr.app import Message, RecordDict

from fedapp.methods.common.whole_model_client import train_named_model
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from toy_method.settings import ToySettings


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    epochs = run.section(ToySettings).client_epochs
    training = with_changes(run.training, local_epochs=epochs)
    return train_named_model(run.model, message, with_changes(run, training=training), node)
