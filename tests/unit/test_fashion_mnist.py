"""Fashion-MNIST from its original IDX files: the whole real set from Debian's package, a
data-dir folder (plain or gzipped, as torchvision's raw folder) first, and clear errors for a
truncated or corrupt file."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedapp.data import registry
from fedapp.data.registry import DatasetUnavailableError, load_dataset

DEBIAN_DIR = registry.SYSTEM_IDX_DIRS["fashion-mnist"]
NAMES = {
    "train-images-idx3-ubyte": 2051,
    "train-labels-idx1-ubyte": 2049,
    "t10k-images-idx3-ubyte": 2051,
    "t10k-labels-idx1-ubyte": 2049,
}


def test_the_whole_set_loads_from_the_debian_package() -> None:
    """All 70,000 real images: 6,000 train and 1,000 test images per class (.ci/run installs
    dataset-fashion-mnist, so this never skips in CI)."""
    assert all((DEBIAN_DIR / f"{name}.gz").is_file() for name in NAMES), (
        "apt-get install dataset-fashion-mnist"
    )
    data = load_dataset("fashion-mnist")
    assert data.train.images.shape == (60000, 1, 28, 28) and data.train.images.dtype == np.uint8
    assert data.test is not None and data.test.images.shape == (10000, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(data.train.labels), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(data.test.labels), [1000] * 10)
    assert (data.info.num_classes, data.info.channels, data.info.image_size) == (10, 1, 28)
    assert data.info.has_test_split
    # the published normalisation matches the pixels
    assert abs(data.train.images.mean() / 255 - data.info.mean[0]) < 1e-3
    # real clothes, not noise: the mean "trouser" (1) is darker between the legs than a shirt
    trousers = data.train.images[data.train.labels == 1, 0].mean(axis=0)
    shirts = data.train.images[data.train.labels == 6, 0].mean(axis=0)
    assert trousers[20:28, 13:15].mean() < shirts[20:28, 13:15].mean() / 2


def _copy_subset(folder: Path, count: int, gzipped: bool) -> None:
    """The first ``count`` images and labels of each Debian file, rewritten as IDX."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        with gzip.open(DEBIAN_DIR / f"{name}.gz", "rb") as stream:
            raw = stream.read()
        dims = raw[3]
        shape = np.frombuffer(raw, ">u4", count=dims, offset=4).copy()
        item = int(np.prod(shape[1:])) if dims > 1 else 1
        shape[0] = count
        body = raw[4 + 4 * dims : 4 + 4 * dims + count * item]
        data = raw[:4] + shape.astype(">u4").tobytes() + body
        if gzipped:
            with gzip.open(folder / f"{name}.gz", "wb") as out:
                out.write(data)
        else:
            (folder / name).write_bytes(data)


@pytest.mark.parametrize("gzipped", [False, True])
def test_data_dir_comes_first_plain_or_gzipped(tmp_path: Path, gzipped: bool) -> None:
    _copy_subset(tmp_path, 30, gzipped)
    data = load_dataset("fashion-mnist", str(tmp_path))
    assert data.train.images.shape == (30, 1, 28, 28) and data.test.labels.shape == (30,)
    whole = load_dataset("fashion-mnist")
    np.testing.assert_array_equal(data.train.images, whole.train.images[:30])
    np.testing.assert_array_equal(data.test.labels, whole.test.labels[:30])


def test_a_truncated_file_is_an_error_naming_it(tmp_path: Path) -> None:
    _copy_subset(tmp_path, 30, gzipped=False)
    images = tmp_path / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-100])
    with pytest.raises(DatasetUnavailableError, match=r"train-images-idx3-ubyte.*truncated"):
        load_dataset("fashion-mnist", str(tmp_path))


def test_a_wrong_magic_number_is_an_error_naming_the_file(tmp_path: Path) -> None:
    _copy_subset(tmp_path, 30, gzipped=False)
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    raw = bytearray(labels.read_bytes())
    raw[3] = 3  # a label file must be 1-D
    labels.write_bytes(bytes(raw))
    with pytest.raises(DatasetUnavailableError, match=r"t10k-labels-idx1-ubyte.*not a 1-D"):
        load_dataset("fashion-mnist", str(tmp_path))


def test_a_corrupt_gzip_and_mismatched_counts_are_errors(tmp_path: Path) -> None:
    _copy_subset(tmp_path / "gz", 30, gzipped=True)
    broken = tmp_path / "gz" / "train-labels-idx1-ubyte.gz"
    broken.write_bytes(broken.read_bytes()[:20])
    with pytest.raises(DatasetUnavailableError, match=r"train-labels-idx1-ubyte\.gz"):
        load_dataset("fashion-mnist", str(tmp_path / "gz"))
    _copy_subset(tmp_path / "counts", 30, gzipped=False)
    _copy_subset(tmp_path / "other", 20, gzipped=False)
    shutil.copy(tmp_path / "other" / "t10k-labels-idx1-ubyte", tmp_path / "counts")
    with pytest.raises(DatasetUnavailableError, match=r"30 images but .* 20 labels"):
        load_dataset("fashion-mnist", str(tmp_path / "counts"))


def test_a_folder_with_only_some_files_says_which_are_missing(tmp_path: Path) -> None:
    _copy_subset(tmp_path, 30, gzipped=False)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(DatasetUnavailableError, match="not t10k-images-idx3-ubyte"):
        load_dataset("fashion-mnist", str(tmp_path))
