"""Seeds derived from (seed, purpose, ...) so that every random draw is a pure function of its position.

Local training of client ``c`` in round ``r`` draws its shuffles and augmentations from
``generator(seed, "train", r, c)``; nothing depends on how many draws happened before. That is what makes
a resumed run, a run with a different launcher, or a run whose clients are visited in another order
bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *path: object) -> int:
    """A 63-bit seed from ``seed`` and a path of labels (stable across processes and Python versions)."""
    text = "/".join([str(int(seed)), *map(str, path)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def generator(seed: int, *path: object, device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` seeded with :func:`derive_seed`."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *path))
    return gen
