"""SuperFedNAS / DeepFedNAS transfer client: plain supervised training of one assigned subnet.

The payload holds exactly the leading slices of the subnet the server assigned (config key
``subnet``), so the local model is the elastic network bounded by that architecture; each
mini-batch is mixed once (Mixup/CutMix, as ``mix-batches`` says) and takes one clipped SGD step
on the cross-entropy, through the supernet training loop with a one-pass plan (nothing is
distilled).
"""

from __future__ import annotations

from flwr.app import Message, RecordDict

from fedapp.methods.common.supernet_client import train_plan
from fedapp.methods.maxnet.keys import SUBNET
from fedapp.models.arch import parse_arch
from fedapp.models.cache import Variant
from fedapp.models.counter import count
from fedapp.run.context import RunContext
from fedapp.run.feast_space import model_space
from fedapp.run.profiles import LocalNode
from fedapp.training.co_training import CoTrainingPlan
from fedapp.wire.messages import CONFIG


def train(message: Message, run: RunContext, node: LocalNode) -> RecordDict:
    """One round of plain CE on the assigned subnet; the reply holds all its tensors."""
    space = model_space(run.feast_space, run.info)
    arch = space.config.validate(parse_arch(str(message.content[CONFIG][SUBNET])))
    cost = count(space.config, arch)
    plan = CoTrainingPlan.single(Variant(arch, cost.macs, cost.params))
    return train_plan(message, run, node, arch, plan, kd_weight=0.0)
