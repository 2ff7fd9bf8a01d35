"""The client trainer of each strategy, by the strategy's name."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from flwr.app import Message, RecordDict

from fedapp.config import RunConfig
from fedapp.profiles import LocalNode

#: (train message, run config, this node) -> reply content
Trainer = Callable[[Message, RunConfig, LocalNode], RecordDict]

_TRAINERS: dict[str, str] = {
    "fedavg": "fedapp.clients.fedavg:train",
    "feast": "fedapp.clients.feast:train",
}


def client_trainer(strategy: str) -> Trainer:
    """The local training rule that answers the named strategy's TRAIN messages."""
    module, func = _TRAINERS[strategy].split(":")
    return getattr(import_module(module), func)
