"""A run's metrics as TensorBoard event files, for those who follow runs in TensorBoard.

Opt-in (run-config ``tensorboard = true``): every numeric value of each round's metrics row
becomes a scalar at step = round, under a tag ``<section>/<metric>`` whose metric part is the
key of ``metrics.jsonl`` as it is, so the two files read alike; the final test accuracies follow
at the last round. ``metrics.jsonl`` stays the record: these files are a view of it.

``tensorboard`` is an optional dependency (``pip install -e ".[tensorboard]"``); it is imported
only when a run asks for it.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TENSORBOARD_DIR = "tensorboard"
INSTALL_HINT = 'pip install -e ".[tensorboard]"'
#: Sections of the scalars page, by the start of a metric's key; the first match wins.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("val-", "validation"),
    ("bytes-", "communication"),
    ("clients-", "clients"),
    ("fleet-", "fleet"),
    ("nas-", "nas"),
    ("seconds", "time"),
    ("wall-seconds", "time"),
    ("train-seconds", "time"),
    ("train-", "training"),
    ("num-examples", "training"),
    ("passes", "training"),
    ("compute-proxy", "resources"),
    ("cpu-", "resources"),
    ("peak-rss", "resources"),
    ("torch-threads", "resources"),
)
OTHER_SECTION = "other"
TEST_SECTION = "test"


def tensorboard_available() -> bool:
    """Whether the ``tensorboard`` package (which torch's SummaryWriter needs) is installed."""
    return importlib.util.find_spec("tensorboard") is not None


def scalar_tag(metric: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key, e.g. ``validation/val-acc-v0``."""
    section = next((name for start, name in SECTIONS if metric.startswith(start)), OTHER_SECTION)
    return f"{section}/{metric}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class TensorBoardLog:
    """Writes one run's scalars into ``<run>/tensorboard/``."""

    def __init__(self, run_dir: Path, resume_after: int = 0) -> None:
        """A resumed run purges the steps after ``resume_after`` that a crash left behind, as
        metrics.jsonl drops its rows of those rounds."""
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            str(run_dir / TENSORBOARD_DIR), purge_step=resume_after + 1 if resume_after else None
        )

    def log_round(self, row: Mapping[str, Any]) -> None:
        """Every numeric value of one round's metrics row; flushed so TensorBoard shows it now."""
        step = int(row["round"])
        for key, value in row.items():
            number = _number(value)
            if key != "round" and number is not None:
                self.writer.add_scalar(scalar_tag(key), number, step)
        self.writer.flush()

    def log_test(self, summary: Mapping[str, Any]) -> None:
        """The final test figures at the last round: ``test/accuracy``, ``test/population-
        accuracy`` where the method has operating points, and each point's accuracy as
        ``test/point-<index>``."""
        step = int(summary["rounds"])
        for key, tag in (
            ("test_accuracy", "accuracy"),
            ("population_accuracy", "population-accuracy"),
        ):
            number = _number(summary.get(key))
            if number is not None:
                self.writer.add_scalar(f"{TEST_SECTION}/{tag}", number, step)
        for point in summary.get("variants", []):
            number = _number(point.get("accuracy"))
            if number is not None:
                self.writer.add_scalar(f"{TEST_SECTION}/point-{point['index']}", number, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
