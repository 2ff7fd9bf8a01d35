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

#: Networks kept per process (least recently used dropped first): the quickstart's 20 clients
#: route at most a dozen distinct envelopes; each kept network is its parameters only.
CAPACITY = 16

_kept: OrderedDict[tuple[SupernetConfig, Arch], ElasticResNet] = OrderedDict()


def elastic_network(config: SupernetConfig, bounds: Arch) -> ElasticResNet:
    """An ElasticResNet sized for ``bounds``, reused if this process built one before; the
    caller loads a complete state into it. Its gradients of the previous use are dropped."""
    key = (config, bounds)
    model = _kept.pop(key, None)
    if model is None:
        model = ElasticResNet(config, bounds)
    else:
        model.zero_grad(set_to_none=True)
    _kept[key] = model
    while len(_kept) > CAPACITY:
        _kept.popitem(last=False)
    return model
