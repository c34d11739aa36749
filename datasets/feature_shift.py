"""Feature-shift data sets, one client per domain (FedC2I App. A, Tables 5-6): Digit-5 and Office-Caltech-10.

Both are read from the files FedBN (med-air/FedBN) distributes; nothing is downloaded.

**Digit-5** (sources ``digit5_mnist``, ``digit5_svhn``, ``digit5_usps``, ``digit5_synth``, ``digit5_mnistm``):
``<root>/digit5/<Domain>/partitions/train_part{0..9}.pkl`` and ``<root>/digit5/<Domain>/test.pkl`` with
``<Domain>`` one of MNIST, SVHN, USPS, SynthDigits, MNIST_M (FedBN's own ``data/<Domain>`` layout, i.e.
``<root>/<Domain>``, is accepted too). Each file is a pickled tuple ``(images, labels)``: uint8 images
``N x H x W`` (MNIST 28, USPS 16) or ``N x H x W x 3`` (SVHN and SynthDigits 32, MNIST-M 28) and integer
labels 0..9. The train split is the ten partitions concatenated in order, so "the first 100 of each class"
(``partition.train_per_class=100``) reads FedBN's partitions in their order, as FedPCL did.

**Office-Caltech-10** (sources ``office_amazon``, ``office_caltech``, ``office_dslr``, ``office_webcam``):
``<root>/office_caltech_10/{site}_{train,test}.pkl`` each hold a pickled ``(paths, text_labels)`` pair, the
paths relative to FedBN's ``data/`` folder (``office_caltech_10/<site>/<class>/<image>``); the images are
in ``<root>/office_caltech_10/<site>/<class>/``. Class order is FedBN's ``label_dict``. Every image is
converted to RGB (grayscale Caltech images by repetition, as FedBN) and resized to ``size`` x ``size``
(bilinear, aspect ratio not kept, as FedBN's ``Resize``) when read, since the images differ in size.

Pickles are read with the restricted unpickler of :mod:`datasets.sources` (numpy arrays and builtins only).
Missing files raise :class:`DataSourceError` naming every path looked at; unreadable or wrong-shaped files
raise ``ValueError`` naming the file and what was expected.

Importing this module also registers the offline stand-in domains of :mod:`datasets.standin_digits` (Digit-5)
and :mod:`datasets.standin_office` (Office-10).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

import datasets.standin_digits  # noqa: F401  (registers the stand-in digit domains)
import datasets.standin_office  # noqa: F401  (registers the stand-in object-photo domains)
from datasets.sources import (
    DIGIT_CLASSES,
    SOURCES,
    ImageData,
    _ArrayUnpickler,
    _labels,
    _missing,
    _uint8_images,
)

# source name -> FedBN folder name of the Digit-5 domain
DIGIT5_FOLDERS = {
    "digit5_mnist": "MNIST",
    "digit5_svhn": "SVHN",
    "digit5_usps": "USPS",
    "digit5_synth": "SynthDigits",
    "digit5_mnistm": "MNIST_M",
}
DIGIT5_TRAIN_PARTS = 10  # FedBN's utils/data_preprocess.py cuts train.pkl into train_part0..9.pkl
# source name -> FedBN site name of the Office-Caltech-10 domain
OFFICE_SITES = {
    "office_amazon": "amazon", "office_caltech": "caltech", "office_dslr": "dslr", "office_webcam": "webcam",
}
# FedBN's label_dict (utils/data_utils.py OfficeDataset): the label of each class is its index here
OFFICE_CLASSES = (
    "back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer", "monitor", "mouse", "mug",
    "projector",
)
OFFICE_SIZE = 64  # Office images are resized to this when read (FedC2I's input size, Table 7)
_FEDBN = "FedBN's pre-processed data (linked from the README of the med-air/FedBN repository on GitHub)"
DIGIT5_HOW = (
    f"get {_FEDBN}: digit_dataset.zip; unzip it and put its MNIST, SVHN, USPS, SynthDigits and MNIST_M folders "
    "(each with partitions/train_part0..9.pkl and test.pkl) in <root>/digit5/. It cannot be downloaded "
    "automatically (download=True does nothing for it)."
)
OFFICE_HOW = (
    f"get {_FEDBN}: office_caltech_10_dataset.zip; unzip it into <root>, giving <root>/office_caltech_10/ with "
    "{amazon,caltech,dslr,webcam}_{train,test}.pkl and the image folders <site>/<class>/. It cannot be "
    "downloaded automatically (download=True does nothing for it)."
)


def read_pickled_pair(path: Path, expected: str) -> tuple[Any, Any]:
    """The two items of the tuple pickled in ``path`` (numpy arrays and builtins only).

    Raises ``ValueError`` naming ``path`` and ``expected`` when the file is not such a pickle.
    """
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(f, encoding="latin1").load()
    except OSError:
        raise
    except Exception as exc:  # truncated, corrupt, not a pickle, or a forbidden class
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); expected {expected}") from exc
    if not isinstance(obj, tuple | list) or len(obj) != 2:
        found = f"a {type(obj).__name__}" + (f" of length {len(obj)}" if isinstance(obj, tuple | list) else "")
        raise ValueError(f"{path}: expected {expected}, found {found}")
    return obj[0], obj[1]


# ---------------------------------------------------------------------------------------------- Digit-5

_DIGIT5_EXPECTED = (
    "a pickled tuple (images, labels): uint8 images N x H x W or N x H x W x 3 and N integer labels 0..9 "
    "(FedBN's Digit-5 format)"
)


def read_digit5_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``[N, C, H, W]`` and labels int64 ``[N]`` of one FedBN Digit-5 pickle."""
    raw_images, raw_labels = read_pickled_pair(path, _DIGIT5_EXPECTED)
    images, labels = np.asarray(raw_images), np.asarray(raw_labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    ok = (
        images.dtype == np.uint8
        and (images.ndim == 3 or (images.ndim == 4 and images.shape[3] in (1, 3)))
        and labels.ndim == 1
        and len(labels) == len(images)
        and (labels.dtype.kind in "iu" or labels.size == 0)
    )
    if not ok:
        raise ValueError(f"{path}: expected {_DIGIT5_EXPECTED}; found images of dtype {images.dtype} and shape "
                         f"{images.shape}, labels of dtype {labels.dtype} and shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= len(DIGIT_CLASSES)):
        raise ValueError(f"{path}: labels must be 0..9, found {labels.min()}..{labels.max()}")
    images = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    return images, labels.astype(np.int64)


def _first_per_class(labels: np.ndarray, cap: int | None) -> np.ndarray:
    """Positions (in order) of the first ``cap`` samples of every class; all positions if ``cap`` is None."""
    if cap is None:
        return np.arange(len(labels))
    keep = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        keep[np.flatnonzero(labels == c)[:cap]] = True
    return np.flatnonzero(keep)


def load_digit5(
    split: str, root: Path | None = None, download: bool = False, *, source: str,
    max_test_per_class: int | None = None,
) -> ImageData:
    """One Digit-5 domain from FedBN's pickles (see the module doc); ``max_test_per_class`` keeps only the
    first that many test images of each class (FedPCL used 100-200; None = FedBN's full test split)."""
    folder_name = DIGIT5_FOLDERS[source]
    folders = [] if root is None else [root / "digit5" / folder_name, root / folder_name]
    folder = next((f for f in folders if f.is_dir()), None)
    if folder is None:
        raise _missing(source, split, root, folders, DIGIT5_HOW)
    if split == "train":
        files = [folder / "partitions" / f"train_part{i}.pkl" for i in range(DIGIT5_TRAIN_PARTS)]
    else:
        files = [folder / "test.pkl"]
    absent = [f for f in files if not f.is_file()]
    if absent:
        raise _missing(source, split, root, absent, DIGIT5_HOW)
    parts = [read_digit5_file(f) for f in files]
    for f, (images, _) in zip(files, parts, strict=True):
        if images.shape[1:] != parts[0][0].shape[1:]:
            raise ValueError(f"{f}: images are {images.shape[1:]} (C, H, W), but {files[0]} has "
                             f"{parts[0][0].shape[1:]}; all parts of a domain must match")
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if split == "test" and max_test_per_class is not None:
        keep = _first_per_class(labels, int(max_test_per_class))
        images, labels = images[keep], labels[keep]
    return ImageData(_uint8_images(images), _labels(labels), DIGIT_CLASSES, source, split, folder_name)


for _name in DIGIT5_FOLDERS:
    SOURCES.register(_name)(partial(load_digit5, source=_name))


# ------------------------------------------------------------------------------------ Office-Caltech-10

_OFFICE_EXPECTED = (
    "a pickled tuple (paths, labels): N image paths relative to FedBN's data folder and N class names "
    f"from {list(OFFICE_CLASSES)} (FedBN's Office-Caltech-10 split format)"
)


def read_office_split(path: Path) -> tuple[list[str], list[int]]:
    """Image paths (as stored) and labels of one FedBN Office-Caltech-10 split file."""
    raw_paths, raw_labels = read_pickled_pair(path, _OFFICE_EXPECTED)
    try:
        paths, names = [str(p) for p in raw_paths], [str(t) for t in raw_labels]
    except TypeError:
        raise ValueError(f"{path}: expected {_OFFICE_EXPECTED}; found {type(raw_paths).__name__} and "
                         f"{type(raw_labels).__name__}") from None
    if len(paths) != len(names):
        raise ValueError(f"{path}: {len(paths)} paths but {len(names)} labels; expected {_OFFICE_EXPECTED}")
    index = {c: i for i, c in enumerate(OFFICE_CLASSES)}
    unknown = sorted(set(names) - set(index))
    if unknown:
        raise ValueError(f"{path}: unknown class name(s) {unknown[:5]}; expected {_OFFICE_EXPECTED}")
    return paths, [index[n] for n in names]


def _image_candidates(entry: str, base: Path, site: str) -> list[Path]:
    """Where one split-file entry may be: relative to FedBN's data folder (the parent of ``base``), to
    ``base`` itself, or ``base`` joined with the entry's path from its ``<site>`` component on."""
    rel = PurePosixPath(entry.replace("\\", "/"))
    found = [base.parent / rel, base / rel]
    if site in rel.parts:
        found.append(base.joinpath(*rel.parts[rel.parts.index(site):]))
    return list(dict.fromkeys(found))


def read_resized_rgb(paths: Sequence[Path], size: int) -> np.ndarray:
    """uint8 ``[N, 3, size, size]``: each image converted to RGB and resized (bilinear) to ``size``."""
    from PIL import Image

    def read(path: Path) -> np.ndarray:
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
        except OSError as exc:
            raise ValueError(f"{path}: cannot be read as an image ({exc})") from exc
        return np.asarray(rgb, dtype=np.uint8)

    if not paths:
        return np.zeros((0, 3, size, size), dtype=np.uint8)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        arrays = list(pool.map(read, paths))
    return np.stack(arrays).transpose(0, 3, 1, 2)


def load_office(
    split: str, root: Path | None = None, download: bool = False, *, source: str, size: int = OFFICE_SIZE
) -> ImageData:
    """One Office-Caltech-10 domain from FedBN's split files and image folders (see the module doc)."""
    site = OFFICE_SITES[source]
    file_name = f"{site}_{split}.pkl"
    folders = [] if root is None else [root / "office_caltech_10", root]
    split_file = next((f / file_name for f in folders if (f / file_name).is_file()), None)
    if split_file is None:
        raise _missing(source, split, root, [f / file_name for f in folders], OFFICE_HOW)
    entries, labels = read_office_split(split_file)
    paths: list[Path] = []
    absent: list[tuple[str, list[Path]]] = []
    for entry in entries:
        candidates = _image_candidates(entry, split_file.parent, site)
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            absent.append((entry, candidates))
        else:
            paths.append(found)
    if absent:
        entry, looked = absent[0]
        raise _missing(source, split, root, looked,
                       f"{len(absent)} of the {len(entries)} images listed in {split_file} are missing (the first "
                       f"is {entry!r}, looked for at the paths above). {OFFICE_HOW}")
    images = _uint8_images(read_resized_rgb(paths, int(size)))
    return ImageData(images, _labels(labels), OFFICE_CLASSES, source, split, site)


for _name in OFFICE_SITES:
    SOURCES.register(_name)(partial(load_office, source=_name))
