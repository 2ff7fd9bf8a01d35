"""Who holds which examples in a run: server-held splits, client shards and budgets.

Server and clients each compute this from the run config alone (seeded), so they agree without
exchanging data; the result is cached per process because Ray actors serve many messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedapp.config import RunConfig
from fedapp.data.registry import DatasetInfo, ImageArrays, LoadedDataset, load_dataset
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
    return zipf_budgets(cfg.num_clients, cfg.budget_min, cfg.budget_max, cfg.zipf_s, cfg.seed)


@lru_cache(maxsize=4)
def population(cfg: RunConfig) -> Population:
    """Load the data set and split it between server and clients as the config says."""
    dataset = load_dataset(cfg.dataset, cfg.data_dir)
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


def client_shard(cfg: RunConfig, partition_id: int) -> ImageArrays:
    """The training examples of one client."""
    pop = population(cfg)
    return _take(pop.dataset.train, pop.shards[partition_id])


def server_set(cfg: RunConfig, name: str) -> ImageArrays:
    """A server-held set: 'calibration', 'validation', 'public' or 'test'."""
    pop = population(cfg)
    if name == "test" and pop.dataset.test is not None:
        return pop.dataset.test
    return _take(pop.dataset.train, getattr(pop.splits, name))
