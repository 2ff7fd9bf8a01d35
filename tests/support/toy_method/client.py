"""The toy method's client half: whole-model local SGD for ``client-epochs`` epochs."""

from __future__ import annotations

from dataclasses import replace as with_changes

from flwr.app import Message, RecordDict

from fedapp.methods.common.whole_model_client import train_named_model
from fedapp.run.config import RunConfig
from fedapp.run.profiles import LocalNode
from toy_method.settings import ToySettings


def train(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    epochs = cfg.section(ToySettings).client_epochs
    return train_named_model(cfg.model, message, with_changes(cfg, local_epochs=epochs), node)
