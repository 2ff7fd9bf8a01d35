"""Operating points of a weight-shared model: per-variant accuracy and population accuracy.

Each evaluated variant is extracted from the global supernet, gets its own BN statistics from the
server-held calibration set (training image transforms, no Mixup/CutMix, fixed order and seed),
and is then evaluated once. Population accuracy serves every client the largest operating point
it can afford (FEAST §6).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from fedapp.clients.training import eval_loader, evaluate
from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.data.transforms import ImageDataset, train_transform
from fedapp.feast_space import ModelSpace
from fedapp.messages import load_state
from fedapp.models.bn_calibration import recalibrate_bn
from fedapp.models.elastic_resnet import ElasticResNet

EVAL_BATCH_SIZE = 256


def evaluate_variants(
    space: ModelSpace,
    state: Mapping[str, np.ndarray],
    indices: Iterable[int],
    *,
    calibration: ImageArrays,
    data: ImageArrays,
    info: DatasetInfo,
    batch_size: int,
    device: torch.device,
    seed: int,
) -> list[dict[str, Any]]:
    """Accuracy of each cached variant after its own deterministic BN recalibration."""
    supernet = ElasticResNet(space.config)
    load_state(supernet, state)
    calibration_batches = DataLoader(
        ImageDataset(calibration, train_transform(info)), batch_size=batch_size, shuffle=False
    )
    test_batches = eval_loader(data, info, EVAL_BATCH_SIZE)
    rows = []
    for index in indices:
        variant = space.cache.variants[index]
        subnet = supernet.subnet(variant.arch).to(device)
        recalibrate_bn(subnet, (x.to(device) for x, _ in calibration_batches), seed=seed)
        result = evaluate(subnet, test_batches, device)
        rows.append(
            {
                "index": index,
                "macs": variant.macs,
                "params": variant.params,
                "accuracy": result["accuracy"],
                "loss": result["loss"],
            }
        )
    return rows


def population_accuracy(
    served: Mapping[int, int], budgets: Mapping[int, float], variants: Sequence[dict[str, Any]]
) -> tuple[float, list[dict[str, Any]]]:
    """Mean accuracy when client i is served variant ``served[i]``; and the per-client list."""
    by_index = {row["index"]: row for row in variants}
    clients = [
        {
            "partition": pid,
            "budget": budgets[pid],
            "variant": index,
            "macs": by_index[index]["macs"],
            "accuracy": by_index[index]["accuracy"],
        }
        for pid, index in sorted(served.items())
    ]
    return float(np.mean([c["accuracy"] for c in clients])), clients


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows of equal keys as a CSV file."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path
