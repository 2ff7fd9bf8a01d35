"""Models a client process keeps between messages.

In simulation one Ray actor serves many nodes' messages, one after another, in one process.
Building a routed sub-supernet (modules, weight initialisation) costs up to a tenth of a second per
message and everything in it is overwritten by the payload, so the process keeps one network per
architecture bound and loads each payload into it. The result is bit for bit that of a fresh
network: the payload is a complete state (every parameter and buffer), the optimizer is created
per message, gradients are cleared before the first step, every pass activates its variant
before running, and building never touched the global RNG anyway. On a device every message
starts a fresh process, so nothing is kept there.
"""

from __future__ import annotations

from collections import OrderedDict

from fedapp.models.arch import Arch, SupernetConfig
from fedapp.models.elastic_resnet import ElasticResNet

#: Parameters kept per process, in all kept networks together (least recently used dropped
#: first): 20M float32 values are 80 MB, room for every envelope of the quickstart's 20 clients
#: (at most 1.3M parameters each) and for a few of a CIFAR client's routed slices.
CAPACITY_PARAMS = 20_000_000

_kept: OrderedDict[tuple[SupernetConfig, Arch], ElasticResNet] = OrderedDict()


def _params(model: ElasticResNet) -> int:
    return sum(p.numel() for p in model.parameters())


def elastic_network(config: SupernetConfig, bounds: Arch) -> ElasticResNet:
    """An ElasticResNet sized for ``bounds``, reused if this process built one before; the
    caller loads a complete state into it. Gradients of earlier messages are dropped."""
    key = (config, bounds)
    model = _kept.pop(key, None)
    if model is None:
        model = ElasticResNet(config, bounds)
    for kept in (*_kept.values(), model):
        kept.zero_grad(set_to_none=True)
    _kept[key] = model
    while len(_kept) > 1 and sum(_params(m) for m in _kept.values()) > CAPACITY_PARAMS:
        _kept.popitem(last=False)
    return model
