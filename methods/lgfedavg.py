"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", 2020): the lower layers (the local representation) stay on each client; the top
``global_layers`` layers are averaged (weights n_k). All layers are trained jointly every round (arXiv 2001.01523).

Layers are the modules with a weight of two or more dimensions (conv, linear), in the model's order; a norm
layer belongs to the layer before it, with its running statistics. ``global_layers: 1`` shares only the
classifier head; larger values move the split down the network (Pa3dFL tunes it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.core.engine import METHODS
from bench.core.flat import FlatModel
from methods._partial import PartialPersonalization


@dataclass(frozen=True)
class LGFedAvgHyper:
    global_layers: int  # how many top layers are averaged; the layers below them stay local

    def __post_init__(self) -> None:
        if self.global_layers < 1:
            raise ValueError(f"method.global_layers={self.global_layers} is invalid: it must be >= 1")


def layer_of_entries(model: FlatModel) -> list[int]:
    """The layer index (0 = lowest) of every entry of the flat layout."""
    owners: dict[str, int] = {}
    layer = -1
    for e in model.entries:
        if e.kind == "param":
            owner = e.name.rpartition(".")[0]
            if owner not in owners and e.name.endswith(".weight") and len(e.shape) >= 2:
                layer += 1
            owners.setdefault(owner, max(layer, 0))
    return [owners.get(e.name.rpartition(".")[0], 0) for e in model.entries]


def local_layers_mask(model: FlatModel, global_layers: int) -> torch.Tensor:
    """Entries of every layer below the top ``global_layers`` layers."""
    layers = layer_of_entries(model)
    if global_layers > max(layers) + 1:
        raise ValueError(f"method.global_layers={global_layers} is invalid: the model has {max(layers) + 1} layers")
    split = max(layers) + 1 - global_layers
    local = {e.name for e, layer in zip(model.entries, layers, strict=True) if layer < split}
    return model.mask(lambda e: e.name in local)


@METHODS.register("lgfedavg")
class LGFedAvg(PartialPersonalization):
    trains_batched = True
    Hyper = LGFedAvgHyper

    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        return local_layers_mask(model, self.hp.global_layers)
