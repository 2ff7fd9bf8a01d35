"""The one method table: every strategy name, its server strategy, client trainer and client
evaluator, and whether it distils on a server-held public set.

A method is a folder, ``fedapp/methods/<name>/`` (server half, client half, settings, message
keys); registering it is one row here. Config validation, the ServerApp, the ClientApp and
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
    #: "module:class" of the settings section the method reads (a ``fedapp.sections.Section``);
    #: None for a method with no keys of its own.
    settings: str | None = None


def _in(folder: str, attribute: str) -> str:
    """A "module:attribute" reference inside the method folder ``fedapp/methods/<folder>/``."""
    return f"fedapp.methods.{folder}.{attribute}"


#: Flower's own server strategies, run as ``flwr:<name>`` (fedapp/methods/flower/), each with
#: its settings section where it has one.
FLOWER_STRATEGIES: dict[str, str | None] = {
    "fedavg": None,
    "fedavgm": "FedAvgMSettings",
    "fedadagrad": "FedAdagradSettings",
    "fedadam": "FedAdamSettings",
    "fedyogi": "FedYogiSettings",
    "fedprox": "FedProxSettings",
    "fedtrimmedavg": "FedTrimmedAvgSettings",
    "fedmedian": None,
    "krum": "KrumSettings",
    "multikrum": "MultiKrumSettings",
    "bulyan": "BulyanSettings",
    "qfedavg": "QFedAvgSettings",
}


def _flower(name: str, settings: str | None) -> Method:
    return Method(
        f"flwr:{name}",
        _in("flower", "server:FlowerStrategy"),
        _in("flower", "client:train"),
        settings=None if settings is None else _in("flower", f"settings:{settings}"),
    )


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("fedavg", _in("fedavg", "server:FedAvgStrategy"), _in("fedavg", "client:train")),
        Method(
            "feast",
            _in("feast", "server:FeastStrategy"),
            _in("feast", "client:train"),
            settings=_in("feast", "settings:FeastSettings"),
        ),
        Method(
            "fedkd-nas",
            _in("fedkd_nas", "server:FedKDNASStrategy"),
            _in("fedkd_nas", "client:train"),
            _in("fedkd_nas", "client:evaluate_student"),
            needs_public_set=True,
            settings=_in("fedkd_nas", "settings:FedKDNASSettings"),
        ),
        Method(
            "local-kd",
            _in("fedkd_nas", "local_kd_server:LocalKDStrategy"),
            _in("fedkd_nas", "local_kd_client:train"),
            _in("fedkd_nas", "client:evaluate_student"),
            needs_public_set=True,
            settings=_in("fedkd_nas", "settings:FedKDNASSettings"),
        ),
        Method(
            "fedmd",
            _in("fedmd", "server:FedMDStrategy"),
            _in("fedmd", "client:train"),
            _in("common", "own_model:evaluate_own_model"),
            needs_public_set=True,
            settings=_in("fedmd", "settings:FedMDSettings"),
        ),
        Method(
            "feddistill",
            _in("feddistill", "server:FedDistillStrategy"),
            _in("feddistill", "client:train"),
            _in("common", "own_model:evaluate_own_model"),
            settings=_in("feddistill", "settings:FedDistillSettings"),
        ),
        # SuperFedNAS and DeepFedNAS differ only in how the server samples subnets; their
        # clients run the same rule (plain CE on the assigned subnet), so they share a trainer
        # and their settings.
        Method(
            "superfednas",
            _in("maxnet", "superfednas:SuperFedNasStrategy"),
            _in("maxnet", "client:train"),
            settings=_in("maxnet", "settings:MaxNetSettings"),
        ),
        Method(
            "deepfednas",
            _in("maxnet", "deepfednas:DeepFedNasStrategy"),
            _in("maxnet", "client:train"),
            settings=_in("maxnet", "settings:MaxNetSettings"),
        ),
        Method(
            "ditto",
            _in("ditto", "server:DittoStrategy"),
            _in("ditto", "client:train"),
            _in("ditto", "client:evaluate_personal"),
            settings=_in("ditto", "settings:DittoSettings"),
        ),
        Method(
            "feddf",
            _in("feddf", "server:FedDFStrategy"),
            _in("feddf", "client:train"),
            needs_public_set=True,
            settings=_in("feddf", "settings:FedDFSettings"),
        ),
        Method(
            "heterofl",
            _in("heterofl", "server:HeteroFLStrategy"),
            _in("heterofl", "client:train"),
            settings=_in("heterofl", "settings:HeteroFLSettings"),
        ),
        Method(
            "fiarse",
            _in("fiarse", "server:FiarseStrategy"),
            _in("fiarse", "client:train"),
            settings=_in("fiarse", "settings:FiarseSettings"),
        ),
        Method(
            "scalefl",
            _in("scalefl", "server:ScaleFLStrategy"),
            _in("scalefl", "client:train"),
            settings=_in("scalefl", "settings:ScaleFLSettings"),
        ),
        *(_flower(name, settings) for name, settings in FLOWER_STRATEGIES.items()),
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


def folder_name(name: str) -> str:
    """The strategy's name as it names folders: ``flwr:fedadam`` -> ``flwr-fedadam`` (a colon
    reads as a drive or a host in other systems' paths)."""
    return name.replace(":", "-")


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
