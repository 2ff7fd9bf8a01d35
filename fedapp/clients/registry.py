"""The client trainer of each strategy, by the strategy's name (and, for methods whose models
live on the clients, the client evaluator that answers EVALUATE messages)."""

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
    "fedkd-nas": "fedapp.clients.fedkd_nas:train",
    "local-kd": "fedapp.clients.fedkd_nas:train_local_kd",
    "fedmd": "fedapp.clients.fedmd:train",
    "feddistill": "fedapp.clients.feddistill:train",
    "superfednas": "fedapp.clients.maxnet:train",
    "deepfednas": "fedapp.clients.maxnet:train",
    "ditto": "fedapp.clients.ditto:train",
    "feddf": "fedapp.clients.feddf:train",
    "heterofl": "fedapp.clients.heterofl:train",
    "fiarse": "fedapp.clients.fiarse:train",
    "scalefl": "fedapp.clients.scalefl:train",
}


#: strategy name -> "module:function" (same signature as a trainer; the reply holds METRICS with
#: 'accuracy', 'loss' and num-examples). Methods with a global model evaluate it on the server.
_EVALUATORS: dict[str, str] = {
    "fedkd-nas": "fedapp.clients.fedkd_nas:evaluate_student",
    "local-kd": "fedapp.clients.fedkd_nas:evaluate_student",
    "fedmd": "fedapp.clients.kept_model:evaluate_kept_model",
    "feddistill": "fedapp.clients.kept_model:evaluate_kept_model",
    "ditto": "fedapp.clients.ditto:evaluate_personal",
}


class NoClientEvaluator(LookupError):
    """The strategy keeps its model on the server; its clients evaluate nothing."""


def client_evaluator(strategy: str) -> Trainer:
    """The rule that evaluates this node's own model(s) for the named strategy."""
    if strategy not in _EVALUATORS:
        raise NoClientEvaluator(
            f"strategy {strategy!r} evaluates on the server; its clients hold no model to evaluate"
        )
    module, func = _EVALUATORS[strategy].split(":")
    return getattr(import_module(module), func)


def client_trainer(strategy: str) -> Trainer:
    """The local training rule that answers the named strategy's TRAIN messages."""
    module, func = _TRAINERS[strategy].split(":")
    return getattr(import_module(module), func)
