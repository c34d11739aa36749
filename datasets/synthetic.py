"""A synthetic image source for tests and benchmarks: class templates plus Gaussian noise.

Registered as ``synthetic`` in the data-source registry. Everything is a pure function of the options
(``seed`` included), so it needs no files and gives the same images in every process.
"""

from __future__ import annotations

from pathlib import Path

import torch

from datasets.sources import SOURCES, ImageData


@SOURCES.register("synthetic")
def load_synthetic(
    split: str, root: Path | None = None, download: bool = False, *, num_train: int = 1000,
    num_test: int = 200, num_classes: int = 10, num_channels: int = 1, size: int = 8, noise: float = 0.3,
    seed: int = 0,
) -> ImageData:
    """``num_train``/``num_test`` images of ``num_channels`` x ``size`` x ``size``, labels cycling over classes."""
    gen = torch.Generator().manual_seed(seed)
    templates = torch.rand(num_classes, num_channels, size, size, generator=gen)
    n, offset = (num_train, 0) if split == "train" else (num_test, num_train)
    gen.manual_seed(seed + 1 + offset)
    labels = torch.arange(n) % num_classes
    images = (templates[labels] + noise * torch.randn(n, num_channels, size, size, generator=gen)).clamp(0, 1)
    return ImageData(images, labels, tuple(f"class_{c}" for c in range(num_classes)), "synthetic", split,
                     "synthetic")
