"""Offline STAND-IN for Office-Caltech-10: four domains of real object photographs, Fashion-MNIST's product
photos (Zalando's catalogue; Debian ``dataset-fashion-mnist``, which ``make setup`` installs) rendered in the
four looks of Office-Caltech-10. It is not the paper's data: 10 clothing classes instead of Office's 10 office
objects, 28x28 gray photos restyled instead of real photos from four cameras. What it keeps is the structure
of FedC2I's question: the same 10 classes of real objects in four visual styles, a few labelled images per
client (the paper's per-domain sizes), and features that transfer between the domains.

=================================== ================================================================ =====
source                              look, and why it stands for its Office-10 domain                  train
=================================== ================================================================ =====
``standin_office_amazon``           clean catalogue shots: the product in a random colour, evenly       200
                                    shaded on a white background (Amazon: online-shop product photos)
``standin_office_caltech``          the product pasted on a cluttered colour background with random     200
                                    bars (Caltech-256: photos of objects in cluttered scenes)
``standin_office_dslr``             blurred (shallow depth of field), high-contrast, warm product on a   125
                                    dark background (DSLR: a high-resolution camera in the office)
``standin_office_webcam``           low resolution (12x12 upsampled), noisy, low contrast, cool colour   197
                                    cast on a gray desk (WebCam: a low-quality camera)
=================================== ================================================================ =====

Training sizes are FedC2I's Table 6 (200 / 200 / 125 / 197) at the default ``train_per_class=20``: a domain
with fewer than 10 x ``train_per_class`` images in the paper has its total spread over the classes (DSLR: 13
images of classes 0-4, 12 of 5-9; WebCam: 20 of classes 0-6, 19 of 7-9). Test: ``test_per_class`` (default
200) per class.

**Disjoint images.** All four domains come from one source, so each takes its own blocks of it: domain d
(in the order above) trains on Fashion-MNIST training images at class positions d x k .. d x k + k - 1
(k = ``train_per_class``) and tests on Fashion-MNIST test images at class positions d x t .. d x t + t - 1
(t = ``test_per_class``, at most 250). No photo is in two domains.

Generation is deterministic on every machine (Pillow's integer resizing and blur, numpy's element-wise
float64 arithmetic; see :mod:`datasets.standin_digits`, whose cache and generators it uses).
"""

from __future__ import annotations

from functools import lru_cache, partial
from pathlib import Path

import numpy as np

from datasets.sources import FASHION_MNIST_CLASSES, SOURCES, load_source
from datasets.standin_digits import (
    Arrays,
    Recipe,
    colour_textures,
    load_standin,
    register_standin,
    resize_uint8,
    standin_rng,
    to_uint8,
    upsample_bilinear,
)

OFFICE_STANDIN = ("standin_office_amazon", "standin_office_caltech", "standin_office_dslr", "standin_office_webcam")
OFFICE_PAPER_TRAIN = {  # training images per domain, FedC2I Table 6 (the first 20 per class of FedBN's files)
    "standin_office_amazon": 200, "standin_office_caltech": 200, "standin_office_dslr": 125,
    "standin_office_webcam": 197,
}
OFFICE_PAPER_PER_CLASS = 20  # the per-class cap those totals come from
FASHION_TEST_PER_CLASS = 1000  # Fashion-MNIST's test split: 1000 per class
PRODUCT_TINT = (0.35, 1.0)  # catalogue: per-channel colour of the product, uniform in this range
CLUTTER_RANGE = ((0.1, 0.9), (0.1, 0.9), (0.1, 0.9))  # Caltech: R, G, B ranges of the background clutter
CLUTTER_BARS = 3  # Caltech: random bars (edges of other things) drawn into the background
CLUTTER_BAR_WIDTH = (2, 5)  # their width in pixels, uniform in [low, high)
DSLR_BLUR = 1.2  # Gaussian blur radius in pixels (at the output size)
DSLR_CONTRAST = 1.8  # contrast gain about mid-gray
DSLR_WARM = (1.0, 0.85, 0.65)  # R, G, B gains of the warm tone
DSLR_BACKGROUND = (0.05, 0.2)  # dark background level, uniform in this range
WEBCAM_SIDE = 12  # the webcam's resolution: downsampled to this side, then upsampled
WEBCAM_COOL = (0.8, 0.9, 1.0)  # R, G, B gains of the cool colour cast
WEBCAM_DESK = (0.45, 0.65)  # gray desk level, uniform in this range
WEBCAM_CONTRAST = 0.6  # the object's contrast against the desk
WEBCAM_NOISE = 0.08  # std of Gaussian pixel noise


def train_counts(source: str, train_per_class: int, classes: int = 10) -> np.ndarray:
    """Training images per class: ``train_per_class``, or at the paper's cap the paper's total spread evenly
    (the first classes one more)."""
    total = min(classes * train_per_class,
                OFFICE_PAPER_TRAIN[source] * train_per_class // OFFICE_PAPER_PER_CLASS)
    return total // classes + (np.arange(classes) < total % classes)


@lru_cache(maxsize=2)
def _fashion(split: str, root: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST's ``split`` as uint8 ``[N, 28, 28]`` (white product on black) and labels."""
    data = load_source("fashion_mnist", split, root)
    return np.rint(data.images[:, 0].numpy().astype(np.float64) * 255.0).astype(np.uint8), data.labels.numpy()


def _blocks(labels: np.ndarray, start: int, counts: np.ndarray) -> np.ndarray:
    """Positions of class positions ``start .. start + counts[c] - 1`` of every class c, in class order."""
    picked = []
    for c, count in enumerate(counts):
        where = np.flatnonzero(labels == c)
        if len(where) < start + count:
            raise ValueError(f"class {c} has only {len(where)} Fashion-MNIST images, fewer than the "
                             f"{start + count} the office stand-in needs; use a smaller dataset.options."
                             "train_per_class or test_per_class")
        picked.append(where[start : start + count])
    return np.concatenate(picked)


def _photos(source: str, recipe: Recipe, root: Path | None) -> list[Arrays]:
    """[train, test] gray product photos of ``source`` at the recipe's size, from its own blocks."""
    at = OFFICE_STANDIN.index(source)
    if recipe.test_per_class * len(OFFICE_STANDIN) > FASHION_TEST_PER_CLASS:
        raise ValueError(f"test_per_class={recipe.test_per_class} is too large for {source!r}: the four domains "
                         f"share Fashion-MNIST's {FASHION_TEST_PER_CLASS} test images per class; use "
                         f"dataset.options.test_per_class <= {FASHION_TEST_PER_CLASS // len(OFFICE_STANDIN)}")
    parts = []
    for split, start, counts in (
        ("train", at * recipe.train_per_class, train_counts(source, recipe.train_per_class)),
        ("test", at * recipe.test_per_class, np.full(10, recipe.test_per_class)),
    ):
        images, labels = _fashion(split, root)
        idx = _blocks(labels, start, counts)
        parts.append((images[idx], labels[idx]))
    return parts


def _alpha(photo: np.ndarray) -> np.ndarray:
    """float ``[N, 1, S, S]``: the product's mask (Fashion-MNIST's background is black)."""
    return np.minimum(photo.astype(np.float64) * (4.0 / 255.0), 1.0)[:, None]


def catalogue(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Amazon-like: the product shaded in a random colour on white."""
    shade = photo.astype(np.float64)[:, None] / 255.0
    tint = rng.uniform(*PRODUCT_TINT, (len(photo), 3))[:, :, None, None]
    alpha = _alpha(photo)
    return to_uint8((1.0 - alpha) + alpha * tint * (0.25 + 0.75 * shade))


def cluttered(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Caltech-like: the gray product on a cluttered colour background with random bars."""
    n, size = len(photo), photo.shape[-1]
    background = colour_textures(n, size, rng, CLUTTER_RANGE).astype(np.float64) / 255.0
    for _ in range(CLUTTER_BARS):
        colour = rng.random((n, 3))
        width = rng.integers(*CLUTTER_BAR_WIDTH, size=n)
        where = rng.integers(size, size=n)
        vertical = rng.random(n) < 0.5
        line = np.abs(np.arange(size)[None, :] - where[:, None]) < width[:, None] / 2.0  # [n, size]
        bar = np.where(vertical[:, None, None], line[:, None, :], line[:, :, None])  # [n, size, size]
        background = np.where(bar[:, None], colour[:, :, None, None], background)
    alpha = _alpha(photo)
    return to_uint8((1.0 - alpha) * background + alpha * photo.astype(np.float64)[:, None] / 255.0)


def dslr(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """DSLR-like: blurred, high-contrast, warm product on a dark background."""
    from PIL import Image, ImageFilter

    blurred = np.stack([np.asarray(Image.fromarray(p, mode="L").filter(ImageFilter.GaussianBlur(DSLR_BLUR)))
                        for p in photo])
    shade = blurred.astype(np.float64)[:, None] / 255.0
    contrast = np.clip((shade - 0.5) * DSLR_CONTRAST + 0.5, 0.0, 1.0) * np.asarray(DSLR_WARM).reshape(1, 3, 1, 1)
    alpha = _alpha(blurred)
    background = rng.uniform(*DSLR_BACKGROUND, (len(photo), 1, 1, 1))
    return to_uint8((1.0 - alpha) * background + alpha * contrast)


def webcam(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """WebCam-like: low resolution, low contrast, cool colour cast on a gray desk, noisy."""
    size = photo.shape[-1]
    small = resize_uint8(photo, WEBCAM_SIDE).astype(np.float64) / 255.0
    shade = upsample_bilinear(small, size)[:, None]
    desk = rng.uniform(*WEBCAM_DESK, (len(photo), 1, 1, 1))
    pixels = (desk + (shade - desk) * WEBCAM_CONTRAST * (shade > 0.0)) * np.asarray(WEBCAM_COOL).reshape(1, 3, 1, 1)
    return to_uint8(pixels + rng.standard_normal((len(photo), 3, size, size)) * WEBCAM_NOISE)


LOOKS = {"standin_office_amazon": catalogue, "standin_office_caltech": cluttered, "standin_office_dslr": dslr,
         "standin_office_webcam": webcam}


def _make_office(source: str, recipe: Recipe, root: Path | None, split: str) -> list[Arrays]:
    return [(LOOKS[source](resize_uint8(x, recipe.size), standin_rng(source, part)), y)
            for part, (x, y) in zip(("train", "test"), _photos(source, recipe, root), strict=True)]


for _name in OFFICE_STANDIN:
    register_standin(_name, partial(_make_office, _name))  # Fashion-MNIST's files are the same everywhere
    SOURCES.register(_name)(partial(load_standin, source=_name, train_per_class=OFFICE_PAPER_PER_CLASS,
                                    classes=FASHION_MNIST_CLASSES))
