"""TailorFL (Deng, Chen, Ren, Lyu, Liu, Liu, Zhang, SenSys 2022): dual-personalised FL, a filter subset per client
sized to its capacity (Pa3dFL App. D.3; no public code: docs/methods/capacity_methods.md lists every reading).

- Structure: client i of width p_i (rule ``multiple``, step 1/16) keeps exactly p_i C of the C filters of every layer:
  a channel group, the outputs of a body conv/linear tied across residual additions (traced with torch.fx). Its
  submodel is the narrow worker of width p_i holding those channels of the global model.
- Importance layer: a learnable score per filter (init 1) scaling the layer's output (after its norm layer if one
  follows); local loss CE + lam * mean |score|; scores stay on the client (a filter's score: sum over its group).
- Selection, every ``tune_every`` (T1) rounds: the shallow 1 - Lp of the layers keep the top p_i C filters by L1
  magnitude in the global model; a deep layer takes the client's top p_i C by its own scores, then swaps up to
  floor(alpha p_i C) of them for the filters its similar clients rank highest (consensus sum_j max(sim_ij, 0) score_j,
  sim = cosine of the deep-layer scores). Without scores (or similar clients) a layer follows the magnitude rule.
- Scaling-based aggregation: weights whose inputs are pruned are divided by the kept fraction (1 / p_i) on download
  and multiplied back on upload; every entry is averaged (n_k) over the clients holding it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from bench.core.aggregate import WeightedMean
from bench.core.capacity import WidthRule
from bench.core.engine import METHODS, ClientRound, Federation, Method
from bench.core.flat import FlatModel
from bench.core.models import NORM_TYPES
from methods._decomposed import LAYERS, channel_groups


def _scale_output(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    return output * module.importance.view(1, -1, *[1] * (output.dim() - 2))


@dataclass(frozen=True)
class TailorFLHyper:
    lam: float  # L1 weight of the importance scores
    alpha: float  # at most floor(alpha p_i C) filters of a deep layer swapped per tuning
    deep_fraction: float  # Lp: the last Lp of the layers are personalised
    tune_every: int  # T1: rounds between structure tunings
    width_step: float | None  # widths are multiples of this (TailorFL: 1/16); null = p_min
    scale: bool  # scaling-based aggregation (divide pruned-input weights by the kept fraction on download)


@METHODS.register("tailorfl")
class TailorFL(Method):
    Hyper = TailorFLHyper
    capacity_aware = True

    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        for node in torch.fx.symbolic_trace(model).graph.nodes:
            if node.op == "call_module" and node.target.startswith("body.") and isinstance(
                    model.get_submodule(node.target), LAYERS):
                users = list(node.users)
                norm = len(users) == 1 and users[0].op == "call_module" and isinstance(
                    model.get_submodule(users[0].target), NORM_TYPES)
                owner = model.get_submodule(users[0].target if norm else node.target)
                owner.importance = nn.Parameter(torch.ones(owner.weight.shape[0]))
                owner.register_forward_hook(_scale_output)
        return model

    def __init__(self, fed: Federation, hp: TailorFLHyper) -> None:
        super().__init__(fed, hp)
        self.width_rule, self.widths = fed.client_widths(WidthRule("multiple", hp.width_step))
        full = fed.worker
        self.dims = channel_groups(full.module)
        weights = [(e, self.dims[(e.name, 0)]) for e in full.entries if e.name.startswith("body.")
                   and e.module_type in LAYERS and e.name.endswith(".weight")]
        order = list(dict.fromkeys(g for _, g in weights))  # prunable groups, shallow to deep
        self.size = {g: e.shape[0] for e, g in weights}  # C per group (every tensor of a group has C rows)
        self.offset = dict(zip(order, [0, *torch.tensor(list(self.size.values())).cumsum(0).tolist()], strict=False))
        self.deep = set(order[len(order) - round(hp.deep_fraction * len(order)):])
        self.imp_index = full.index(full.mask(lambda e: e.name.endswith(".importance")))
        imps = [e for e in full.entries if e.name.endswith(".importance")]
        starts = torch.tensor([0, *[e.numel for e in imps]]).cumsum(0).tolist()
        # (slice, rows, group) of the conv/linear weights in the global vector, of the scores in a client's
        self.weights = [(e.slice, e.shape[0], g) for e, g in weights]
        self.imps = [(slice(a, a + e.numel), e.numel, self.dims[(e.name, 0)])
                     for e, a in zip(imps, starts, strict=False)]
        self.kept = {p: {g: fed.worker_for(p).entry(e.name).shape[0] for e, g in weights} for p in self.widths}
        self.channels = sum(self.size.values())

    def client_width(self, cid: int) -> float:
        return self.widths[cid]

    def client_worker(self, cid: int, stage: str) -> FlatModel:
        return self.fed.worker_for(self.widths[cid])

    def setup(self, init: torch.Tensor) -> None:
        n = self.fed.num_clients
        self.state.update({"global": init, "importance": init[self.imp_index].repeat(n, 1), "keep": torch.ones(
            n, self.channels, dtype=torch.bool, device=init.device),
            "scored": torch.zeros(n, dtype=torch.bool, device=init.device)})
        self.state["keep"] = self.tune()  # by magnitude: no client has scores yet

    def group_sum(self, values: torch.Tensor, parts: list[tuple[slice, int, int]]) -> torch.Tensor:
        """Per channel (last dim): the L1 norms of the channel's rows of every tensor of its group."""
        out = torch.zeros(*values.shape[:-1], self.channels, dtype=values.dtype, device=values.device)
        for where, rows, g in parts:
            norms = values[..., where].abs().reshape(*values.shape[:-1], rows, -1).sum(-1)
            out[..., self.offset[g]: self.offset[g] + self.size[g]] += norms
        return out

    def tune(self) -> torch.Tensor:
        """Every client's filters (bool ``[N, channels]``) by the magnitude, own-score and similarity rules."""
        mag = self.group_sum(self.state["global"], self.weights)
        scores = self.group_sum(self.state["importance"], self.imps) * self.state["keep"]
        deep = torch.cat([torch.full((c,), g in self.deep) for g, c in self.size.items()]).to(scores.device)
        unit = F.normalize(scores * deep, dim=1)
        sim = (unit @ unit.T).fill_diagonal_(0).clamp(min=0) * self.state["scored"]
        consensus = sim @ scores
        keep = torch.zeros_like(self.state["keep"])
        for i, p in enumerate(self.widths):
            for g, k in self.kept[p].items():
                at = slice(self.offset[g], self.offset[g] + self.size[g])
                chosen = top(mag[at], mag[at], k)
                if g in self.deep and self.state["scored"][i] and bool(consensus[i, at].any()):
                    chosen = swap(top(scores[i, at], mag[at], k), top(consensus[i, at], mag[at], k),
                                  scores[i, at], consensus[i, at], math.floor(self.hp.alpha * k))
                keep[i, at][chosen] = True
        return keep

    def positions(self, cid: int) -> torch.Tensor:
        """Where each entry of client ``cid``'s submodel sits in the global vector (its kept channels)."""
        full, worker = self.fed.worker, self.fed.worker_for(self.widths[cid])
        blocks = dict(getattr(full.module, "flatten_blocks", {}))
        keep = self.state["keep"][cid].cpu()  # the index arithmetic below runs on the CPU
        out = torch.empty(worker.size, dtype=torch.long)
        for e in worker.entries:
            f, index = full.entry(e.name), torch.zeros((), dtype=torch.long)
            for d, (n, size) in enumerate(zip(e.shape, f.shape, strict=True)):
                along = torch.arange(size)
                if n != size:
                    g, block = self.dims[(e.name, d)], blocks.get(e.name, 1) if d == 1 else 1
                    chosen = keep[self.offset[g]: self.offset[g] + self.size[g]].nonzero().squeeze(1)
                    along = (chosen[:, None] * block + torch.arange(block)).reshape(-1)
                index = index[..., None] * size + along
            out[e.slice] = f.offset + index.reshape(-1)
        return out.to(full.vector.device)

    def scale(self, cid: int) -> torch.Tensor:
        """Per entry of the submodel: full fan-in / kept fan-in for a conv/linear weight, else 1."""
        worker = self.fed.worker_for(self.widths[cid])
        out = torch.ones(worker.size, dtype=worker.vector.dtype, device=worker.vector.device)
        for e in worker.entries:
            if self.hp.scale and e.module_type in LAYERS and e.name.endswith(".weight"):
                out[e.slice] = self.fed.worker.entry(e.name).shape[1] / e.shape[1]
        return out

    def client_model(self, cid: int) -> torch.Tensor:
        vector = self.state["global"].clone()
        vector[self.imp_index] = self.state["importance"][cid]
        return vector[self.positions(cid)] * self.scale(cid)

    def loss(self, task: ClientRound, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scores = torch.cat([p for n, p in model.module.named_parameters() if n.endswith(".importance")])
        return F.cross_entropy(model.module(x), y) + self.hp.lam * scores.abs().mean()

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        if (round_ - 1) % self.hp.tune_every == 0:
            self.state["keep"] = self.tune()
        self._mean = WeightedMean()

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        positions = self.positions(task.cid)
        self._mean.add(model.vector / self.scale(task.cid), float(self.fed.train_sizes[task.cid]), index=positions,
                       size=self.fed.size)
        mine = model.index(model.mask(lambda e: e.name.endswith(".importance")))
        self.state["importance"][task.cid, torch.searchsorted(self.imp_index, positions[mine])] = model.vector[mine]
        self.state["scored"][task.cid] = True

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["global"] = self._mean.result(self.state["global"].dtype, fallback=self.state["global"])


def top(values: torch.Tensor, tiebreak: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest ``values``; ties go to the larger ``tiebreak``, then to the lower index."""
    order = torch.sort(tiebreak, descending=True, stable=True).indices
    return order[torch.sort(values[order], descending=True, stable=True).indices][:k]


def swap(own: torch.Tensor, target: torch.Tensor, score: torch.Tensor, consensus: torch.Tensor,
         most: int) -> torch.Tensor:
    """``own`` with up to ``most`` of its filters outside ``target`` (lowest own score first) replaced by the
    filters of ``target`` outside ``own`` (highest consensus first)."""
    drop, add = own[~torch.isin(own, target)], target[~torch.isin(target, own)]
    m = min(most, drop.numel())
    drop = drop[torch.sort(score[drop], stable=True).indices[:m]]
    add = add[torch.sort(consensus[add], descending=True, stable=True).indices[:m]]
    return torch.cat([own[~torch.isin(own, drop)], add])
