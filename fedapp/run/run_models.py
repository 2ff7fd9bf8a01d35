"""The run's models, from its config: which ResNet18 substrate the weight-sharing baselines use,
and which candidate family the logit-exchange methods pick from.

Server and clients both call these, so they derive the same architectures from the run's keys
alone; the model code itself (fedapp.models) takes only explicit arguments.
"""

from __future__ import annotations

from functools import lru_cache

from fedapp.data.registry import DatasetInfo
from fedapp.models.arch import SupernetConfig, load_supernet
from fedapp.models.families import Candidate, family_candidates
from fedapp.run.pieces import CandidateFamily

#: The backbone per data set the paper names (MNIST-like -> LeNet5, CIFAR-like -> MobileNetV2).
AUTO_FAMILY = {
    "mnist-5k": "lenet5",
    "digits": "lenet5",
    "mnist": "lenet5",
    "fashion-mnist": "lenet5",
    "emnist": "lenet5",
    "cifar10": "mobilenetv2",
    "cifar100": "mobilenetv2",
    "cinic10": "mobilenetv2",
    "tinyimagenet": "mobilenetv2",
}


@lru_cache(maxsize=4)
def _sized(name: str, info: DatasetInfo) -> SupernetConfig:
    return load_supernet(
        name,
        in_channels=info.channels,
        image_size=info.image_size,
        num_classes=info.num_classes,
    )


def substrate_config(substrate: str, info: DatasetInfo) -> SupernetConfig:
    """The run's substrate (``substrate.supernet``) sized to the data set's channels, image size
    and classes."""
    return _sized(substrate, info)


def run_family(family: CandidateFamily, info: DatasetInfo) -> str:
    """The run's family: ``candidates.family``, or for "auto" the backbone the paper uses for the
    data set (MNIST-like -> lenet5, CIFAR-like -> mobilenetv2; other data: lenet5 for grey
    images)."""
    if family.family != "auto":
        return family.family
    if family.dataset in AUTO_FAMILY:
        return AUTO_FAMILY[family.dataset]
    return "lenet5" if info.channels == 1 else "mobilenetv2"


def run_candidates(family: CandidateFamily, info: DatasetInfo) -> list[Candidate]:
    """The run's family, cheapest first (the server uses it to tell who can take part)."""
    return family_candidates(run_family(family, info), info, family.batch_size)
