"""FEAST client: local multi-variant co-training on the routed sub-supernet (paper Alg. 2).

Per mini-batch, one mixed batch (Mixup or CutMix) is reused for every pass. The local largest
affordable variant trains first on the supervised loss and its detached softmax becomes the
teacher; then the cache-wide smallest variant and a random intermediate one (redrawn every
mini-batch) train on (1 - rho) * supervised + rho * KD. Gradients of all passes add up, their
norm is clipped, and one SGD step follows. The client returns its whole routed tensor set.
"""

from __future__ import annotations

from flwr.app import Message, RecordDict

from fedapp.methods.common.supernet_client import train_plan
from fedapp.methods.feast.keys import AFFORDABLE, ROUTED
from fedapp.methods.feast.settings import FeastSettings
from fedapp.models.routing import envelope
from fedapp.run.context import RunContext
from fedapp.run.feast_space import model_space
from fedapp.run.profiles import LocalNode
from fedapp.training.co_training import plan_for
from fedapp.wire.messages import CONFIG


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round: rebuild the routed sub-supernet from the payload, co-train, send it back."""
    space = model_space(run.feast_space, run.info)
    config = message.content[CONFIG]
    affordable = [int(i) for i in config[AFFORDABLE]]
    plan = plan_for(space.cache, affordable, run.section(FeastSettings).training_rule)
    bounds = (
        envelope(space.config, [space.cache.variants[i].arch for i in affordable])
        if bool(config[ROUTED])
        else space.config.max_arch()
    )
    return train_plan(message, run, node, bounds, plan, run.section(FeastSettings).kd_weight)
