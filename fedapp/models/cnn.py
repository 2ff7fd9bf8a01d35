"""A small plain CNN configured by YAML (``conf/models/*.yaml``), for whole-model methods on CPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn

from fedapp.models.arch import yaml_names

MODELS_DIR = Path(__file__).resolve().parents[2] / "conf" / "models"


@dataclass(frozen=True)
class CNNSpec:
    """Channels and depth of each stage, and the dropout before the classifier."""

    stages: tuple[tuple[int, int], ...]  # (channels, convs)
    dropout: float


def available_models() -> tuple[str, ...]:
    """Names of the model YAML files shipped in conf/models."""
    return yaml_names(MODELS_DIR)


def load_spec(name: str) -> CNNSpec:
    """Read ``conf/models/<name>.yaml``."""
    raw = yaml.safe_load((MODELS_DIR / f"{name}.yaml").read_text())
    stages = tuple((int(s["channels"]), int(s["convs"])) for s in raw["stages"])
    return CNNSpec(stages=stages, dropout=float(raw.get("dropout", 0.0)))


class SmallCNN(nn.Module):
    """Stages of 3x3 conv-BN-ReLU with 2x2 max-pooling, global average pool, linear head."""

    def __init__(self, spec: CNNSpec, in_channels: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for out_channels, convs in spec.stages:
            for _ in range(convs):
                layers += [
                    nn.Conv2d(channels, out_channels, 3, padding=1, bias=False),
                    nn.BatchNorm2d(out_channels),
                    nn.ReLU(inplace=True),
                ]
                channels = out_channels
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(spec.dropout),
            nn.Linear(channels, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_cnn(name: str, in_channels: int, num_classes: int) -> SmallCNN:
    """The named model for a data set's channels and classes."""
    return SmallCNN(load_spec(name), in_channels, num_classes)
