"""FLANC (Mei, Guo, Huang, Wang, Shao, Chen, NeurIPS 2022): all-in-one neural composition (Pa3dFL Sec. 3.1, App. C.3).

Every conv and linear layer of the body is a shared neural basis times width-specific coefficients
(:class:`methods._decomposed.Decomposed`, Eq. 3). Client i runs width p_i (rule ``multiple``: the largest multiple of
the step with p_i^2 <= r_i). Per layer, with T output and S input channels of the full model:

  R1 = basis_width * S (S itself for the layer that reads the image),   R2 = floor(basis_ratio * T)
  basis B: R2 x R1 x k x k, one per layer, shared by every width;   coefficients: p T x (p S / R1) R2, per width

Local loss: CE + lambda sum_l mean((B_l B_l^T - I)^2). Server: the bases are averaged over all participants
(weights n_k); every other entry (coefficients, biases, norms, head) only among the participants of the same width.
Every width's model starts from its own default initialisation and the full model's basis (``narrow_init: own``,
as the official FLANC code builds one model per width and syncs the filter banks); ``prefix`` starts it as the
prefix slice of the initial full model instead, so that its composed weights are the prefix slices of the full ones
(their variance then follows the full fan-in: a width-1/8 model's logits start about 3 times smaller). 'pre' is
the trained model, 'post' the width's model with the new basis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.aggregate import WeightedMean
from bench.core.capacity import WidthRule
from bench.core.engine import METHODS, ClientRound, Federation, Method
from bench.core.flat import FlatModel
from methods._decomposed import Decomposed, decompose, decomposed_layers


@dataclass(frozen=True)
class FLANCHyper:
    lam: float  # lambda of the orthogonality regulariser
    basis_ratio: float  # R2 = floor(basis_ratio * T): filters in a layer's basis (authors: 0.25)
    basis_width: float  # R1 = basis_width * S: input channels of a basis filter (authors: p_min)
    width_step: float | None  # widths are multiples of this; null = p_min (authors' FLGo code)
    narrow_init: str  # own: each width's own default init (official code) | prefix: prefix slice of the full init


NARROW_INITS = ("own", "prefix")


def basis_shape(width: float, hp: FLANCHyper) -> Any:
    """``make`` for :func:`decompose`: R1, R2 from the full model's sizes, recovered as the narrow size / width."""

    def make(name: str, layer: nn.Conv2d | nn.Linear, first: bool) -> nn.Module:
        out_f, in_f = layer.weight.shape[:2]
        group = in_f if first else max(1, round(hp.basis_width * in_f / width))
        return Decomposed(layer, max(1, math.floor(hp.basis_ratio * round(out_f / width))), group)

    return make


@METHODS.register("flanc")
class FLANC(Method):
    Hyper = FLANCHyper
    capacity_aware = True

    def __init__(self, fed: Federation, hp: FLANCHyper) -> None:
        super().__init__(fed, hp)
        if hp.narrow_init not in NARROW_INITS:
            raise ValueError(f"method.narrow_init={hp.narrow_init!r} is not one of {', '.join(NARROW_INITS)}")
        self.width_rule, self.widths = fed.client_widths(WidthRule("multiple", hp.width_step))

    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        decompose(model.body, basis_shape(width, hp))
        return model

    def client_width(self, cid: int) -> float:
        return self.widths[cid]

    def client_worker(self, cid: int, stage: str) -> FlatModel:
        return self.fed.worker_for(self.widths[cid])

    @staticmethod
    def key(width: float) -> str:
        return f"{width:g}"

    def basis_index(self, worker: FlatModel) -> torch.Tensor:
        return worker.index(worker.mask(lambda e: e.name.endswith(".basis")))

    def setup(self, init: torch.Tensor) -> None:
        full = self.fed.worker
        self.state["basis"] = init[self.basis_index(full)]
        self.state["models"] = {}
        for width in sorted(set(self.widths)):
            worker = self.fed.worker_for(width)
            shapes = [e.shape for e in worker.entries if e.name.endswith(".basis")]
            if shapes != [e.shape for e in full.entries if e.name.endswith(".basis")]:
                raise ValueError(f"FLANC: the bases of width {width} differ from the full model's: the width must "
                                 f"be a multiple of method.basis_width={self.hp.basis_width}")
            own = self.hp.narrow_init == "own" and width != 1.0
            self.state["models"][self.key(width)] = (self.fed.initial_model(width, "flanc") if own
                                                     else init[worker.positions_in(full)])

    def client_model(self, cid: int) -> torch.Tensor:
        width = self.widths[cid]
        vector = self.state["models"][self.key(width)].clone()
        vector[self.basis_index(self.fed.worker_for(width))] = self.state["basis"]
        return vector

    def loss(self, task: ClientRound, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        orth = sum(layer.orthogonality() for layer in decomposed_layers(model.module))
        return F.cross_entropy(model.module(x), y) + self.hp.lam * orth

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._basis = WeightedMean()
        self._models: dict[str, WeightedMean] = {}

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        n = float(self.fed.train_sizes[task.cid])
        self._basis.add(model.vector[self.basis_index(model)], n)
        self._models.setdefault(self.key(self.widths[task.cid]), WeightedMean()).add(model.vector, n)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["basis"] = self._basis.result(self.state["basis"].dtype)
        for key, mean in self._models.items():
            self.state["models"][key] = mean.result(self.state["models"][key].dtype)
