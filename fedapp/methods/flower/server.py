"""Flower's own server strategies (``flwr:<name>``) on fedapp's round engine: fedapp samples the
seeded cohort, sends the whole model, checks every reply and keeps the accounts; the round's
valid replies then go through the Flower strategy's own ``aggregate_train``, unchanged.

The adapter hands a Flower strategy what its ``configure_train`` would have kept (the global
arrays a round started from) and messages shaped as Flower's clients send them: the floating-point
arrays under ``arrays`` and a ``metrics`` record whose ``num-examples`` is the reply's weight in
fedapp (capped where ``max-weight-share`` says so). Integer arrays (BN step counters) keep the
global value, as in every fedapp mean, and each aggregate takes the global state's dtypes. A
server optimiser's state (FedAdam's, FedYogi's and FedAdagrad's moments, FedAvgM's momentum) goes
into the checkpoint, so a resumed run continues exactly."""

from __future__ import annotations

from dataclasses import asdict
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import strategy as flower
from flwr.serverapp.strategy.fedopt import FedOpt

from fedapp.methods.common.reply_validation import ValidReply
from fedapp.methods.common.strategy import State, scheduled_learning_rate
from fedapp.methods.common.whole_model_server import WholeModelStrategy
from fedapp.methods.flower.keys import PROXIMAL_MU
from fedapp.methods.flower.server_state import decode_arrays, encode_arrays
from fedapp.run.context import RunContext
from fedapp.run.profiles import NodeProfile, NodeRegistry
from fedapp.wire.messages import ARRAYS, METRICS, NUM_EXAMPLES, TRAIN_LOSS
from fedapp.wire.records import to_record

#: ``flwr:<name>`` -> the Flower strategy class it runs.
RULES: dict[str, type[flower.FedAvg]] = {
    "fedavg": flower.FedAvg,
    "fedavgm": flower.FedAvgM,
    "fedadagrad": flower.FedAdagrad,
    "fedadam": flower.FedAdam,
    "fedyogi": flower.FedYogi,
    "fedprox": flower.FedProx,
    "fedtrimmedavg": flower.FedTrimmedAvg,
    "fedmedian": flower.FedMedian,
    "krum": flower.Krum,
    "multikrum": flower.MultiKrum,
    "bulyan": flower.Bulyan,
    "qfedavg": flower.QFedAvg,
}
PREFIX = "flwr:"
#: The attributes that hold a Flower strategy's server optimiser state between rounds.
OPTIMISER_STATE: dict[type, tuple[str, ...]] = {
    flower.FedAvgM: ("momentum_vector",),
    flower.FedAdagrad: ("m_t", "v_t"),
    flower.FedAdam: ("m_t", "v_t"),
    flower.FedYogi: ("m_t", "v_t"),
}
#: The metric Flower's QFedAvg reads each reply's training loss from.
QFEDAVG_LOSS = "train_loss"


def flower_rule(run: RunContext) -> flower.FedAvg:
    """The Flower strategy the run names, built with its section's settings."""
    rule = RULES[run.strategy.removeprefix(PREFIX)]
    settings = {} if run.settings is None else asdict(run.settings)
    if rule is flower.QFedAvg:
        settings["client_learning_rate"] = run.rounds.learning_rate
    return rule(**settings)


class FlowerStrategy(WholeModelStrategy):
    """The whole model, aggregated by one of Flower's strategies, evaluated centrally."""

    def __init__(self, run: RunContext, nodes: NodeRegistry) -> None:
        super().__init__(run, nodes)
        self.rule = flower_rule(run)
        if isinstance(self.rule, flower.QFedAvg):
            self.reply_metrics = frozenset({TRAIN_LOSS})

    def train_config(self, server_round: int, profile: NodeProfile) -> dict[str, Any]:
        """The base's settings, and FedProx's proximal weight where Flower's FedProx sends it."""
        config = super().train_config(server_round, profile)
        if isinstance(self.rule, flower.FedProx):
            config[PROXIMAL_MU] = self.rule.proximal_mu
        return config

    def aggregate(self, server_round: int, replies: list[ValidReply], global_state: State) -> State:
        """The Flower strategy's aggregate of the replies' floating-point arrays; the global state
        unchanged where it aggregates nothing (e.g. Bulyan with too few replies)."""
        floats = [k for k, v in global_state.items() if np.issubdtype(v.dtype, np.floating)]
        self._start_round(server_round, {k: global_state[k] for k in floats})
        messages = [self._as_flower_reply(reply, floats) for reply in replies]
        arrays, _ = self.rule.aggregate_train(server_round, messages)
        if arrays is None:
            log(WARNING, "round %d: %s aggregated nothing", server_round, self.run.strategy)
            return global_state
        return {
            name: arrays[name].numpy().astype(value.dtype, copy=False) if name in floats else value
            for name, value in global_state.items()
        }

    def _start_round(self, server_round: int, arrays: State) -> None:
        """What the Flower strategy's ``configure_train`` keeps: the arrays the round started
        from (and, for QFedAvg, the learning rate its clients used)."""
        if isinstance(self.rule, FedOpt):
            self.rule.current_arrays = dict(arrays)
        elif isinstance(self.rule, flower.FedAvgM | flower.QFedAvg):
            self.rule.current_arrays = to_record(arrays)
        if isinstance(self.rule, flower.QFedAvg):
            self.rule.client_learning_rate = scheduled_learning_rate(self.run.rounds, server_round)

    def _as_flower_reply(self, reply: ValidReply, names: list[str]) -> Message:
        """A valid reply as a Flower client would send it, weighing what it weighs in fedapp."""
        metrics: dict[str, float] = {NUM_EXAMPLES: float(reply.weight)}
        if isinstance(self.rule, flower.QFedAvg):
            metrics[QFEDAVG_LOSS] = float(reply.metrics[TRAIN_LOSS])
        content = RecordDict(
            {
                ARRAYS: to_record({name: reply.arrays[name] for name in names}),
                METRICS: MetricRecord(metrics),
            }
        )
        return Message(content, dst_node_id=reply.node_id, message_type=MessageType.TRAIN)

    def accounts(self) -> dict[str, Any]:
        """The base's records and the Flower strategy's server optimiser state."""
        kept = {name: getattr(self.rule, name) for name in self._optimiser_attributes()}
        return super().accounts() | {"server_optimiser": encode_arrays(kept)}

    def restore_accounts(self, accounts: dict[str, Any]) -> None:
        super().restore_accounts(accounts)
        kept = decode_arrays(accounts["server_optimiser"])
        if set(kept) != set(self._optimiser_attributes()):
            raise ValueError(
                f"the checkpoint's server optimiser state {sorted(kept)} is not "
                f"{self.run.strategy}'s {list(self._optimiser_attributes())}"
            )
        for name, value in kept.items():
            setattr(self.rule, name, value)

    def _optimiser_attributes(self) -> tuple[str, ...]:
        return OPTIMISER_STATE.get(type(self.rule), ())

    def summary(self) -> None:
        settings = "" if self.run.settings is None else asdict(self.run.settings)
        log(INFO, "\t├── Flower's %s %s", type(self.rule).__name__, settings)
        super().summary()
