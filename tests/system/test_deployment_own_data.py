"""Devices that train on their own files: a SuperLink and two SuperNodes on 127.0.0.1, each
SuperNode started with ``--data-path`` pointing at its own .npz file of real digits.

This is what a board with the base install runs (no partitioner, no embedded data sets): with
``FEDAPP_DEVICE_VENV=<venv>`` (a fresh ``pip install fedapp``) the SuperNodes and their ClientApps
run from that venv, where scikit-learn is not installed, so a node that tried to cut a shard of
digits would refuse the run. Without it they run from the tests' venv; the example counts the
server records show that each node trained on its file either way.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from local_grid import preset_overrides, run_config
from processes import (
    DEVICE_VENV,
    Federation,
    flwr_run,
    managed_processes,
    preset_with,
    read_rounds,
)

from fedapp.run.config import parse_run_config
from fedapp.run.context import data_layout
from fedapp.run.federated_data import population

#: Examples on each device: not what a seeded shard of the run's pool would hold.
DEVICE_SIZES = (301, 256)


def _write_device_files(directory: Path, overrides: dict[str, object]) -> list[Path]:
    """Two disjoint .npz files of digits from the run's client pool (never the server's sets),
    in the layout a device's own file has: x_train (N, 8, 8) uint8, y_train, x_test, y_test."""
    pool = population(data_layout(parse_run_config(run_config(**overrides))))
    train, clients = pool.dataset.train, pool.splits.clients
    assert sum(DEVICE_SIZES) + 40 <= len(clients)
    paths, start = [], 0
    for device, size in enumerate(DEVICE_SIZES):
        picks = clients[start : start + size]
        start += size
        held_out = clients[-20 * (device + 1) : -20 * device or None]  # a device's own check
        path = directory / f"device{device}.npz"
        np.savez(
            path,
            x_train=train.images[picks, 0],
            y_train=train.labels[picks],
            x_test=train.images[held_out, 0],
            y_test=train.labels[held_out],
        )
        paths.append(path)
    return paths


def test_supernodes_train_on_their_own_npz_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    overrides = preset_overrides("fedavg-digits") | {
        "num_clients": 2,
        "fraction_train": 1.0,
        "num_server_rounds": 1,
        "out_dir": str(out),
        "run_name": "own-data",
    }
    files = _write_device_files(tmp_path, overrides)
    with managed_processes(tmp_path) as procs:
        # an empty shard cache: a node that cut a shard instead could not read one back
        fed = Federation(procs, tmp_path, FEDAPP_CACHE_DIR=str(tmp_path / "cache"))
        fed.connect()
        fed.start_superlink("--insecure")
        for partition_id, path in enumerate(files):
            fed.start_supernode(
                f"sn{partition_id}", partition_id, 2, "--insecure", "--data-path", str(path)
            )
        preset = preset_with(
            tmp_path,
            "fedavg-digits",
            {k.replace("_", "-"): v for k, v in overrides.items()},
            name="own-data",
        )
        log = tmp_path / "flwr-run.log"
        result = flwr_run(["deploy", "--run-config", str(preset)], fed.env, log)
        assert result.returncode == 0, log.read_text()[-4000:]
        assert (out / "own-data" / "summary.json").exists(), log.read_text()[-4000:]
        rows = read_rounds(out / "own-data")
        # both devices trained, each on all of its own file
        assert [(r["round"], r["clients-accepted"], r["num-examples"]) for r in rows] == [
            (1, 2, sum(DEVICE_SIZES))
        ]
        assert not (tmp_path / "cache").exists()  # no node computed a shard
        if DEVICE_VENV:  # the devices' Python was the device venv's (start-supernode.sh execs)
            cmdline = Path(f"/proc/{fed.procs.by_name['sn0'].pid}/cmdline").read_bytes()
            python = Path(os.fsdecode(cmdline.split(b"\0")[0]))
            assert python.parent == Path(DEVICE_VENV).expanduser().resolve() / "bin", python
