"""Data-set registry: embedded sets on real data, local formats round trip, hub paths offline."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import huggingface_hub
import numpy as np
import pytest
from PIL import Image

from fedapp.data.registry import (
    DATASET_NAMES,
    DatasetUnavailableError,
    UnknownDatasetError,
    load_dataset,
)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def test_mnist_5k_is_real_mnist_as_uint8_nchw() -> None:
    data = load_dataset("mnist-5k")
    images, labels = data.train.images, data.train.labels
    assert images.shape == (5000, 1, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (5000,) and labels.dtype == np.int64
    assert np.array_equal(np.bincount(labels), [500] * 10)
    assert images.max() == 255 and images.min() == 0
    assert data.test is None
    info = data.info
    assert (info.num_classes, info.channels, info.image_size) == (10, 1, 28)
    assert info.has_test_split is False and info.augmentation == "none"


def test_digits_scaled_to_full_uint8_range(digits) -> None:
    images, labels = digits.train.images, digits.train.labels
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.uint8
    assert images.max() == 255 and images.min() == 0
    assert set(np.unique(labels)) == set(range(10)) and labels.dtype == np.int64
    assert digits.info.image_size == 8 and digits.info.has_test_split is False
    # Statistics are computed from the images themselves.
    scaled = images / 255.0
    assert digits.info.mean[0] == pytest.approx(scaled.mean(), abs=1e-9)
    assert digits.info.std[0] == pytest.approx(scaled.std(), abs=1e-9)


def test_load_is_cached_and_read_only(digits) -> None:
    assert load_dataset("digits") is digits
    assert load_dataset("digits", data_dir="/ignored/for/embedded") is digits
    with pytest.raises(ValueError, match="read-only"):
        digits.train.images[0, 0, 0, 0] = 1


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownDatasetError) as caught:
        load_dataset("imagenet")
    assert isinstance(caught.value, ValueError)
    for name in DATASET_NAMES:
        assert name in str(caught.value)


LAYOUTS = {
    "NHW": lambda x: x[:, 0],
    "NCHW": lambda x: x,
    "NHWC": lambda x: x.transpose(0, 2, 3, 1),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("with_test", [True, False])
def test_npz_round_trip(tmp_path: Path, digits, layout: str, with_test: bool) -> None:
    x, y = digits.train.images, digits.train.labels
    arrays = {"x_train": LAYOUTS[layout](x[:1500]), "y_train": y[:1500]}
    if with_test:
        arrays |= {"x_test": LAYOUTS[layout](x[1500:]), "y_test": y[1500:]}
    path = tmp_path / "digits.npz"
    np.savez(path, **arrays)
    data = load_dataset("npz", str(path))
    assert np.array_equal(data.train.images, x[:1500]) and np.array_equal(
        data.train.labels, y[:1500]
    )
    assert data.info.has_test_split is with_test
    if with_test:
        assert np.array_equal(data.test.images, x[1500:])
    assert (data.info.num_classes, data.info.channels, data.info.image_size) == (10, 1, 8)


def test_npz_rgb_nhwc(tmp_path: Path, digits) -> None:
    rgb = np.repeat(digits.train.images[:200], 3, axis=1)  # (N, 3, 8, 8)
    path = tmp_path / "rgb.npz"
    np.savez(path, x_train=rgb.transpose(0, 2, 3, 1), y_train=digits.train.labels[:200])
    data = load_dataset("npz", str(path))
    assert np.array_equal(data.train.images, rgb) and data.info.channels == 3
    assert len(data.info.mean) == len(data.info.std) == 3


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x_train": np.zeros((4, 8, 8), np.uint8)}, "y_train"),
        ({"x_train": np.zeros((4, 8, 8), np.float32), "y_train": np.zeros(4, int)}, "uint8"),
        ({"x_train": np.zeros((4, 8, 6), np.uint8), "y_train": np.zeros(4, int)}, "square"),
        ({"x_train": np.zeros((4, 8, 8), np.uint8), "y_train": np.zeros(3, int)}, "one label"),
        (
            {"x_train": np.zeros((4, 8, 8), np.uint8), "y_train": np.zeros(4, int), "x_test": 0},
            "both x_test and y_test",
        ),
    ],
)
def test_npz_malformed(tmp_path: Path, arrays: dict, message: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DatasetUnavailableError, match=message):
        load_dataset("npz", str(path))


def test_npz_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError, match=r"existing \.npz file"):
        load_dataset("npz", str(tmp_path / "nothing.npz"))


def _write_folder(root: Path, images: np.ndarray, labels: np.ndarray, mode: str) -> None:
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        target = root / f"class_{label}" / f"{index:05d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        pixels = image[0] if mode == "L" else image.transpose(1, 2, 0)
        Image.fromarray(pixels, mode=mode).save(target)


def _by_label(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(labels, kind="stable")  # folder order: class, then file name
    return images[order], labels[order]


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_folder_round_trip(tmp_path: Path, digits, mode: str) -> None:
    x, y = digits.train.images[:240], digits.train.labels[:240]
    if mode == "RGB":
        x = np.repeat(x, 3, axis=1)
    _write_folder(tmp_path / "train", x[:200], y[:200], mode)
    _write_folder(tmp_path / "test", x[200:], y[200:], mode)
    data = load_dataset("folder", str(tmp_path))
    for arrays, (images, labels) in (
        (data.train, _by_label(x[:200], y[:200])),
        (data.test, _by_label(x[200:], y[200:])),
    ):
        assert np.array_equal(arrays.images, images) and np.array_equal(arrays.labels, labels)
    assert data.info.channels == (1 if mode == "L" else 3) and data.info.num_classes == 10


def test_folder_errors(tmp_path: Path, digits) -> None:
    with pytest.raises(DatasetUnavailableError, match="train/<class>"):
        load_dataset("folder", str(tmp_path))
    _write_folder(tmp_path / "train", digits.train.images[:20], digits.train.labels[:20], "L")
    (tmp_path / "test" / "class_unknown").mkdir(parents=True)
    with pytest.raises(DatasetUnavailableError, match="class_unknown"):
        load_dataset("folder", str(tmp_path))


def test_hub_loader_converts_a_cached_split(monkeypatch, tmp_path: Path, digits) -> None:
    """The cifar100 path end to end, with datasets.load_dataset answering from memory."""
    rgb = np.repeat(digits.train.images[:60], 3, axis=1).transpose(0, 2, 3, 1)
    features = datasets.Features(
        {"img": datasets.Image(), "fine_label": datasets.ClassLabel(num_classes=100)}
    )

    def split(lo: int, hi: int) -> datasets.Dataset:
        images = [Image.fromarray(image) for image in rgb[lo:hi]]
        labels = digits.train.labels[lo:hi].tolist()
        return datasets.Dataset.from_dict({"img": images, "fine_label": labels}, features=features)

    calls = []

    def fake_load_dataset(hub_id: str, cache_dir: str | None = None) -> datasets.DatasetDict:
        calls.append((hub_id, cache_dir))
        return datasets.DatasetDict({"train": split(0, 40), "test": split(40, 60)})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = load_dataset("cifar100", str(tmp_path))
    assert calls == [("uoft-cs/cifar100", str(tmp_path))]
    assert data.train.images.shape == (40, 3, 8, 8) and data.test.images.shape == (20, 3, 8, 8)
    assert np.array_equal(data.train.images, rgb[:40].transpose(0, 3, 1, 2))
    assert np.array_equal(data.test.labels, digits.train.labels[40:60])
    assert data.info.num_classes == 100 and data.info.augmentation == "cifar"
    assert data.info.mean == (0.5071, 0.4865, 0.4409)


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def test_emnist_reads_idx_files(monkeypatch, tmp_path: Path, digits) -> None:
    """The emnist path end to end, with hf_hub_download answering from local IDX files."""
    upright = digits.train.images[:50, 0]
    for split, lo, hi in (("train", 0, 30), ("test", 30, 50)):
        _write_idx(
            tmp_path / f"emnist-balanced-{split}-images-idx3-ubyte.gz",
            upright[lo:hi].transpose(0, 2, 1),
        )  # NIST stores the images transposed
        _write_idx(
            tmp_path / f"emnist-balanced-{split}-labels-idx1-ubyte.gz", digits.train.labels[lo:hi]
        )

    def fake_download(repo_id: str, filename: str, **kwargs: object) -> str:
        assert repo_id == "Royc30ne/emnist-balanced" and kwargs["repo_type"] == "dataset"
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    data = load_dataset("emnist", str(tmp_path))
    assert np.array_equal(data.train.images[:, 0], upright[:30])
    assert np.array_equal(data.test.labels, digits.train.labels[30:50])
    assert data.info.has_test_split and data.info.channels == 1


_OFFLINE_PROBE = """
import json, sys
from fedapp.data import registry
from fedapp.data.registry import DatasetUnavailableError, load_dataset
registry.SYSTEM_IDX_DIRS.clear()  # the hub path, also where Debian's Fashion-MNIST is installed
messages = {}
for name in sys.argv[2:]:
    try:
        load_dataset(name, sys.argv[1])
    except DatasetUnavailableError as error:
        messages[name] = str(error)
print(json.dumps(messages))
"""


def test_hub_sets_unavailable_offline(tmp_path: Path) -> None:
    """Offline with an empty cache every hub set fails with instructions, not a traceback.

    Runs in a fresh interpreter so the HF offline switches are read at import time and the
    test can never wait on the network.
    """
    hub_sets = [
        "cifar10",
        "cifar100",
        "cinic10",
        "tinyimagenet",
        "mnist",
        "fashion-mnist",
        "emnist",
    ]
    env = os.environ | {
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf-home"),
    }
    result = subprocess.run(
        [sys.executable, "-c", _OFFLINE_PROBE, str(tmp_path / "cache"), *hub_sets],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    messages = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(messages) == sorted(hub_sets)
    for hub_id, name in [
        ("uoft-cs/cifar10", "cifar10"),
        ("uoft-cs/cifar100", "cifar100"),
        ("ylecun/mnist", "mnist"),
        ("zalando-datasets/fashion_mnist", "fashion-mnist"),
        ("Royc30ne/emnist-balanced", "emnist"),
    ]:
        assert hub_id in messages[name] and "internet" in messages[name]
        assert str(tmp_path / "cache") in messages[name]
    # Fashion-MNIST also names the system package that installs it, and where its files go
    debian = "apt-get install dataset-fashion-mnist"
    assert debian in messages["fashion-mnist"]
    assert "/usr/share/datasets/fashion-mnist/" in messages["fashion-mnist"]
    assert not any(debian in messages[name] for name in hub_sets if name != "fashion-mnist")
