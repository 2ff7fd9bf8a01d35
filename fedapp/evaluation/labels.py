"""How the labels are spread over the clients: ``labels.csv`` and ``labels.png`` of every run.

The counts and the plot are flwr-datasets' own (``compute_counts``, ``plot_label_distributions``).
Both read a flwr-datasets ``Partitioner``, but a run's shards are not one partitioner's output
(the server's sets and the client pool are taken out first; the shards partitioner's leftovers are
spread afterwards), so :func:`fixed_partitioner` serves the shards the run really uses, as index
sets into the training labels, and the counts are those of the clients' data.

``datasets``, ``flwr_datasets`` and matplotlib are imported when the files are written (once per
run, on the server), not with this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedapp.data.extras import DATA, needs_extra
from fedapp.evaluation.results import replace_file

if TYPE_CHECKING:
    import pandas as pd

LABELS_FILE = "labels.csv"
LABELS_PLOT_FILE = "labels.png"
LABEL_COLUMN = "label"
#: Above this many classes the plot's legend would hide the bars: colours only.
LEGEND_MAX_CLASSES = 20


def fixed_partitioner(labels: np.ndarray, shards: Sequence[np.ndarray]) -> Any:
    """A flwr-datasets Partitioner whose partition ``i`` is ``labels[shards[i]]``."""
    with needs_extra(DATA, "the run's label distribution"):
        import datasets
        from flwr_datasets.partitioner import Partitioner

    class FixedPartitioner(Partitioner):
        """Partitions decided elsewhere (fedapp's seeded split), served by their indices."""

        def __init__(self, parts: Sequence[np.ndarray]) -> None:
            super().__init__()
            self._parts = [np.asarray(part, dtype=np.int64) for part in parts]

        @property
        def num_partitions(self) -> int:
            return len(self._parts)

        def load_partition(self, partition_id: int) -> datasets.Dataset:
            return self.dataset.select(self._parts[partition_id])

    partitioner = FixedPartitioner(shards)
    partitioner.dataset = datasets.Dataset.from_dict(
        {LABEL_COLUMN: np.asarray(labels, dtype=np.int64)}
    )
    return partitioner


def label_counts(
    labels: np.ndarray, shards: Sequence[np.ndarray], num_classes: int
) -> pd.DataFrame:
    """Examples per partition (rows, ``partition``) and class (columns ``0..num_classes-1``),
    every class present even where no client holds it."""
    with needs_extra(DATA, "the run's label distribution"):
        from flwr_datasets.metrics import compute_counts

    counts = compute_counts(fixed_partitioner(labels, shards), LABEL_COLUMN)
    counts = counts.reindex(columns=range(num_classes), fill_value=0).astype(np.int64)
    counts.index.name = "partition"
    counts.columns = [str(c) for c in counts.columns]
    return counts


def write_label_distribution(
    run_dir: Path, labels: np.ndarray, shards: Sequence[np.ndarray], num_classes: int, title: str
) -> pd.DataFrame:
    """``labels.csv`` (counts per partition and class) and ``labels.png`` (a stacked bar per
    partition) in ``run_dir``; returns the counts."""
    with needs_extra(DATA, "the run's label distribution"):
        from flwr_datasets.visualization import plot_label_distributions

    counts = label_counts(labels, shards, num_classes)
    replace_file(run_dir / LABELS_FILE, counts.to_csv)
    with needs_extra(DATA, "the run's label distribution"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(min(4 + 0.35 * len(shards), 20), 4.5), dpi=120)
    legend = num_classes <= LEGEND_MAX_CLASSES
    plot_label_distributions(
        fixed_partitioner(labels, shards),
        LABEL_COLUMN,
        plot_type="bar",
        size_unit="absolute",
        axis=ax,
        title=title,
        cmap=_colours(num_classes),
        legend=legend,
        legend_title="class" if legend else None,
        verbose_labels=False,
    )
    fig.savefig(run_dir / LABELS_PLOT_FILE, bbox_inches="tight")  # the legend sits outside
    plt.close(fig)
    return counts


def _colours(num_classes: int) -> str:
    """A qualitative colour map while classes can be told apart by colour, else a gradient."""
    if num_classes <= 10:
        return "tab10"
    return "tab20" if num_classes <= 20 else "viridis"
