"""Result files of a run: resolved config, per-round metrics, summary, plot, checkpoints.

Everything is written as the run goes: each round's metrics row is appended, then a checkpoint
of the global state is replaced atomically. A crashed run is resumed from the checkpoint, and rows
of rounds after it (written just before a crash) are dropped, so no round is lost or repeated.

No file is ever half-written: every whole file goes through :func:`replace_file` (a temporary
file beside it, flushed to disk, renamed over it), and metrics.jsonl grows by whole lines, each
flushed to disk before the round's checkpoint. A file read back that is torn or corrupt anyway
(another program, a full disk) is a :class:`RunFileError` naming it, never a traceback. While a
run writes, it holds its folder's lock (:func:`run_folder_lock`), so a second run into the same
folder is refused before it changes anything.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import pickle
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log

from fedapp.evaluation.tensorboard import TensorBoardLog

CHECKPOINT_FILE = "checkpoint.pt"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
BEST_MODEL_FILE = "model_best.pt"
FINAL_MODEL_FILE = "model_final.pt"
ROUNDS_PLOT_FILE = "accuracy.png"
LOCK_FILE = ".lock"  # held (flock) by the process writing the run; holds its PID
TMP_MARK = ".tmp"  # in the name of a file being written, before it is renamed into place


class RunFileError(ValueError):
    """A run file that cannot be used as it is (torn, corrupt), or a run folder another run is
    writing; the message names the file and is meant for the user as it is."""


def replace_file(path: Path, write: Callable[[Path], object]) -> Path:
    """``path`` written whole or not at all: ``write`` fills a temporary file beside it (same
    folder, same suffix, so writers that go by the suffix still work), which is flushed to disk
    and renamed over ``path``. A crash at any moment leaves the old file or the new one."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}{TMP_MARK}{path.suffix}")
    try:
        write(tmp)
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)
    return path


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; a file system that cannot sync a folder only loses
    that guarantee across a power cut, never a file."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_text(path: Path, text: str) -> Path:
    """A text file written whole or not at all (:func:`replace_file`)."""
    return replace_file(path, lambda tmp: tmp.write_text(text))


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Rows of equal keys as a CSV file, written whole or not at all."""

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    return replace_file(path, write)


def unreadable(path: Path, reason: object) -> RunFileError:
    """The error for a run file that cannot be read back as fedapp wrote it."""
    return RunFileError(
        f"{path} is torn or corrupt ({reason}): it was not written whole by fedapp, or was "
        "changed since; restore it, or start the run afresh under another 'run-name'"
    )


def read_text_whole(path: Path) -> str:
    """A text file fedapp wrote (every one ends with a newline); RunFileError when it is torn
    (cut short before its last newline) or not text."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise unreadable(path, err) from None
    if text and not text.endswith("\n"):
        raise unreadable(path, "it ends inside a line")
    return text


def read_json(path: Path) -> Any:
    """A JSON file of a run; RunFileError naming it when it is torn (a JSON object cut short
    never parses) or corrupt."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise unreadable(path, err) from None


def read_jsonl(path: Path, torn_tail: str = "error") -> list[dict[str, Any]]:
    """The rows of a JSON-lines file of rounds (objects with an integer ``round``);
    RunFileError naming the file and line when one cannot be read. ``torn_tail = "drop"``
    drops, with a logged reason, a last line cut short before its newline: a crash in the
    middle of appending it leaves one (resuming, that round's checkpoint was never written)."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as err:
        raise unreadable(path, err) from None
    lines = text.split("\n")
    tail = lines.pop()  # "" when the file ends with a newline, as every whole file does
    if tail and torn_tail == "drop":
        log(WARNING, "fedapp: %s ends in a torn line (%r); dropped it", path, tail[:80])
    elif tail:
        raise unreadable(path, f"line {len(lines) + 1} ends without its newline")
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise unreadable(path, f"line {number}: {err}") from None
        if not isinstance(row, dict) or not isinstance(row.get("round"), int):
            raise unreadable(path, f"line {number} is not a round's row")
        rows.append(row)
    return rows


def load_tensors(path: Path) -> Any:
    """A file fedapp saved with ``torch.save``, loaded with ``weights_only=True`` (tensors and
    plain values only, never code); RunFileError naming it when it is torn or corrupt."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as err:
        raise unreadable(path, err) from None


@contextmanager
def run_folder_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process while it writes the run: an exclusive ``flock`` on
    its lock file, which the OS releases when the process ends, however it ends, so a crashed
    run can be resumed at once. A folder another process holds is refused at once, before
    anything in it changes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunFileError(
            f"{run_dir} is being written by another run (process {holder} holds its "
            f"{LOCK_FILE}): two runs in one folder would mix their files. Wait for it to end, "
            "or give another 'run-name'; nothing in the folder was changed"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def _tensors(state: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.require(v, requirements="C")) for k, v in state.items()}


class RunRecorder:
    """Writes one run's outputs into its own folder."""

    def __init__(self, run_dir: Path, resume_after: int = 0, tensorboard: bool = False) -> None:
        """Start a run's files afresh, or keep the metrics of rounds 1..resume_after; with
        ``tensorboard``, also write every round and the final test figures as TensorBoard
        events (``fedapp.evaluation.tensorboard``)."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        for leftover in run_dir.glob(f".*{TMP_MARK}*"):  # of a write a crash cut short
            leftover.unlink(missing_ok=True)
        metrics = run_dir / METRICS_FILE
        kept = []
        if resume_after and metrics.exists():
            rows = read_jsonl(metrics, torn_tail="drop")
            kept = [r for r in rows if r["round"] <= resume_after]
        self.rows: list[dict[str, Any]] = kept
        replace_text(metrics, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        self.tensorboard = TensorBoardLog(run_dir, resume_after) if tensorboard else None

    @staticmethod
    def run_dir_for(out_dir: Path, run_name: str, strategy: str, dataset: str) -> Path:
        """``<out-dir>/<run-name>``, or a time-stamped name when run-name is empty."""
        name = run_name or f"{strategy}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
        return out_dir / name

    def write_json(self, filename: str, payload: Mapping[str, Any]) -> Path:
        """A JSON file of the run, written whole or not at all."""
        return replace_text(
            self.run_dir / filename, json.dumps(payload, indent=2, sort_keys=True) + "\n"
        )

    def log_round(self, row: Mapping[str, Any]) -> None:
        """Append one round's metrics (one JSON object per line), on disk before the round's
        checkpoint is: a resumed run finds every row up to its checkpoint."""
        self.rows.append(dict(row))
        with (self.run_dir / METRICS_FILE).open("a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.tensorboard is not None:
            self.tensorboard.log_round(row)

    def log_test(self, summary: Mapping[str, Any]) -> None:
        """The run's final test figures, where a view beside summary.json wants them (TensorBoard);
        closes that view."""
        if self.tensorboard is not None:
            self.tensorboard.log_test(summary)
            self.tensorboard.close()

    def save_state(self, filename: str, state: Mapping[str, np.ndarray]) -> Path:
        """A global state as a torch state dict (loadable with ``torch.load``), written whole
        or not at all."""
        tensors = _tensors(state)
        return replace_file(self.run_dir / filename, lambda tmp: torch.save(tensors, tmp))

    @staticmethod
    def load_state(path: Path) -> dict[str, np.ndarray]:
        """A state saved by ``save_state``; RunFileError naming the file when it is corrupt."""
        saved = load_tensors(path)
        if not isinstance(saved, dict) or not all(
            isinstance(v, torch.Tensor) for v in saved.values()
        ):
            raise unreadable(path, "not a state of named tensors")
        return {k: v.numpy() for k, v in saved.items()}

    def save_checkpoint(
        self, server_round: int, state: Mapping[str, np.ndarray], extra: Mapping[str, Any]
    ) -> None:
        """The state after a completed round, written whole or not at all. ``extra`` holds
        plain values only (str, numbers, lists, dicts): the checkpoint is loaded with
        ``weights_only=True``."""
        saved = {"round": server_round, "extra": dict(extra), "state": _tensors(state)}
        replace_file(self.run_dir / CHECKPOINT_FILE, lambda tmp: torch.save(saved, tmp))

    @staticmethod
    def load_checkpoint(run_dir: Path) -> tuple[int, dict[str, np.ndarray], dict[str, Any]]:
        """(round, state, extra) of the last completed round; FileNotFoundError if none,
        RunFileError naming it when it is torn or corrupt."""
        path = run_dir / CHECKPOINT_FILE
        saved = load_tensors(path)
        try:
            state = {k: v.numpy() for k, v in saved["state"].items()}
            return int(saved["round"]), state, dict(saved["extra"])
        except (TypeError, KeyError, AttributeError, ValueError) as err:
            raise unreadable(path, f"not a fedapp checkpoint: {err!r}") from None
