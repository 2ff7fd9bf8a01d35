"""The client half of Flower's strategies: FedAvg's local SGD on the whole received model, with
FedProx's proximal term where the message's config carries Flower's ``proximal-mu``."""

from __future__ import annotations

import math

from flwr.app import Message, RecordDict

from fedapp.methods.common.whole_model_client import train_named_model
from fedapp.methods.flower.keys import PROXIMAL_MU
from fedapp.run.context import RunContext
from fedapp.run.profiles import LocalNode
from fedapp.wire.messages import CONFIG


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round of local SGD on the run's model, pulled towards the received one by mu."""
    mu = float(message.content[CONFIG].get(PROXIMAL_MU, 0.0))
    if not math.isfinite(mu) or mu < 0:
        raise ValueError(f"'{PROXIMAL_MU}' = {mu} in the training config: allowed is >= 0")
    return train_named_model(run.model, message, run, node, proximal_mu=mu)
