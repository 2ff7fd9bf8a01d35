"""Result files of a run: resolved config, per-round metrics, summary, plot, checkpoints.

Everything is written as the run goes: each round's metrics row is appended, then a checkpoint
of the global state is replaced atomically. A crashed run is resumed from the checkpoint, and rows
of rounds after it (written just before a crash) are dropped, so no round is lost or repeated.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedapp.evaluation.tensorboard import TensorBoardLog

CHECKPOINT_FILE = "checkpoint.pt"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
BEST_MODEL_FILE = "model_best.pt"
FINAL_MODEL_FILE = "model_final.pt"
ROUNDS_PLOT_FILE = "accuracy.png"


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows of equal keys as a CSV file."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


class RunRecorder:
    """Writes one run's outputs into its own folder."""

    def __init__(self, run_dir: Path, resume_after: int = 0, tensorboard: bool = False) -> None:
        """Start a run's files afresh, or keep the metrics of rounds 1..resume_after; with
        ``tensorboard``, also write every round and the final test figures as TensorBoard
        events (``fedapp.evaluation.tensorboard``)."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        metrics = run_dir / METRICS_FILE
        kept = []
        if resume_after and metrics.exists():
            rows = [json.loads(line) for line in metrics.read_text().splitlines() if line]
            kept = [r for r in rows if r["round"] <= resume_after]
        self.rows: list[dict[str, Any]] = kept
        metrics.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        self.tensorboard = TensorBoardLog(run_dir, resume_after) if tensorboard else None

    @staticmethod
    def run_dir_for(out_dir: Path, run_name: str, strategy: str, dataset: str) -> Path:
        """``<out-dir>/<run-name>``, or a time-stamped name when run-name is empty."""
        name = run_name or f"{strategy}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
        return out_dir / name

    def write_json(self, filename: str, payload: Mapping[str, Any]) -> Path:
        path = self.run_dir / filename
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
        return path

    def log_round(self, row: Mapping[str, Any]) -> None:
        """Append one round's metrics (one JSON object per line)."""
        self.rows.append(dict(row))
        with (self.run_dir / METRICS_FILE).open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.log_round(row)

    def log_test(self, summary: Mapping[str, Any]) -> None:
        """The run's final test figures, where a view beside summary.json wants them (TensorBoard);
        closes that view."""
        if self.tensorboard is not None:
            self.tensorboard.log_test(summary)
            self.tensorboard.close()

    def save_state(self, filename: str, state: Mapping[str, np.ndarray]) -> Path:
        """A global state as a torch state dict (loadable with ``torch.load``)."""
        path = self.run_dir / filename
        torch.save(
            {k: torch.from_numpy(np.require(v, requirements="C")) for k, v in state.items()}, path
        )
        return path

    @staticmethod
    def load_state(path: Path) -> dict[str, np.ndarray]:
        """A state saved by ``save_state``."""
        return {k: v.numpy() for k, v in torch.load(path, weights_only=True).items()}

    def save_checkpoint(
        self, server_round: int, state: Mapping[str, np.ndarray], extra: Mapping[str, Any]
    ) -> None:
        """The state after a completed round, written to a temporary file then renamed."""
        tmp = self.run_dir / (CHECKPOINT_FILE + ".tmp")
        torch.save(
            {
                "round": server_round,
                "extra": dict(extra),
                "state": {
                    k: torch.from_numpy(np.require(v, requirements="C")) for k, v in state.items()
                },
            },
            tmp,
        )
        tmp.replace(self.run_dir / CHECKPOINT_FILE)

    @staticmethod
    def load_checkpoint(run_dir: Path) -> tuple[int, dict[str, np.ndarray], dict[str, Any]]:
        """(round, state, extra) of the last completed round; FileNotFoundError if none."""
        saved = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
        state = {k: v.numpy() for k, v in saved["state"].items()}
        return int(saved["round"]), state, saved["extra"]
