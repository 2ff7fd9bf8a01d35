"""Names of the server strategies and how to build one (lazy imports: config reads the names)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedapp.config import RunConfig
    from fedapp.profiles import NodeRegistry
    from fedapp.strategies.base import HeterogeneousStrategy

#: strategy name -> "module:class"; the client side uses the same names (fedapp.clients.registry).
_STRATEGIES: dict[str, str] = {
    "fedavg": "fedapp.strategies.fedavg:FedAvgStrategy",
    "feast": "fedapp.strategies.feast:FeastStrategy",
    "fedkd-nas": "fedapp.strategies.fedkd_nas:FedKDNASStrategy",
    "local-kd": "fedapp.strategies.fedkd_nas:LocalKDStrategy",
    "fedmd": "fedapp.strategies.fedmd:FedMDStrategy",
    "feddistill": "fedapp.strategies.feddistill:FedDistillStrategy",
    "superfednas": "fedapp.strategies.maxnet:SuperFedNasStrategy",
    "deepfednas": "fedapp.strategies.maxnet:DeepFedNasStrategy",
    "ditto": "fedapp.strategies.ditto:DittoStrategy",
    "feddf": "fedapp.strategies.feddf:FedDFStrategy",
    "heterofl": "fedapp.strategies.heterofl:HeteroFLStrategy",
    "fiarse": "fedapp.strategies.fiarse:FiarseStrategy",
    "scalefl": "fedapp.strategies.scalefl:ScaleFLStrategy",
}
STRATEGY_NAMES: tuple[str, ...] = tuple(_STRATEGIES)


def build_strategy(cfg: RunConfig, nodes: NodeRegistry) -> HeterogeneousStrategy:
    """The server strategy the run config selects."""
    module, cls = _STRATEGIES[cfg.strategy].split(":")
    return getattr(import_module(module), cls)(cfg, nodes)
