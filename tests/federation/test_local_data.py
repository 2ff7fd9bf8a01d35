"""A device training on its own files (node config ``data-path``) instead of a seeded shard.

Real digits are written as a device would hold them (an .npz file, an image folder with only
some classes); the real ServerApp and ClientApp run over the in-process Grid.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from local_grid import LocalGrid, preset_overrides, run_config, server_context
from PIL import Image

from fedapp.apps.client_app import app as client_app
from fedapp.apps.server_app import RunRejected
from fedapp.apps.server_app import app as server_app
from fedapp.data.registry import ImageArrays, load_dataset
from fedapp.run.config import ConfigError, parse_run_config
from fedapp.run.context import data_layout
from fedapp.run.federated_data import client_shard
from fedapp.run.profiles import NodeRegistry, local_node

FAST = preset_overrides("fedavg-digits") | {
    "num_clients": 3,
    "fraction_train": 1.0,
    "num_server_rounds": 1,
    "validation_size": 200,
    "test_size": 300,
    "calibration_size": 50,
    "batch_size": 16,
}


def _device_digits(classes: tuple[int, ...], per_class: int) -> ImageArrays:
    """Real 8x8 digits of a few classes, as one device might have collected them."""
    train = load_dataset("digits").train
    picks = np.concatenate([np.flatnonzero(train.labels == c)[-per_class:] for c in classes])
    return ImageArrays(train.images[picks], train.labels[picks])


def _write_npz(path: Path, data: ImageArrays) -> Path:
    np.savez(path, x_train=data.images[:, 0], y_train=data.labels)  # NHW, as a user would
    return path


def _write_folder(root: Path, data: ImageArrays, names: dict[int, str] | None = None) -> Path:
    for i, (image, label) in enumerate(zip(data.images, data.labels, strict=True)):
        folder = root / "train" / (names or {}).get(int(label), str(label))
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0]).save(folder / f"{i}.png")
    return root


def _run(tmp_path: Path, data_path: str) -> tuple[LocalGrid, dict]:
    config = run_config(**FAST, out_dir=str(tmp_path), run_name="run")
    node_configs = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    node_configs[0]["data-path"] = data_path
    grid = LocalGrid(client_app, config, num_nodes=3, node_configs=node_configs)
    server_app(grid=grid, context=server_context(config))
    return grid, config


def test_device_trains_on_its_npz_file_and_reports_its_size(tmp_path) -> None:
    own = _device_digits((3, 7), per_class=20)
    grid, config = _run(tmp_path, str(_write_npz(tmp_path / "mine.npz", own)))

    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["clients-accepted"] == 3
    cfg = parse_run_config(config)
    shards = [
        len(client_shard(data_layout(cfg), i).labels) for i in (1, 2)
    ]  # the other nodes: seeded shards
    assert rows[0]["num-examples"] == 40 + sum(shards)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["nodes"] == 3
    # the handshake tells the server the device's real size
    nodes = NodeRegistry(3)
    nodes.wait_for(grid, 3, timeout=5)
    sizes = {p.partition_id: p.num_examples for p in nodes.profiles.values()}
    assert sizes == {0: 40, 1: shards[0], 2: shards[1]}


def test_image_folder_classes_are_the_runs_labels(tmp_path) -> None:
    own = _device_digits((2, 9), per_class=10)
    root = _write_folder(tmp_path / "photos", own)
    cfg = parse_run_config(run_config(**FAST))
    data = client_shard(data_layout(cfg), 0, str(root))
    assert data.images.shape == (20, 1, 8, 8)
    assert sorted(set(data.labels.tolist())) == [2, 9]  # not re-numbered 0, 1
    assert np.bincount(data.labels, minlength=10)[[2, 9]].tolist() == [10, 10]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda d: _write_npz(
                d / "big.npz", ImageArrays(np.zeros((4, 1, 28, 28), np.uint8), np.zeros(4, int))
            ),
            "holds images of shape (C, H, W) = (1, 28, 28), but the run's data set 'digits' "
            "has (1, 8, 8)",
        ),
        (
            lambda d: _write_npz(
                d / "labels.npz", ImageArrays(np.zeros((4, 1, 8, 8), np.uint8), np.full(4, 12))
            ),
            "has label 12, but the run's data set 'digits' has classes 0..9",
        ),
        (
            lambda d: _write_folder(d / "named", _device_digits((1,), 2), {1: "cats"}),
            "must be named by the run's integer labels (0, 1, ...), got cats",
        ),
        (lambda d: d / "missing.npz", "no such file or directory"),
    ],
)
def test_inconsistent_device_data_stops_the_run_before_training(
    tmp_path, caplog, make, message
) -> None:
    data_path = str(make(tmp_path))
    with pytest.raises(RunRejected):
        _run(tmp_path, data_path)
    assert "a node rejected the run: node config 'data-path'" in caplog.text
    assert message in caplog.text
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_data_path_must_be_a_string(tmp_path) -> None:
    cfg = parse_run_config(run_config(**FAST))
    with pytest.raises(ConfigError, match="expected a quoted path"):
        local_node({"partition-id": 0, "num-partitions": 3, "data-path": 5}, data_layout(cfg))
