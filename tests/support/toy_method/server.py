"""The toy method's server half: the whole-model mean, then a step of ``server-lr`` towards it."""

from __future__ import annotations

import numpy as np

from fedapp.methods.common.reply_validation import ValidReply
from fedapp.methods.common.strategy import State
from fedapp.methods.common.whole_model_server import WholeModelStrategy
from toy_method.settings import ToySettings


class ToyStrategy(WholeModelStrategy):
    """FedAvg's mean, then a step of ``server-lr`` from the old model towards it."""

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        mean = super().aggregate(server_round, replies, global_state)
        rate = self.run.section(ToySettings).server_lr
        return {
            name: (rate * mean[name] + (1 - rate) * old).astype(old.dtype)
            if np.issubdtype(old.dtype, np.floating)
            else mean[name]
            for name, old in global_state.items()
        }
