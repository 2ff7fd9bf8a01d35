"""A method that fedapp does not ship, added the way the README's "Adding a method" says: its
settings section and its two halves; the test adds its row to the method table.

FedAvg with a server learning rate (FedAvgM without momentum): the new global model moves
``toy.server-lr`` of the way from the old one to the clients' mean, and each client trains
``toy.client-epochs`` epochs. With a rate of 1 and the run's local epochs it is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as with_changes

import numpy as np
from flwr.app import Message, RecordDict

from fedapp.clients.fedavg import train_named_model
from fedapp.config import RunConfig
from fedapp.profiles import LocalNode
from fedapp.settings.base import Section, at_least, fraction, setting
from fedapp.strategies.base import State
from fedapp.strategies.fedavg import FedAvgStrategy
from fedapp.strategies.reply_validation import ValidReply


@dataclass(frozen=True)
class ToySettings(Section):
    name = "toy"

    server_lr: float = setting(fraction(True, 1, False))
    client_epochs: int = setting(at_least(1))


class ToyStrategy(FedAvgStrategy):
    """The server half: FedAvg's mean, then a step of ``server-lr`` towards it."""

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        mean = super().aggregate(server_round, replies, global_state)
        rate = self.cfg.section(ToySettings).server_lr
        return {
            name: (rate * mean[name] + (1 - rate) * old).astype(old.dtype)
            if np.issubdtype(old.dtype, np.floating)
            else mean[name]
            for name, old in global_state.items()
        }


def train(message: Message, cfg: RunConfig, node: LocalNode) -> RecordDict:
    """The client half: FedAvg's local SGD for ``client-epochs`` epochs."""
    epochs = cfg.section(ToySettings).client_epochs
    return train_named_model(cfg.model, message, with_changes(cfg, local_epochs=epochs), node)
