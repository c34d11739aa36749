"""Augmentations of a whole batch tensor ``[B, C, H, W]`` on its own device.

Every random draw comes from the ``torch.Generator`` passed in, so the same generator state gives the
same output. Random numbers are drawn on the generator's device and then moved to the batch's device,
so a CPU generator can drive augmentation of a CUDA batch. Random transforms refuse ``generator=None``.
Each sample gets its own crop offset, flip decision and rotation angle, with no Python loop over samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F


class BatchTransform(Protocol):
    """A batch augmentation: ``[B, C, H, W]`` in, ``[B, C, H', W']`` out, randomness from ``generator``."""

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor: ...


def _need(generator: torch.Generator | None, who: str) -> torch.Generator:
    if generator is None:
        raise ValueError(f"{who} is random and needs a torch.Generator (no hidden global randomness)")
    return generator


def _uniform(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``n`` uniform [0, 1) float32 numbers drawn on the generator's device, returned on ``device``."""
    return torch.rand(n, generator=generator, device=generator.device).to(device)


def _randint(high: int, n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``n`` integers uniform in ``[0, high)`` drawn on the generator's device, returned on ``device``."""
    return torch.randint(high, (n,), generator=generator, device=generator.device).to(device)


class Compose:
    """Apply transforms in order; an empty ``Compose`` returns its input."""

    def __init__(self, transforms: Sequence[BatchTransform] = ()) -> None:
        self.transforms: tuple[BatchTransform, ...] = tuple(transforms)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        for t in self.transforms:
            x = t(x, generator)
        return x

    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self) -> Iterator[BatchTransform]:
        return iter(self.transforms)

    def __repr__(self) -> str:
        return f"Compose([{', '.join(repr(t) for t in self.transforms)}])"


class Normalize:
    """Per-channel ``(x - mean) / std``."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or not self.mean:
            raise ValueError(f"normalize: mean {self.mean} and std {self.std} need the same, non-zero length")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"normalize: std {self.std} must be positive")

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        c = x.shape[1]
        if len(self.mean) not in (1, c):
            raise ValueError(f"normalize: {len(self.mean)} mean/std values for a {c}-channel batch")
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return (x - mean) / std

    def __repr__(self) -> str:
        return f"Normalize(mean={list(self.mean)}, std={list(self.std)})"


class RandomCrop:
    """Zero-pad by ``padding`` on every side, then take a ``size`` x ``size`` window at a random offset.

    Offsets are independent per sample; row offset then column offset are drawn from the generator.
    """

    def __init__(self, size: int, padding: int = 0) -> None:
        if size < 1 or padding < 0:
            raise ValueError(f"random_crop: size={size} must be >= 1 and padding={padding} >= 0")
        self.size = int(size)
        self.padding = int(padding)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        gen = _need(generator, "random_crop")
        p, s = self.padding, self.size
        padded = F.pad(x, (p, p, p, p)) if p else x
        b, _, h, w = padded.shape
        if s > h or s > w:
            raise ValueError(f"random_crop: size {s} is larger than the padded image {h}x{w}")
        top = _randint(h - s + 1, b, gen, x.device)
        left = _randint(w - s + 1, b, gen, x.device)
        offsets = torch.arange(s, device=x.device)
        rows = (top[:, None] + offsets)[:, :, None]  # [B, s, 1]
        cols = (left[:, None] + offsets)[:, None, :]  # [B, 1, s]
        batch = torch.arange(b, device=x.device)[:, None, None]
        # Indexing the channels-last view gives [B, s, s, C]; move channels back to dim 1.
        return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2).contiguous()

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding})"


class RandomHorizontalFlip:
    """Mirror each sample left-right with probability ``p``, independently per sample."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"hflip: p={p} must be in [0, 1]")
        self.p = float(p)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        gen = _need(generator, "hflip")
        flip = _uniform(x.shape[0], gen, x.device) < self.p
        return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


def rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each sample about its centre by ``angles`` degrees (positive = counter-clockwise).

    Bilinear interpolation, zero fill outside the image; pixel geometry is kept on non-square images.
    """
    b, _, h, w = x.shape
    rad = angles.to(device=x.device, dtype=x.dtype) * (math.pi / 180.0)
    cos, sin = torch.cos(rad), torch.sin(rad)
    zero = torch.zeros_like(rad)
    # affine_grid maps output to input positions in coordinates normalised to [-1, 1] per axis, so the
    # off-diagonal terms carry the aspect ratio.
    row_x = torch.stack([cos, -sin * (h / w), zero], dim=1)
    row_y = torch.stack([sin * (w / h), cos, zero], dim=1)
    theta = torch.stack([row_x, row_y], dim=1)  # [B, 2, 3]
    grid = F.affine_grid(theta, [b, x.shape[1], h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


class RandomRotation:
    """Rotate each sample by an angle drawn uniformly from ``[-degrees, degrees]`` (see :func:`rotate`)."""

    def __init__(self, degrees: float) -> None:
        if degrees < 0:
            raise ValueError(f"rotation: degrees={degrees} must be >= 0")
        self.degrees = float(degrees)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        gen = _need(generator, "rotation")
        angles = (_uniform(x.shape[0], gen, x.device) * 2.0 - 1.0) * self.degrees
        return rotate(x, angles)

    def __repr__(self) -> str:
        return f"RandomRotation(degrees={self.degrees})"


TRANSFORMS: Mapping[str, Callable[..., BatchTransform]] = {
    "random_crop": RandomCrop,
    "hflip": RandomHorizontalFlip,
    "rotation": RandomRotation,
    "normalize": Normalize,
}


def build_transform(spec: Sequence[Mapping[str, Any]] | None) -> Compose:
    """A :class:`Compose` from config entries such as ``{"name": "hflip", "p": 0.5}`` (None -> identity)."""
    if spec is None:
        return Compose([])
    if isinstance(spec, (str, Mapping)):
        raise ValueError(f"transform spec must be a list of entries, got {type(spec).__name__}")
    allowed = ", ".join(TRANSFORMS)
    transforms: list[BatchTransform] = []
    for i, entry in enumerate(spec):
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise ValueError(f"transform entry {i} ({entry!r}) needs a 'name': one of {allowed}")
        options = {str(k): v for k, v in entry.items() if k != "name"}
        name = entry["name"]
        if name not in TRANSFORMS:
            raise ValueError(f"unknown transform {name!r} (entry {i}); allowed names: {allowed}")
        try:
            transforms.append(TRANSFORMS[name](**options))
        except TypeError as exc:
            raise ValueError(f"transform {name!r} (entry {i}): bad options {options}: {exc}") from exc
    return Compose(transforms)
