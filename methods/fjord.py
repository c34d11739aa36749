"""FjORD (Horváth et al., NeurIPS 2021): ordered dropout with self-distillation (Alg. 1).

Client i holds the nested submodel of width p_i (the prefix, as in HeteroFL). At every local step it samples
p' uniformly from the allowed widths {p in D : p <= p_i} (``sample_widths`` = D, p_i always included) and
trains the p'-submodel: the first ceil(p' C) channels of every layer (ordered dropout). With ``distill``
(self-distillation) the step's loss is
    CE(f_{p_i}(x), y) + [p' < p_i] ((1 - a) CE(f_{p'}(x), y) + a T^2 KL(softmax(f_{p_i}(x)/T) || softmax(f_{p'}(x)/T)))
with the widest output as a fixed teacher (the authors' Flower baseline: a = 1, T = 1); without it, CE(f_{p'}(x), y).
Aggregation is nested as in HeteroFL (methods/_nested.py).

Ordered dropout is implemented by slicing, not masking: the p'-submodel's tensors are prefix views of the
client's widest tensors, run through the p' worker's module with ``torch.func.functional_call``, so the
gradient lands in the widest model directly (masking channels is not the same model under GroupNorm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import functional_call

from bench.core.capacity import PREFERRED_WIDTHS
from bench.core.engine import METHODS, ClientRound, Federation
from bench.core.flat import FlatModel
from common.seeding import generator
from methods._nested import NestedHyper, NestedWidths


@dataclass(frozen=True)
class FjORDHyper(NestedHyper):
    sample_widths: str | list[float]  # D: "levels" (0.5^k down to the narrowest client) | "clients" | a list
    distill: bool  # self-distillation from the client's widest submodel
    distill_weight: float  # a: weight of the KL term (1 - a on the sampled submodel's own CE)
    temperature: float  # T of the distillation softmax


def sample_pool(spec: str | Sequence[float], widths: Sequence[float]) -> list[float]:
    """The width set D of ``spec`` for a federation whose clients have ``widths``."""
    if spec == "levels":
        return [p for p in PREFERRED_WIDTHS if p >= min(widths) - 1e-12]
    if spec == "clients":
        return sorted(set(widths))
    if not isinstance(spec, str) and spec and all(0 < float(p) <= 1 for p in spec):
        return sorted({float(p) for p in spec})
    raise ValueError(f"method.sample_widths={spec!r} is invalid: use 'levels', 'clients' or a list of widths in (0, 1]")


def nested_views(wide: FlatModel, narrow: FlatModel) -> dict[str, torch.Tensor]:
    """Every floating tensor of ``narrow`` as the prefix slice of ``wide``'s tensor of the same name (views:
    gradients and BatchNorm statistic updates go to ``wide``)."""
    tensors = dict(wide.module.named_parameters()) | dict(wide.module.named_buffers())
    return {e.name: tensors[e.name][tuple(slice(0, n) for n in e.shape)] for e in narrow.entries}


@METHODS.register("fjord")
class FjORD(NestedWidths):
    Hyper = FjORDHyper

    def __init__(self, fed: Federation, hp: Any) -> None:
        super().__init__(fed, hp)
        pool = sample_pool(hp.sample_widths, self.widths)
        self.allowed = {p: sorted({w for w in pool if w <= p} | {p}) for p in set(self.widths)}

    def sample_width(self, cid: int, draw: torch.Generator) -> float:
        allowed = self.allowed[self.widths[cid]]
        return allowed[int(torch.randint(len(allowed), (1,), generator=draw))]

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        self._draw = generator(self.fed.seed, "fjord", task.round, task.cid)  # the widths, apart from the batches
        return self.local_sgd(task, model)

    def forward_at(self, model: FlatModel, width: float, x: torch.Tensor) -> torch.Tensor:
        """Logits of the width-``width`` submodel nested in ``model``."""
        narrow = self.fed.worker_for(width)
        if narrow is model:
            return model.module(x)
        narrow.module.train(model.module.training)
        return functional_call(narrow.module, nested_views(model, narrow), (x,))

    def loss(self, task: ClientRound, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        width, sub = self.widths[task.cid], self.sample_width(task.cid, self._draw)
        if not self.hp.distill:
            return F.cross_entropy(self.forward_at(model, sub, x), y)
        teacher = model.module(x)
        loss = F.cross_entropy(teacher, y)
        if sub < width:
            student, a, t = self.forward_at(model, sub, x), self.hp.distill_weight, self.hp.temperature
            kl = F.kl_div(F.log_softmax(student / t, 1), F.log_softmax(teacher.detach() / t, 1), reduction="batchmean",
                          log_target=True)
            loss = loss + (1 - a) * F.cross_entropy(student, y) + a * t * t * kl
        return loss
