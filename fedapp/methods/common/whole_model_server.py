"""The whole-model server half: every sampled client trains the whole model, the server takes
the sample-weighted mean (FedAvg's rule; Ditto's global model and FedDF's prototypes build on it).

The mean is the leading-slice accumulator with every slice the whole tensor, so whole-model and
routed methods share one aggregation (BN step counters are kept, not averaged).
"""

from __future__ import annotations

import torch

from fedapp.data.registry import ImageArrays
from fedapp.evaluation.operating_points import EVAL_BATCH_SIZE, OperatingPoint
from fedapp.methods.common.aggregation import slice_mean
from fedapp.methods.common.evaluators import GlobalModel
from fedapp.methods.common.reply_validation import ComputeFloor, ValidReply
from fedapp.methods.common.strategy import HeterogeneousStrategy, State
from fedapp.models.zoo import build_model, forward_macs
from fedapp.random_streams import Stream, stream_seed
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.training.loops import eval_loader, evaluate
from fedapp.wire.records import load_state


class WholeModelStrategy(HeterogeneousStrategy):
    """The run's model, averaged whole, evaluated centrally."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.evaluator = GlobalModel(self.evaluate)

    def _model(self) -> torch.nn.Module:
        return build_model(self.run.model, self.info)

    def initial_state(self) -> State:
        torch.manual_seed(stream_seed(self.run.rounds.seed, Stream.INITIAL_WEIGHTS))
        return {k: v.numpy().copy() for k, v in self._model().state_dict().items()}

    def train_payload(self, profile: NodeProfile, global_state: State) -> State:
        return global_state

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        return slice_mean(global_state, replies)

    #: Models of the run's kind each client trains a round, each for local epochs over its
    #: shard (Ditto: the global copy and the personal model).
    models_trained: int = 1

    def compute_floor(self, profile: NodeProfile) -> ComputeFloor:
        """Local epochs of each model the client trains."""
        return self.training_floor(self.models_trained * forward_macs(self.run.model, self.info))

    def global_model(self, state: State) -> torch.nn.Module:
        """The run's model holding ``state``."""
        model = self._model()
        load_state(model, state)
        return model

    def evaluate(self, state: State, data: ImageArrays) -> dict[str, float]:
        """The global model's loss, accuracy and examples on a server-held split."""
        return evaluate(
            self.global_model(state), eval_loader(data, self.info, EVAL_BATCH_SIZE), self.device
        )

    def servable_points(self, state: State) -> list[OperatingPoint]:
        """The global model, as evaluated: its own BN statistics, no recalibration."""
        params = sum(p.numel() for p in self._model().parameters())
        macs = forward_macs(self.run.model, self.info)
        return [
            OperatingPoint(0, macs, params, lambda: self.global_model(state), recalibrate=False)
        ]
