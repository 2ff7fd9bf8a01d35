"""One model builder for whole-model methods: ``model`` names a YAML CNN or a family candidate."""

from __future__ import annotations

from torch import nn

from fedapp.data.registry import DatasetInfo
from fedapp.models.cnn import available_models, build_cnn
from fedapp.models.families import build_candidate, candidate_names


def model_names() -> tuple[str, ...]:
    """What ``model`` accepts: ``conf/models/*.yaml`` names, then every family candidate."""
    return available_models() + candidate_names()


def build_model(name: str, info: DatasetInfo) -> nn.Module:
    """A freshly initialised model for the data set's channels, input size and classes."""
    if name in available_models():
        return build_cnn(name, info.channels, info.num_classes)
    return build_candidate(name, info)
