"""Node state on the node's own disk, so a resumed run and a restarted SuperNode continue it.

Flower's ``Context.state`` (fedapp.methods.common.node_state) lives as long as one ``flwr run`` in
one process: a resume is a new run with empty node states, and a SuperNode that restarts starts
empty too. So after every training round the ClientApp writes the node's whole state to
``<folder>/round-<r>.npz`` (r: the server round it is the state after), and before every message it
continues from the snapshot that round needs when its memory has nothing for it.

Round-tagged, because a node may be a round ahead of the server: it trained round k+1 before
the server died with its checkpoint after round k. A TRAIN message of round r continues from the
newest snapshot of a round <= r - 1, so the resumed round k+1 starts from the state as of round
k, as in an uninterrupted run; the two newest snapshots are kept (the newest may be such a lost
round) and any newer than the round just written are removed. An EVALUATE message (it names no
round) uses the newest.

Where: ``<out-dir>/<run-name>/node-state/partition-<id>/`` as resolved on the node (in
simulation the run folder itself), or ``<state-dir>/<run-name>/partition-<id>/`` with the node
config key ``state-dir``. The run folder, not Flower's run id, is what a resume keeps. A run
without ``run-name`` (a time-stamped folder that cannot be resumed) keeps its state in memory
only. Folders are 0o700 and files 0o600, not encrypted; deleting the folder removes it.

A file read back is untrusted: numpy without pickle, its identity (the run config less its
placement keys, the partition, the node's budget and data path) and round checked; one that
fails any of it is deleted with a logged warning, and the node starts that state fresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.common.logger import log

from fedapp.run.config import PLACEMENT_KEYS, ConfigError, RunConfig
from fedapp.run.profiles import LocalNode
from fedapp.wire.records import from_record, to_record

#: Node-config key: the folder (on the node) under which node states are kept.
STATE_DIR_KEY = "state-dir"
#: Context.state record saying which server round the state in memory is as of.
ROUND_KEY = "node-state-round"
#: Snapshots kept: the newest, which may be a round the server lost, and the one before it.
KEPT_SNAPSHOTS = 2
FORMAT = 1
META = "meta"
SNAPSHOT = re.compile(r"round-(\d{6})\.npz")


def snapshot_name(server_round: int) -> str:
    return f"round-{server_round:06d}.npz"


def state_folder(node_config: Mapping[str, Any], cfg: RunConfig, partition_id: int) -> Path | None:
    """Where this node keeps its state for this run (see the module docstring); None: memory
    only (no ``run-name``)."""
    if not cfg.run_name:
        return None
    root = node_config.get(STATE_DIR_KEY, "")
    if not isinstance(root, str):
        raise ConfigError(f"node config '{STATE_DIR_KEY}' must be a path, got {root!r}")
    if root:
        base = Path(os.path.expanduser(root)).resolve() / cfg.run_name
    else:
        base = cfg.resolved_out_dir() / cfg.run_name / "node-state"
    return base / f"partition-{partition_id}"


def node_identity(run_config: Mapping[str, Any], node: LocalNode) -> str:
    """What a snapshot must have been written under to be continued: the run config less the
    keys a resume may change, and the node's own facts."""
    config = {k: v for k, v in run_config.items() if k not in PLACEMENT_KEYS}
    facts = {"partition": node.partition_id, "budget": node.budget, "data-path": node.data_path}
    text = json.dumps([config, facts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def held_round(state: RecordDict) -> int | None:
    """The server round the state in memory is as of; None when memory holds none."""
    if ROUND_KEY not in state.config_records:
        return None
    return int(state.config_records[ROUND_KEY]["round"])


@dataclass(frozen=True)
class StateStore:
    """One node's snapshots for one run."""

    folder: Path | None
    identity: str
    partition_id: int

    @classmethod
    def for_node(
        cls,
        node_config: Mapping[str, Any],
        run_config: Mapping[str, Any],
        cfg: RunConfig,
        node: LocalNode,
    ) -> StateStore:
        folder = state_folder(node_config, cfg, node.partition_id)
        return cls(folder, node_identity(run_config, node), node.partition_id)

    # ---- before a message ----------------------------------------------------------------------
    def prepare(self, state: RecordDict, upto: int | None) -> int:
        """Make ``state`` the node's state as of the newest round <= ``upto`` (None: the newest);
        memory serves when it is as of such a round, else the disk. Returns that round (0:
        none, the node starts its state fresh)."""
        held = held_round(state)
        if held is not None and (upto is None or held <= upto):
            return held
        for key in list(state.keys()):
            del state[key]
        found = self._newest(upto)
        if found is None:
            return 0
        server_round, records = found
        for key, record in records.items():
            state[key] = record
        state[ROUND_KEY] = ConfigRecord({"round": server_round})
        log(
            INFO,
            "fedapp: partition %d continues its node state as of round %d (%s)",
            self.partition_id,
            server_round,
            self.folder,
        )
        return server_round

    def _snapshots(self) -> dict[int, Path]:
        if self.folder is None or not self.folder.is_dir():
            return {}
        found = (SNAPSHOT.fullmatch(p.name) for p in self.folder.iterdir())
        return {int(m[1]): self.folder / m[0] for m in found if m}

    def _newest(self, upto: int | None) -> tuple[int, dict[str, Any]] | None:
        usable = [r for r in self._snapshots() if upto is None or r <= upto]
        if not usable:
            return None
        server_round = max(usable)
        path = self._snapshots()[server_round]
        try:
            return server_round, self._read(path, server_round)
        except (
            OSError,
            ValueError,
            KeyError,
            TypeError,
            AttributeError,
            EOFError,
            zipfile.BadZipFile,
        ) as err:
            log(
                WARNING,
                "fedapp: partition %d drops its node state %s (%s: %s) and starts it fresh",
                self.partition_id,
                path,
                type(err).__name__,
                err,
            )
            path.unlink(missing_ok=True)
            return None

    def _read(self, path: Path, server_round: int) -> dict[str, Any]:
        """The records of one snapshot; ValueError (or a reader's error) if it is not one this
        node wrote for this run and round."""
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(npz[META].tobytes().decode())
            expected = {"format": FORMAT, "identity": self.identity, "round": server_round}
            wrong = [k for k, v in expected.items() if meta.get(k) != v]
            if wrong:
                raise ValueError(f"written under another {', '.join(wrong)}")
            records: dict[str, Any] = {}
            for key, names in meta["array-records"].items():
                records[key] = to_record({name: npz[f"a{index}"] for name, index in names})
            for key, values in meta["values"].items():
                records[key] = ConfigRecord(values)
            return records

    # ---- after a training round ------------------------------------------------------------
    def commit(self, state: RecordDict, server_round: int) -> None:
        """Mark ``state`` as of ``server_round`` and write it (atomically) unless it is empty; a
        failed write is logged and the run goes on with the state in memory."""
        state[ROUND_KEY] = ConfigRecord({"round": server_round})
        kept = [key for key in state if key != ROUND_KEY]
        if self.folder is None or not kept:
            return
        try:
            self._write(state, server_round)
        except (OSError, TypeError, ValueError) as err:
            log(
                WARNING,
                "fedapp: partition %d could not write its node state to %s (%s); a resume "
                "or restart will start it fresh",
                self.partition_id,
                self.folder,
                err,
            )

    def _write(self, state: RecordDict, server_round: int) -> None:
        assert self.folder is not None
        arrays: dict[str, np.ndarray] = {}
        index: dict[str, list[tuple[str, int]]] = {}
        for key, record in state.array_records.items():
            index[key] = []
            for name, array in from_record(record).items():
                index[key].append((name, len(arrays)))
                arrays[f"a{len(arrays)}"] = array
        values = {
            key: dict(record) for key, record in state.config_records.items() if key != ROUND_KEY
        }
        meta = {
            "format": FORMAT,
            "identity": self.identity,
            "round": server_round,
            "array-records": index,
            "values": values,
        }
        encoded = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        for folder in (self.folder.parent, self.folder):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.chmod(0o700)
        target = self.folder / snapshot_name(server_round)
        temporary = self.folder / f".{target.name}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            np.savez(file, **{META: encoded}, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
        directory = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        self._prune(server_round)

    def _prune(self, written: int) -> None:
        """Keep the snapshot just written and the newest before it; remove the rest (older, and
        newer ones from rounds a crashed server lost)."""
        older = sorted((r for r in self._snapshots() if r < written), reverse=True)
        keep = {written, *older[: KEPT_SNAPSHOTS - 1]}
        for server_round, path in self._snapshots().items():
            if server_round not in keep:
                path.unlink(missing_ok=True)
