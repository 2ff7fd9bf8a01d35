"""Who holds which examples in a run: server-held splits, client shards and budgets.

Server and clients each compute this from the run config alone (seeded), so they agree without
exchanging data; the result is cached per process because Ray actors serve many messages.

A real device may instead train on its own files (node config ``data-path``: an ``.npz`` file or
an image folder in the formats of the ``npz``/``folder`` data sets): :func:`client_shard` then
returns those, checked against the run's data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedapp.config import ConfigError, RunConfig
from fedapp.data.registry import DatasetInfo, ImageArrays, LoadedDataset, load_dataset
from fedapp.feast_space import smallest_variant_macs
from fedapp.partitions.budgets import allocation_shares, zipf_budgets
from fedapp.partitions.factory import client_partitions
from fedapp.partitions.splits import ServerSplits, server_splits


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
def client_budgets(cfg: RunConfig) -> np.ndarray:
    """Every client's compute budget (MACs), by partition id: Zipf ranks mapped to the range."""
    floor = 0.0
    if cfg.budget_rng == "authors":
        floor = smallest_variant_macs(cfg, load_dataset(cfg.dataset, cfg.data_dir).info)
    return budget_population(cfg, floor)


def budget_population(cfg: RunConfig, floor: float) -> np.ndarray:
    """The Zipf draw of the run config; with ``budget-rng = "authors"`` every budget below
    ``floor`` (the variant cache's smallest variant) is raised to it, as the FEAST authors'
    server does: their draw starts at the CSV's 10-class minimum, just below the recount."""
    budgets = zipf_budgets(
        cfg.num_clients, cfg.budget_min, cfg.budget_max, cfg.zipf_s, cfg.seed, cfg.budget_rng
    )
    return np.maximum(budgets, floor) if cfg.budget_rng == "authors" else budgets


@lru_cache(maxsize=4)
def population(cfg: RunConfig) -> Population:
    """Load the data set and split it between server and clients as the config says."""
    dataset = load_dataset(cfg.dataset, cfg.data_dir)
    try:
        return _split(cfg, dataset)
    except ValueError as err:  # sizes that do not fit the data set: a user error
        raise ConfigError(f"cannot split '{cfg.dataset}' as configured: {err}") from err


def _split(cfg: RunConfig, dataset: LoadedDataset) -> Population:
    labels = dataset.train.labels
    splits = server_splits(
        labels,
        calibration=cfg.calibration_size,
        validation=cfg.validation_size,
        public=cfg.public_size,
        test=0 if dataset.test is not None else cfg.test_size,
        seed=cfg.seed,
    )
    shares = allocation_shares(client_budgets(cfg), cfg.gamma, cfg.allocation_cap)
    pool_shards = client_partitions(
        cfg.partitioner,
        labels[splits.clients],
        cfg.num_clients,
        seed=cfg.seed,
        alpha=cfg.dirichlet_alpha,
        shards_per_client=cfg.shards_per_client,
        shares=shares,
    )
    shards = tuple(splits.clients[positions] for positions in pool_shards)
    return Population(dataset=dataset, splits=splits, shards=shards)


def client_shard(cfg: RunConfig, partition_id: int, data_path: str | None = None) -> ImageArrays:
    """The training examples of one client: its own files if it has any, else its shard."""
    if data_path is not None:
        return local_data(cfg, data_path)
    pop = population(cfg)
    return _take(pop.dataset.train, pop.shards[partition_id])


def local_data(cfg: RunConfig, data_path: str) -> ImageArrays:
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
    info = population(cfg).info
    expected = (info.channels, info.image_size, info.image_size)
    if local.images.shape[1:] != expected:
        raise ConfigError(
            f"node config 'data-path' = {data_path!r} holds images of shape (C, H, W) = "
            f"{local.images.shape[1:]}, but the run's data set {cfg.dataset!r} has {expected}"
        )
    if labels.max() >= info.num_classes:
        raise ConfigError(
            f"node config 'data-path' = {data_path!r} has label {int(labels.max())}, but the "
            f"run's data set {cfg.dataset!r} has classes 0..{info.num_classes - 1}"
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


def server_set(cfg: RunConfig, name: str) -> ImageArrays:
    """A server-held set: 'calibration', 'validation', 'public' or 'test'."""
    pop = population(cfg)
    if name == "test" and pop.dataset.test is not None:
        return pop.dataset.test
    return _take(pop.dataset.train, getattr(pop.splits, name))
