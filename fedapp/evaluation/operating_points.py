"""Operating points of a weight-shared model: per-point accuracy and population accuracy.

Every method that serves several models from one set of global weights (FEAST's cached variants,
HeteroFL's widths, ScaleFL's exits, FIARSE's masks, the SuperFedNAS/DeepFedNAS transfers) describes
each servable model as an :class:`OperatingPoint`. Each gets its own BN statistics from the
server-held calibration set (training image transforms, no Mixup/CutMix, fixed order and seed)
unless its normalisation is static, and is then evaluated once. Population accuracy serves every
client the largest operating point it can afford (FEAST §6, the paper's text); the FEAST authors'
evaluation script serves the most accurate affordable one instead, and both are reported.
:func:`operating_point_report` writes the same files and summary keys for all of them, so
``fedapp compare`` reads one format. Every point's accuracy carries its 95 % Wilson interval from
the number of images it was measured on (:mod:`fedapp.evaluation.intervals`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn
from torch.utils.data import DataLoader

from fedapp.data.registry import DatasetInfo, ImageArrays
from fedapp.data.transforms import ImageDataset, train_transform
from fedapp.evaluation.intervals import (
    HIGH,
    LOW,
    SUMMARY_SUFFIX,
    format_measured,
    interval_columns,
    row_interval,
    summary_intervals,
)
from fedapp.evaluation.plots import plot_accuracy_vs_macs
from fedapp.evaluation.results import write_csv
from fedapp.models.arch import SupernetConfig
from fedapp.models.bn_calibration import recalibrate_bn
from fedapp.models.elastic_resnet import ElasticResNet
from fedapp.training.loops import eval_loader, evaluate
from fedapp.wire.messages import SELECTION_KEY
from fedapp.wire.records import load_state

if TYPE_CHECKING:  # FEAST's cache: only runs that serve its variants load it
    from fedapp.models.cache import VariantCache

EVAL_BATCH_SIZE = 256
VARIANTS_FILE = "variants.csv"
POPULATION_FILE = "population.csv"
VARIANTS_PLOT_FILE = "accuracy_vs_macs.png"

#: What the points being evaluated are for, while the server announces each as it finishes (the
#: final test of a large cache takes minutes on a CPU); None: evaluated silently (validation).
_ANNOUNCED: ContextVar[str | None] = ContextVar("fedapp_announced_points", default=None)


@contextmanager
def announce_points(purpose: str) -> Iterator[None]:
    """Log every operating point evaluated inside the block as it finishes."""
    token = _ANNOUNCED.set(purpose)
    try:
        yield
    finally:
        _ANNOUNCED.reset(token)


@dataclass(frozen=True)
class OperatingPoint:
    """One servable model of a weight-shared method."""

    index: int
    macs: int
    params: int
    #: Builds the model with the global weights loaded (called once, at evaluation).
    build: Callable[[], nn.Module]
    #: False where the method's normalisation keeps no running statistics (HeteroFL's sBN).
    recalibrate: bool = True
    #: MACs by which affordability is decided, where a cache states other figures than the
    #: built network's (FEAST's reference cache); None: ``macs``.
    nominal_macs: int | None = None


def calibration_loader(calibration: ImageArrays, info: DatasetInfo, batch_size: int) -> DataLoader:
    """The calibration set as BN recalibration sees it: training transforms, no Mixup/CutMix,
    stored order (the recalibration seed fixes the augmentation draws)."""
    return DataLoader(
        ImageDataset(calibration, train_transform(info)), batch_size=batch_size, shuffle=False
    )


def prepared_model(
    point: OperatingPoint, calibration_batches: DataLoader, device: torch.device, seed: int
) -> nn.Module:
    """The point's model on ``device`` with its own deterministic BN recalibration where it keeps
    running statistics: the one model that is both evaluated and served (``fedapp export``)."""
    model = point.build().to(device)
    if point.recalibrate:
        recalibrate_bn(model, (x.to(device) for x, _ in calibration_batches), seed=seed)
    return model


def evaluate_points(
    points: Iterable[OperatingPoint],
    *,
    calibration: ImageArrays,
    data: ImageArrays,
    info: DatasetInfo,
    batch_size: int,
    device: torch.device,
    seed: int,
) -> list[dict[str, Any]]:
    """Accuracy (with its 95 % interval from the number of ``images`` measured) and loss of each
    operating point after its own deterministic BN recalibration."""
    calibration_batches = calibration_loader(calibration, info, batch_size)
    test_batches = eval_loader(data, info, EVAL_BATCH_SIZE)
    points = list(points)
    purpose = _ANNOUNCED.get()
    rows = []
    for position, point in enumerate(points, start=1):
        started = time.perf_counter()
        model = prepared_model(point, calibration_batches, device, seed)
        result = evaluate(model, test_batches, device)
        rows.append(
            {
                "index": point.index,
                "macs": point.macs,
                "nominal_macs": point.macs if point.nominal_macs is None else point.nominal_macs,
                "params": point.params,
                "accuracy": result["accuracy"],
                **interval_columns(result["accuracy"], len(data.labels)),
                "loss": result["loss"],
                "images": len(data.labels),
            }
        )
        if purpose is not None:
            log(
                INFO,
                "%s: point %d/%d | %.2fM MACs | %s | %.1f s",
                purpose,
                position,
                len(points),
                point.macs / 1e6,
                format_measured(result["accuracy"], len(data.labels)),
                time.perf_counter() - started,
            )
    return rows


@dataclass(frozen=True)
class PointEvaluator:
    """The server's evaluation of operating points, fixed once per run (calibration set, batch
    size, device and seed), so every weight-shared method measures its points alike."""

    calibration: ImageArrays
    info: DatasetInfo
    batch_size: int
    device: torch.device
    seed: int

    def rows(self, points: Iterable[OperatingPoint], data: ImageArrays) -> list[dict[str, Any]]:
        """:func:`evaluate_points` on ``data``."""
        return evaluate_points(
            points,
            calibration=self.calibration,
            data=data,
            info=self.info,
            batch_size=self.batch_size,
            device=self.device,
            seed=self.seed,
        )

    def model(self, point: OperatingPoint) -> nn.Module:
        """The point's model as :meth:`rows` evaluates it (:func:`prepared_model`)."""
        batches = calibration_loader(self.calibration, self.info, self.batch_size)
        return prepared_model(point, batches, self.device, self.seed)

    def variants(
        self,
        config: SupernetConfig,
        cache: VariantCache,
        state: Mapping[str, np.ndarray],
        indices: Iterable[int],
        data: ImageArrays,
    ) -> list[dict[str, Any]]:
        """Accuracy of each cached variant of a FEAST-family supernet."""
        return self.rows(variant_points(config, cache, state, indices), data)


def variant_points(
    config: SupernetConfig,
    cache: VariantCache,
    state: Mapping[str, np.ndarray],
    indices: Iterable[int],
) -> list[OperatingPoint]:
    """Cached variants of a FEAST-family supernet as operating points (one supernet holds the
    weights; each point cuts its subnet)."""
    supernet = ElasticResNet(config)
    load_state(supernet, state)
    return [
        OperatingPoint(
            index,
            cache.variants[index].macs,
            cache.variants[index].params,
            lambda arch=cache.variants[index].arch: supernet.subnet(arch),
            nominal_macs=cache.variants[index].nominal_macs,
        )
        for index in indices
    ]


def points_validation(
    rows: Iterable[dict[str, Any]], name: Callable[[dict[str, Any]], str]
) -> dict[str, float]:
    """Validation of several operating points: each one's accuracy under ``name(row)``, and the
    checkpoint selected on their mean accuracy (every point counts once)."""
    rows = list(rows)
    metrics = {name(r): r["accuracy"] for r in rows}
    metrics["val-loss"] = float(np.mean([r["loss"] for r in rows]))
    metrics[SELECTION_KEY] = float(np.mean([r["accuracy"] for r in rows]))
    return metrics


def population_accuracy(
    served: Mapping[int, int], budgets: Mapping[int, float], variants: Sequence[dict[str, Any]]
) -> tuple[float, float, list[dict[str, Any]]]:
    """Mean accuracy when client i is served variant ``served[i]`` (largest affordable), mean
    accuracy when each client is served its most accurate affordable variant (the FEAST
    authors' script: nominal MACs <= budget, the cheapest where none is), and the per-client
    list with both; each client's served accuracy keeps its variant's interval where the rows
    have one. The most accurate affordable variant is chosen on these very test accuracies, so
    its row and mean get no interval (the selection biases them upwards; see
    :mod:`fedapp.evaluation.intervals`)."""
    by_index = {row["index"]: row for row in variants}
    cheapest = min(variants, key=lambda row: row["nominal_macs"])
    clients = []
    for pid, index in sorted(served.items()):
        fitting = [row for row in variants if row["nominal_macs"] <= budgets[pid]] or [cheapest]
        best = max(fitting, key=lambda row: row["accuracy"])
        clients.append(
            {
                "partition": pid,
                "budget": budgets[pid],
                "variant": index,
                "macs": by_index[index]["macs"],
                "accuracy": by_index[index]["accuracy"],
                **_interval_of(by_index[index]),
                "best_affordable_variant": best["index"],
                "best_affordable_accuracy": best["accuracy"],
            }
        )
    largest = float(np.mean([c["accuracy"] for c in clients]))
    most_accurate = float(np.mean([c["best_affordable_accuracy"] for c in clients]))
    return largest, most_accurate, clients


def _interval_of(row: Mapping[str, Any]) -> dict[str, float]:
    """A row's interval columns, or none for rows without an interval."""
    interval = row_interval(row)
    return {} if interval is None else {LOW: interval[0], HIGH: interval[1]}


#: Keys of every operating point in summary.json and variants.csv, in this order (a method may
#: add its own after them); ``images``: how many test images the accuracy was measured on.
POINT_KEYS = (
    "index",
    "macs",
    "nominal_macs",
    "params",
    "accuracy",
    LOW,
    HIGH,
    "loss",
    "trained",
    "images",
)


def operating_point_report(
    run_dir: Path,
    title: str,
    variants: Sequence[dict[str, Any]],
    served: Mapping[int, int],
    budgets: Mapping[int, float],
    trained: Collection[int],
) -> dict[str, Any]:
    """The summary keys every weight-shared method reports, and its CSV files and plot.

    ``variants`` are :func:`evaluate_points` rows sorted by MACs (the last is the largest, what a
    single-model deployment would serve), possibly with method-specific keys; ``served`` maps
    partition id -> the index served; ``trained`` holds the indices some client of the run
    trained directly (each row gets ``trained``; the plot draws the others hollow). The summary
    has ``test_images`` and the 95 % intervals of test and population accuracy
    (``test_accuracy_ci95``, ``population_accuracy_ci95``; why population accuracy may have one:
    :mod:`fedapp.evaluation.intervals`).
    """
    variants = [
        {k: v[k] for k in POINT_KEYS} | {k: v[k] for k in v if k not in POINT_KEYS}
        for v in ({**v, "trained": v["index"] in trained} for v in variants)
    ]
    pop_accuracy, best_accuracy, clients = population_accuracy(served, budgets, variants)
    summary = {
        "test_accuracy": variants[-1]["accuracy"],
        "test_loss": variants[-1]["loss"],
        "population_accuracy": pop_accuracy,
        "population_accuracy_best_affordable": best_accuracy,
    }
    summary |= summary_intervals(summary, variants[-1]["images"])
    write_csv(run_dir / VARIANTS_FILE, variants)
    write_csv(run_dir / POPULATION_FILE, clients)
    plot_accuracy_vs_macs(
        run_dir / VARIANTS_PLOT_FILE,
        variants,
        title,
        pop_accuracy,
        summary["population_accuracy" + SUMMARY_SUFFIX],
    )
    return summary | {"variants": variants, "population": clients}
