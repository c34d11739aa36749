"""A user's plug-in for pflrepro: one module that registers a model, a data source, a partition scheme and a
method, loaded with ``imports=[my_plugin]`` (docs/plugins.md). Nothing in the package is edited.

- model ``my_mlp``: a one-hidden-layer MLP as a ``SplitModel`` (body: flatten, Linear, ReLU; head: Linear);
- data source ``my_stripes``: 1x8x8 noisy images whose class is the row of a bright stripe (no files);
- partition scheme ``my_groups``: the classes dealt round-robin into ``groups`` groups; client ``i`` holds group
  ``i % groups`` and shares its train and test samples with the other clients of that group;
- method ``my_fedavgm``: FedAvg with server momentum (FedAvgM, Hsu et al., 2019).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bench.core.engine import METHODS
from bench.core.models import MODELS, SplitModel, scaled
from datasets.partition import PartitionData, Parts, fail, scheme
from datasets.sources import SOURCES, SPLITS, ImageData
from methods.fedavg import FedAvg


# ----------------------------------------------------------------------------------------------- model
@MODELS.register("my_mlp")
def my_mlp(*, num_classes: int, in_channels: int, image_size: int, width: float = 1.0,
           hidden: int = 64) -> SplitModel:
    """Body: flatten, Linear to ``hidden`` (scaled by ``width``), ReLU; head: Linear to the classes.
    Keyword-only arguments after ``width`` are the model's options (``model.options.hidden``)."""
    features = scaled(hidden, width)
    body = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size * image_size, features), nn.ReLU())
    return SplitModel(body, features, num_classes)


# ----------------------------------------------------------------------------------------- data source
@SOURCES.register("my_stripes")
def load_stripes(split: str, root: Path | None = None, download: bool = False, *, num_train: int = 400,
                 num_test: int = 200, num_classes: int = 4, noise: float = 0.5, seed: int = 0) -> ImageData:
    """``split`` of the stripes data: image ``j`` has class ``j % num_classes``, a grey background (0.5) and row
    ``j % num_classes`` white, under Gaussian noise. Keyword-only arguments are the options (``dataset.options``)."""
    if not 2 <= num_classes <= 8:
        raise ValueError(f"dataset.options.num_classes={num_classes} is invalid: use 2..8 (one class per image row)")
    n = num_train if split == "train" else num_test
    gen = torch.Generator().manual_seed(len(SPLITS) * seed + SPLITS.index(split))  # a stream per (seed, split)
    labels = torch.arange(n) % num_classes
    images = 0.5 + noise * torch.randn(n, 1, 8, 8, generator=gen)
    images[torch.arange(n), 0, labels, :] += 0.5
    classes = tuple(f"row {k}" for k in range(num_classes))
    return ImageData(images.clamp(0, 1), labels, classes, "my_stripes", split, "my_stripes")


# ------------------------------------------------------------------------------------ partition scheme
@scheme("my_groups", groups=2)
def my_groups(data: PartitionData, num_clients: int, rng: np.random.Generator, p: dict) -> Parts:
    """Class ``c`` belongs to group ``c % groups``, client ``i`` holds group ``i % groups``; each group's train
    samples and test samples are shuffled and split evenly among its clients. Parameters: ``p`` (the scheme's
    defaults updated by the config), ``rng`` (seeded from ``data_seed``: use no other randomness)."""
    groups = p["groups"]
    most = min(data.num_classes, num_clients)
    if not isinstance(groups, int) or isinstance(groups, bool) or not 1 <= groups <= most:
        raise fail("groups", groups, f"it must be an integer in [1, {most}] (at most one group per class and client)")
    parts: list[list[np.ndarray]] = [[], []]  # train, test: per client its pool positions
    for side, by_class in enumerate((data.train_by_class, data.test_by_class)):
        held: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for g in range(groups):
            members = rng.permutation(np.concatenate(by_class[g::groups]))
            clients = range(g, num_clients, groups)
            for cid, piece in zip(clients, np.array_split(members, len(clients)), strict=True):
                held[cid].append(piece)
        parts[side] = [np.concatenate(h) for h in held]
    return list(zip(parts[0], parts[1], strict=True))


# ---------------------------------------------------------------------------------------------- method
@dataclass(frozen=True)
class FedAvgMHyper:
    """The method's hyperparameters: the keys of conf/method/my_fedavgm.yaml besides ``name``."""

    server_lr: float = 1.0  # eta, the server's step size
    momentum: float = 0.9  # beta, the server's momentum (0 gives FedAvg)


@METHODS.register("my_fedavgm")
class FedAvgM(FedAvg):
    """FedAvg with server momentum (Hsu et al., 2019): with w the global model and w_bar the participants'
    sample-weighted mean, the server keeps v <- beta v + (w - w_bar) and steps w <- w - eta v."""

    Hyper = FedAvgMHyper

    def setup(self, init: torch.Tensor) -> None:
        super().setup(init)  # FedAvg's global model, client model and sample-weighted mean are reused as they are
        self.state["velocity"] = torch.zeros_like(init)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        w = self.state["global"]
        self.state["velocity"] = self.hp.momentum * self.state["velocity"] + (w - self._mean.result(w.dtype))
        self.state["global"] = w - self.hp.server_lr * self.state["velocity"]

    def metrics(self, round_: int) -> dict[str, float]:
        return {"velocity_norm": float(self.state["velocity"].norm())}
