"""Batch augmentations: determinism from the generator, exact geometry, config parsing."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bench.builder import build_experiment
from bench.experiment.compose import to_container
from bench.experiment.spec import cell_config, expand, load_spec
from datasets.augment import (
    Compose,
    Normalize,
    RandomCrop,
    RandomHorizontalFlip,
    RandomRotation,
    build_transform,
    rotate,
)
from tests.helpers import config
from tests.test_sources import cifar_batch

SPEC = [
    {"name": "random_crop", "size": 8, "padding": 2},
    {"name": "hflip", "p": 0.5},
    {"name": "rotation", "degrees": 15},
    {"name": "normalize", "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]},
]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(b: int = 16, c: int = 3, h: int = 8, w: int = 8) -> torch.Tensor:
    """Distinct positive values everywhere, so zero padding and every window are recognisable."""
    return (torch.arange(b * c * h * w, dtype=torch.float32) + 1).view(b, c, h, w)


def test_same_seed_same_output_different_seed_differs() -> None:
    t = build_transform(SPEC)
    x = torch.rand(32, 3, 8, 8, generator=gen(123))
    before = x.clone()
    a, b, c = t(x, gen(0)), t(x, gen(0)), t(x, gen(1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(x, before)  # input untouched
    g = gen(5)
    first, second = t(x, g), t(x, g)
    assert not torch.equal(first, second)  # the generator advances


def test_random_transforms_need_a_generator() -> None:
    x = batch(2)
    for t in (RandomCrop(8, 2), RandomHorizontalFlip(), RandomRotation(10)):
        with pytest.raises(ValueError, match="Generator"):
            t(x, None)
    assert torch.equal(Compose([])(x, None), x)
    assert torch.equal(build_transform(None)(x, None), x)


def find_offsets(padded: torch.Tensor, window: torch.Tensor) -> list[tuple[int, int]]:
    s = window.shape[-1]
    h, w = padded.shape[-2:]
    spots = [(i, j) for i in range(h - s + 1) for j in range(w - s + 1)]
    return [(i, j) for i, j in spots if torch.equal(padded[:, i : i + s, j : j + s], window)]


def test_random_crop_is_a_shifted_window() -> None:
    x = batch(64, 3, 8, 8)
    out = RandomCrop(8, 2)(x, gen(0))
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    offsets = []
    for k in range(64):
        found = find_offsets(padded[k], out[k])
        assert len(found) == 1  # each sample is exactly one window of its own padded image
        offsets.append(found[0])
    assert all(0 <= i <= 4 and 0 <= j <= 4 for i, j in offsets)
    assert len(set(offsets)) > 5  # independent offsets per sample
    # one sample against manual slicing, with the offset drawn as documented (rows, then columns)
    g = gen(0)
    top = torch.randint(5, (64,), generator=g)
    left = torch.randint(5, (64,), generator=g)
    i, j = int(top[7]), int(left[7])
    assert torch.equal(out[7], padded[7, :, i : i + 8, j : j + 8])


def test_random_crop_smaller_window_without_padding() -> None:
    x = batch(10, 2, 6, 7)
    out = RandomCrop(4, 0)(x, gen(3))
    assert out.shape == (10, 2, 4, 4)
    for k in range(10):
        assert len(find_offsets(x[k], out[k])) == 1
    with pytest.raises(ValueError, match="larger"):
        RandomCrop(9, 1)(x, gen(0))


def test_hflip_exact() -> None:
    x = batch(200, 1, 4, 5)
    assert torch.equal(RandomHorizontalFlip(1.0)(x, gen(0)), x.flip(-1))
    assert torch.equal(RandomHorizontalFlip(0.0)(x, gen(0)), x)
    out = RandomHorizontalFlip(0.5)(x, gen(0))
    flipped = torch.tensor([torch.equal(out[k], x[k].flip(-1)) for k in range(200)])
    kept = torch.tensor([torch.equal(out[k], x[k]) for k in range(200)])
    assert bool((flipped ^ kept).all())
    assert 60 < int(flipped.sum()) < 140
    expected = torch.rand(200, generator=gen(0)) < 0.5
    assert torch.equal(flipped, expected)
    with pytest.raises(ValueError):
        RandomHorizontalFlip(1.5)


def test_rotation_zero_is_identity_and_ninety_is_rot90() -> None:
    x = torch.rand(6, 3, 9, 9, generator=gen(0))
    assert torch.allclose(RandomRotation(0)(x, gen(0)), x, atol=1e-6)
    assert torch.allclose(rotate(x, torch.zeros(6)), x, atol=1e-6)
    # positive angles turn counter-clockwise, like torch.rot90 with k=1 on (H, W)
    assert torch.allclose(rotate(x, torch.full((6,), 90.0)), torch.rot90(x, 1, dims=(-2, -1)), atol=1e-5)
    wide = torch.rand(2, 1, 4, 8, generator=gen(1))
    assert torch.allclose(rotate(wide, torch.full((2,), 180.0)), wide.flip(-1).flip(-2), atol=1e-5)


def test_rotation_random_angles_zero_fill() -> None:
    x = torch.ones(64, 1, 16, 16)
    out = RandomRotation(45)(x, gen(0))
    assert out.shape == x.shape
    assert torch.allclose(out[:, :, 6:10, 6:10], torch.ones(64, 1, 4, 4), atol=1e-5)  # centre stays
    corners = out[:, 0, 0, 0]
    assert float(corners.min()) < 0.5  # zero fill where the rotated image leaves the frame
    assert len({round(float(v), 4) for v in out.sum(dim=(1, 2, 3))}) > 30  # angles differ per sample
    with pytest.raises(ValueError):
        RandomRotation(-1)


def test_normalize_math() -> None:
    x = torch.rand(4, 3, 5, 5, generator=gen(0))
    out = Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.5])(x, None)
    for c, (m, s) in enumerate([(0.5, 0.2), (0.4, 0.25), (0.3, 0.5)]):
        assert torch.allclose(out[:, c], (x[:, c] - m) / s)
    gray = Normalize([0.5], [0.5])(torch.ones(2, 1, 3, 3), None)
    assert torch.allclose(gray, torch.ones(2, 1, 3, 3))
    with pytest.raises(ValueError, match="3-channel"):
        Normalize([0.1, 0.2], [1.0, 1.0])(x, None)
    with pytest.raises(ValueError):
        Normalize([0.1], [0.0])
    with pytest.raises(ValueError):
        Normalize([0.1, 0.2], [1.0])


def test_build_transform_order_and_types() -> None:
    t = build_transform(SPEC)
    kinds = [type(s) for s in t]
    assert kinds == [RandomCrop, RandomHorizontalFlip, RandomRotation, Normalize]
    crop, flip, rot, norm = t.transforms
    assert (crop.size, crop.padding, flip.p, rot.degrees) == (8, 2, 0.5, 15.0)
    assert norm.mean == (0.5, 0.4, 0.3)
    assert len(build_transform([])) == 0
    # the composition applies the steps in order
    x = torch.rand(8, 3, 8, 8, generator=gen(2))
    g1, g2 = gen(9), gen(9)
    manual = x
    for step in t:
        manual = step(manual, g2)
    assert torch.equal(t(x, g1), manual)


def test_build_transform_errors() -> None:
    with pytest.raises(ValueError) as info:
        build_transform([{"name": "colour_jitter"}])
    for allowed in ("random_crop", "hflip", "rotation", "normalize"):
        assert allowed in str(info.value)
    with pytest.raises(ValueError, match="name"):
        build_transform([{"p": 0.5}])
    with pytest.raises(ValueError, match="hflip"):
        build_transform([{"name": "hflip", "probability": 0.5}])
    with pytest.raises(ValueError, match="list"):
        build_transform({"name": "hflip"})  # type: ignore[arg-type]


def test_generator_device_differs_from_batch_device() -> None:
    # Draws happen on the generator's device, then move to the batch's device ("meta" stands in for CUDA).
    x = torch.empty(4, 3, 8, 8, device="meta")
    for t in (RandomCrop(8, 2), RandomHorizontalFlip(), RandomRotation(10), Normalize([0.5] * 3, [0.2] * 3)):
        out = t(x, gen(0))
        assert out.device.type == "meta" and out.shape == x.shape


# ------------------------------------------------------------------ Pa3dFL's CIFAR columns (paper's augmentation)
def test_pa3dfl_cifar_columns_augment_training_batches_as_the_authors_flgo_code(tmp_path) -> None:
    spec = load_spec(Path(__file__).resolve().parent.parent / "conf" / "paper" / "pa3dfl" / "table1.yaml")
    for scale in ("paper", "mini"):
        for cell in {c.column: c for c in expand(spec, scale, seeds=[0]) if c.row == "Pa3dFL"}.values():
            names = [t["name"] for t in cell_config(cell)["dataset"]["train_transform"]]
            cifar = scale == "paper" and cell.column.startswith("CIFAR")  # the stand-in and Fashion-MNIST: none
            assert names == (["normalize", "random_crop", "hflip"] if cifar else []), (scale, cell.column)
    paper = next(c for c in expand(spec, "paper", seeds=[0]) if c.column == "CIFAR-10 Hetero")
    transforms = [o for o in paper.overrides if o.startswith(("dataset.train_transform", "dataset.test_transform"))]
    folder = tmp_path / "cifar-10-batches-py"  # a tiny CIFAR-10 in the official format
    for i in range(1, 6):
        cifar_batch(folder / f"data_batch_{i}", 8, i, "labels", 10, 2)
    cifar_batch(folder / "test_batch", 8, 9, "labels", 10, 2)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f, protocol=2)
    cfg = to_container(config(tmp_path, "dataset=cifar10", f"data_root={tmp_path}", "partition=iid", "num_clients=2",
                              "model=small_cnn", *transforms))
    client = build_experiment(cfg).data.client(0)
    mean, std = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1), torch.tensor([0.247, 0.243, 0.262]).view(3, 1, 1)
    raw = client.pool.images[client.train]
    normalised = (raw - mean) / std
    x, _ = next(client.batches("train", 64, gen(0), shuffle=False))
    again, _ = next(client.batches("train", 64, gen(0), shuffle=False))
    other, _ = next(client.batches("train", 64, gen(1), shuffle=False))
    assert torch.equal(x, again) and not torch.equal(x, other)  # drawn from the generator alone
    flips = 0
    for k in range(x.shape[0]):  # each image is a 32 x 32 window of its zero-padded normalised image, maybe mirrored
        padded = F.pad(normalised[k], (4, 4, 4, 4))
        plain, mirrored = find_offsets(padded, x[k]), find_offsets(padded, x[k].flip(-1))
        assert plain or mirrored, k
        flips += not plain
    assert 0 < flips < x.shape[0]
    test, _ = next(client.batches("test", 64, shuffle=False, augment=False))
    assert torch.allclose(test, (client.pool.images[client.test] - mean) / std)  # evaluation: normalised only
