"""The one method table: every strategy name, its server strategy, client trainer and client
evaluator, and whether it distils on a server-held public set.

Registering a method is one row here. Config validation, the ServerApp, the ClientApp and
``fedapp compare`` all read this table; the halves are named by "module:attribute" and imported
only when a run uses them, so reading the table imports no method code (and no torchvision).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Method:
    """One federated method: its two halves and what it needs from the run."""

    name: str
    #: "module:class" of the server strategy (a HeterogeneousStrategy subclass).
    strategy: str
    #: "module:function" of the client trainer: (message, run config, node) -> reply content.
    trainer: str
    #: "module:function" answering EVALUATE messages, for methods whose models live on the
    #: clients; None where the server evaluates its global model.
    evaluator: str | None = None
    #: Distils on the server-held public set, so the run needs ``public-size`` >= 1.
    needs_public_set: bool = False
    #: "module:class" of the settings section the method reads (``fedapp.settings``); None for
    #: a method with no keys of its own.
    settings: str | None = None


_S, _C, _K = "fedapp.strategies.", "fedapp.clients.", "fedapp.settings."

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("fedavg", f"{_S}fedavg:FedAvgStrategy", f"{_C}fedavg:train"),
        Method(
            "feast",
            f"{_S}feast:FeastStrategy",
            f"{_C}feast:train",
            settings=f"{_K}feast:FeastSettings",
        ),
        Method(
            "fedkd-nas",
            f"{_S}fedkd_nas:FedKDNASStrategy",
            f"{_C}fedkd_nas:train",
            f"{_C}fedkd_nas:evaluate_student",
            needs_public_set=True,
            settings=f"{_K}fedkd_nas:FedKDNASSettings",
        ),
        Method(
            "local-kd",
            f"{_S}local_kd:LocalKDStrategy",
            f"{_C}local_kd:train",
            f"{_C}fedkd_nas:evaluate_student",
            needs_public_set=True,
            settings=f"{_K}fedkd_nas:FedKDNASSettings",
        ),
        Method(
            "fedmd",
            f"{_S}fedmd:FedMDStrategy",
            f"{_C}fedmd:train",
            f"{_C}own_model:evaluate_own_model",
            needs_public_set=True,
            settings=f"{_K}fedmd:FedMDSettings",
        ),
        Method(
            "feddistill",
            f"{_S}feddistill:FedDistillStrategy",
            f"{_C}feddistill:train",
            f"{_C}own_model:evaluate_own_model",
            settings=f"{_K}feddistill:FedDistillSettings",
        ),
        # SuperFedNAS and DeepFedNAS differ only in how the server samples subnets; their
        # clients run the same rule (plain CE on the assigned subnet), so they share a trainer
        # and their settings.
        Method(
            "superfednas",
            f"{_S}superfednas:SuperFedNasStrategy",
            f"{_C}maxnet:train",
            settings=f"{_K}maxnet:MaxNetSettings",
        ),
        Method(
            "deepfednas",
            f"{_S}deepfednas:DeepFedNasStrategy",
            f"{_C}maxnet:train",
            settings=f"{_K}maxnet:MaxNetSettings",
        ),
        Method(
            "ditto",
            f"{_S}ditto:DittoStrategy",
            f"{_C}ditto:train",
            f"{_C}ditto:evaluate_personal",
            settings=f"{_K}ditto:DittoSettings",
        ),
        Method(
            "feddf",
            f"{_S}feddf:FedDFStrategy",
            f"{_C}feddf:train",
            needs_public_set=True,
            settings=f"{_K}feddf:FedDFSettings",
        ),
        Method(
            "heterofl",
            f"{_S}heterofl:HeteroFLStrategy",
            f"{_C}heterofl:train",
            settings=f"{_K}heterofl:HeteroFLSettings",
        ),
        Method(
            "fiarse",
            f"{_S}fiarse:FiarseStrategy",
            f"{_C}fiarse:train",
            settings=f"{_K}fiarse:FiarseSettings",
        ),
        Method(
            "scalefl",
            f"{_S}scalefl:ScaleFLStrategy",
            f"{_C}scalefl:train",
            settings=f"{_K}scalefl:ScaleFLSettings",
        ),
    )
}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


class NoClientEvaluator(LookupError):
    """The method keeps its model on the server; its clients evaluate nothing."""


def _load(reference: str) -> Any:
    module, attribute = reference.split(":")
    return getattr(import_module(module), attribute)


def method(name: str) -> Method:
    """The named method; a ValueError listing the known names otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(METHOD_NAMES)}")
    return METHODS[name]


def strategy_class(name: str) -> type:
    """The server strategy class of the named method."""
    return _load(method(name).strategy)


def client_trainer(name: str) -> Callable[..., Any]:
    """The local training rule that answers the named method's TRAIN messages."""
    return _load(method(name).trainer)


def settings_class(name: str) -> type | None:
    """The settings section class the named method reads; None where it has no keys."""
    reference = method(name).settings
    return None if reference is None else _load(reference)


def settings_classes() -> tuple[type, ...]:
    """Every method's settings section, once each, in table order."""
    references = dict.fromkeys(m.settings for m in METHODS.values() if m.settings is not None)
    return tuple(_load(reference) for reference in references)


def client_evaluator(name: str) -> Callable[..., Any]:
    """The rule that evaluates a node's own model(s); NoClientEvaluator where the method
    evaluates on the server."""
    reference = method(name).evaluator
    if reference is None:
        raise NoClientEvaluator(
            f"strategy {name!r} evaluates on the server; its clients hold no model to evaluate"
        )
    return _load(reference)
