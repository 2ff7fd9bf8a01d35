"""One entry point that splits the client pool into per-client index sets.

IID, Dirichlet and shards use the stock flwr-datasets partitioners; budget-dirichlet uses
FEAST's ``BudgetDirichletPartitioner``. All of them run on an in-memory ``datasets.Dataset``
holding only the labels and each row's position, so nothing is downloaded and the position
column maps a partition back to indices even when a partitioner reorders the rows.

``datasets`` and ``flwr_datasets`` are imported only when a partition is computed: they take about
1.5 s to import, which every deployment ClientApp process would otherwise pay even when its shard
is already cached on disk (``fedapp.run.federated_data``), and they come with the ``data`` extra,
which a device training on its own files (``data-path``) does not install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedapp.data.extras import DATA, needs_extra
from fedapp.random_streams import Stream, stream_rng, stream_seed32

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

PARTITIONER_NAMES: tuple[str, ...] = ("iid", "dirichlet", "shards", "budget-dirichlet")
MIN_PARTITION_SIZE = 10  # every client must be able to fill a few batches


def client_partitions(
    name: str,
    labels: np.ndarray,
    num_partitions: int,
    *,
    seed: int,
    alpha: float,
    shards_per_client: int,
    shares: np.ndarray | None,
) -> list[np.ndarray]:
    """Partition the client pool; returns sorted positions into ``labels``, one array per client.

    Partitions are disjoint and together cover every position. ``alpha`` is used by the two
    Dirichlet schemes, ``shards_per_client`` by shards, ``shares`` (required) by
    budget-dirichlet. Every partition gets at least ``MIN_PARTITION_SIZE`` examples or a
    ValueError says why not.
    """
    if name not in PARTITIONER_NAMES:
        raise ValueError(f"unknown partitioner {name!r}; known: {', '.join(PARTITIONER_NAMES)}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if num_partitions * MIN_PARTITION_SIZE > labels.size:
        raise ValueError(
            f"{labels.size} examples cannot give {num_partitions} clients at least "
            f"{MIN_PARTITION_SIZE} each; use at most {labels.size // MIN_PARTITION_SIZE} clients"
        )
    with needs_extra(DATA, f"the partitioner {name!r}"):
        import datasets

    table = datasets.Dataset.from_dict(
        {"label": labels.astype(np.int64), "position": np.arange(labels.size, dtype=np.int64)}
    )
    draw_seed = stream_seed32(seed, Stream.PARTITION)  # flwr-datasets takes one integer
    partitioner = _make_partitioner(
        name,
        num_partitions,
        labels.size,
        seed=draw_seed,
        alpha=alpha,
        shards=shards_per_client,
        shares=shares,
    )
    # The IID partitioner cuts contiguous blocks without shuffling, so shuffle first.
    partitioner.dataset = table.shuffle(seed=draw_seed) if name == "iid" else table
    try:
        parts = [
            np.sort(np.asarray(partitioner.load_partition(pid)["position"], dtype=np.int64))
            for pid in range(num_partitions)
        ]
    except ValueError as error:
        raise ValueError(
            f"partitioner {name!r} failed for {num_partitions} clients on {labels.size} "
            f"examples (alpha={alpha}, shards_per_client={shards_per_client}): {error}"
        ) from error
    if name == "shards":
        parts = _spread_leftovers(parts, labels, stream_rng(seed, Stream.PARTITION_LEFTOVERS))
    smallest = min(part.size for part in parts)
    if smallest < MIN_PARTITION_SIZE:
        raise ValueError(
            f"partitioner {name!r} gave a client only {smallest} examples (minimum "
            f"{MIN_PARTITION_SIZE}); use fewer clients or more data"
        )
    return parts


def _make_partitioner(
    name: str,
    num_partitions: int,
    total: int,
    *,
    seed: int,
    alpha: float,
    shards: int,
    shares: np.ndarray | None,
) -> Partitioner:
    with needs_extra(DATA, f"the partitioner {name!r}"):
        from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

        from fedapp.partitions.budget_dirichlet import BudgetDirichletPartitioner

    if name == "iid":
        return IidPartitioner(num_partitions)
    if name == "dirichlet":
        return DirichletPartitioner(
            num_partitions, "label", alpha, min_partition_size=MIN_PARTITION_SIZE, seed=seed
        )
    if name == "shards":
        if shards < 1 or num_partitions * shards > total:
            raise ValueError(
                f"shards_per_client={shards} needs {num_partitions} x {shards} shards of at "
                f"least one example from {total} examples; use 1..{total // num_partitions}"
            )
        return ShardPartitioner(num_partitions, "label", num_shards_per_partition=shards, seed=seed)
    if shares is None or len(shares) != num_partitions:
        got = "none" if shares is None else f"{len(shares)}"
        raise ValueError(
            f"partitioner 'budget-dirichlet' needs one share per client ({num_partitions}), "
            f"got {got}"
        )
    return BudgetDirichletPartitioner(
        shares, "label", alpha=alpha, min_partition_size=MIN_PARTITION_SIZE, seed=seed
    )


def _spread_leftovers(
    parts: list[np.ndarray], labels: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Hand out the examples ShardPartitioner drops (incomplete or unused shards).

    The leftovers, ordered by label, are cut into one contiguous block per client and the
    blocks go to clients in random order, so the partition stays exhaustive and each block adds
    few labels to a client.
    """
    assigned = np.concatenate(parts)
    leftover = np.setdiff1d(np.arange(labels.size), assigned)
    if leftover.size == 0:
        return parts
    leftover = leftover[np.argsort(labels[leftover], kind="stable")]
    blocks = np.array_split(leftover, len(parts))
    order = rng.permutation(len(parts))
    return [
        np.sort(np.concatenate([part, blocks[order[client]]])) for client, part in enumerate(parts)
    ]
