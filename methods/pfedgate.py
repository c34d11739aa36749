"""pFedGate (Chen, Gao, Xie, Li, Ding, Zhou, ICML 2023): a shared global model, adapted per batch by a local gating
layer into a block-wise sparse model under the client's sparsity budget (Pa3dFL App. D.3; official code yxdyc/pFedGate).

Blocks: every parameter tensor of the model is cut into ``blocks_per_tensor`` contiguous chunks (official
``fine_grained_block_split``, 5 in its scripts and in Pa3dFL). For an input batch x of client i, with budget
s_i = min(r_i, sparsity) (the client's capacity r_i when ``sparsity`` is null):

  g = mean_batch sigmoid(BN1d(Linear(flatten(pool(BN2d(x))))))   in (0, 1)^blocks; clipped below at
      min(max(1 / blocks_per_tensor, 0.1), s_i) as the official code does
  knapsack: the first chunk of every tensor is always kept, outside the budget ("to avoid cutting info flow",
      official ``models/gating_layers.py`` l. 86-95); in each of two groups (blocks of Linear layers / all others,
      official) the other chunks are taken greedily in order of g, skipping a chunk that does not fit, while their
      sizes sum to <= round((s_i - g_min) * their group size), g_min the clip above (official
      ``pFedGate/gated_learner.py`` l. 216-222, 247); at s_i = 1 every block is kept (l. 195)
  weights: theta_b * g_b for a kept block b, 0 for a dropped one (the gate learns through g); the gate's output
      norm starts with shift ``gate_bias`` (official 0), so g starts near sigmoid(gate_bias)

so about g_min + (s_i - g_min)(1 - 1/blocks_per_tensor) of the parameters are non-zero in a forward pass: s_i
when s_i >= 1 / blocks_per_tensor, and one chunk per tensor (above s_i) when the budget is smaller. Local training
updates the model (train.* optimizer, lr) and the gate (SGD, ``gate_lr``, ``gate_momentum``, ``gate_weight_decay``,
gradient norm clipped at ``gate_clip``) on the same loss in each step (official ``bi_level_opt 0``); with
``train.keep_optimizer_state`` both optimizers keep each client's momentum across rounds, as the official code's
optimizers, built once per client, do. The global model (and its BN statistics) is averaged
with weights n_k; the gate, its input norm and its BN statistics stay on the client. ``relu_logits`` applies ReLU to
the output layer too, as the official forward with the gated weights does (``models/adapted_op.py`` l. 56-57; off
by default: the zoo's model has a plain output layer). ``score_levels`` (official 10) ranks the blocks for the knapsack
by their scores rounded to 0..levels in numpy's unstable argsort order, as the official code; ``straight_through``
weighs a kept block by its unclipped score g with the official straight-through mask, so that its gradient is
g' (1 + g) instead of g'. Both off by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from bench.core.engine import METHODS, ClientRound, Federation, make_optimizer
from bench.core.flat import FlatModel
from methods._partial import PartialPersonalization


@dataclass(frozen=True)
class PFedGateHyper:
    sparsity: float | None  # s_i = min(r_i, sparsity); null: s_i = r_i
    blocks_per_tensor: int  # chunks per parameter tensor
    gate_lr: float  # learning rate of the gating layer (Pa3dFL's tuned value)
    gate_clip: float  # max gradient norm of the gating layer (official: 10)
    gate_pool: int  # the gate reads the batch average-pooled to gate_pool x gate_pool
    gate_bias: float  # initial shift of the gate's output norm: scores start near sigmoid(gate_bias); official 0
    gate_momentum: float  # the gate's SGD momentum (official 0.9, kept per client across rounds)
    gate_weight_decay: float  # the gate's SGD weight decay (official 5e-4)
    relu_logits: bool  # ReLU on the gated model's output layer too (official adapted_forward), so no negative logit
    score_levels: int | None = None  # knapsack ranks round(g * levels) by numpy's argsort (official: 10); None: raw g
    straight_through: bool = False  # official weights: the unclipped g, gradient g' (1 + g) (straight-through mask)


class GatedModel(nn.Module):
    """``net`` (the zoo's model) whose parameters are masked block-wise by ``gate`` from each batch."""

    def __init__(self, net: nn.Module, hp: PFedGateHyper) -> None:
        super().__init__()
        self.net = net
        in_channels = next(m for m in net.modules() if isinstance(m, nn.Conv2d | nn.Linear)).weight.shape[1]
        owners = dict(net.named_modules())
        self.names, sizes, linear, first = [], [], [], []
        for name, p in net.named_parameters():
            chunk = math.ceil(p.numel() / min(hp.blocks_per_tensor, p.numel()))
            self.names.append(name)
            for start in range(0, p.numel(), chunk):
                sizes.append(min(chunk, p.numel() - start))
                linear.append(isinstance(owners[name.rpartition(".")[0]], nn.Linear))
                first.append(start == 0)
        self.register_buffer("sizes", torch.tensor(sizes, dtype=torch.long), persistent=False)
        self.linear, self.first = linear, first
        blocks = len(sizes)
        self.gate = nn.Sequential(nn.BatchNorm2d(in_channels), nn.AdaptiveAvgPool2d(hp.gate_pool), nn.Flatten(),
                                  nn.Linear(in_channels * hp.gate_pool ** 2, blocks), nn.BatchNorm1d(blocks))
        nn.init.constant_(self.gate[-1].bias, hp.gate_bias)
        self.blocks_per_tensor = hp.blocks_per_tensor
        self.relu_logits = hp.relu_logits
        self.score_levels = hp.score_levels
        self.straight_through = hp.straight_through
        self.sparsity = 1.0  # s_i of the client being served (set by the method before each use)

    @property
    def min_score(self) -> float:
        """g_min: the scores' lower clip, official ``min_sparse_factor`` (``gated_learner.py`` l. 49)."""
        return min(max(1 / self.blocks_per_tensor, 0.1), self.sparsity)

    def block_weights(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_b * keep_b, keep_b) for every block, from the batch ``x``."""
        raw = torch.sigmoid(self.gate(x)).mean(0)
        scores = raw.clamp(min=self.min_score)
        keep = self.knapsack(scores.detach())
        if self.straight_through:
            # official (gated_learner.py l. 102-108, 205-207, 225): the kept weight is the unclipped score times a
            # mask of value 1 whose gradient is that of the clipped score (1 - g.detach() + g)
            return raw * keep * (1 + scores - scores.detach()), keep
        return scores * keep, keep

    def knapsack(self, scores: torch.Tensor) -> torch.Tensor:
        """The kept blocks: every first chunk, and per group the other chunks greedily by score within
        round((s_i - g_min) * their size) (module docstring)."""
        keep = torch.tensor(self.first, dtype=torch.bool)
        if self.sparsity >= 1.0:
            return torch.ones_like(keep).to(scores.device)
        sizes, values = self.sizes.tolist(), scores.tolist()
        for group in (True, False):
            blocks = [b for b, lin in enumerate(self.linear) if lin == group and not self.first[b]]
            room = round(sum(sizes[b] for b in blocks) * (self.sparsity - self.min_score))
            for b in self.ranked(blocks, values):
                if sizes[b] <= room:
                    keep[b], room = True, room - sizes[b]
        return keep.to(scores.device)

    def ranked(self, blocks: list[int], values: list[float]) -> list[int]:
        """``blocks`` by decreasing score: the raw scores, ties by block; with ``score_levels`` the scores rounded to
        0..levels and ordered by numpy's default (unstable) argsort, as the official code (``gated_learner.py``
        l. 213, ``knapsack_solver.py`` l. 86)."""
        if self.score_levels is None:
            return sorted(blocks, key=lambda b: (-values[b], b))
        levels = np.around(np.array([values[b] for b in blocks]) * self.score_levels).astype(int)
        return [blocks[i] for i in (-levels).argsort()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, _ = self.block_weights(x)
        per_entry = weights.repeat_interleave(self.sizes)
        masked, offset = {}, 0
        for name, p in zip(self.names, self.net.parameters(), strict=True):
            masked[name] = p * per_entry[offset: offset + p.numel()].view_as(p)
            offset += p.numel()
        logits = functional_call(self.net, masked, (x,))
        return torch.relu(logits) if self.relu_logits else logits


@METHODS.register("pfedgate")
class PFedGate(PartialPersonalization):
    Hyper = PFedGateHyper
    capacity_aware = True  # through the sparsity s_i, not the width: every client holds the full model

    def __init__(self, fed: Federation, hp: PFedGateHyper) -> None:
        super().__init__(fed, hp)
        self.budgets = [min(float(r), hp.sparsity or 1.0) for r in fed.capacities]
        self._gate_opt: torch.optim.Optimizer | None = None

    def client_cost(self, cid: int) -> float:
        return self.budgets[cid]

    def capacity_rule(self) -> str:
        return "sparsity s = min(r, method.sparsity) of the full model (blocks masked), not a width"

    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        return GatedModel(model, hp)

    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        return model.mask(lambda e: e.name.startswith("gate."))

    def serve(self, cid: int, model: FlatModel) -> None:
        model.module.sparsity = self.budgets[cid]

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        self.serve(task.cid, model)
        gate = list(model.module.gate.parameters())
        self._gate_opt = make_optimizer(gate, {"optimizer": "sgd", "momentum": self.hp.gate_momentum,
                                               "weight_decay": self.hp.gate_weight_decay}, self.hp.gate_lr)
        try:
            with self.kept_optimizer("gate", task.cid, self._gate_opt, model, gate):
                return self.local_sgd(task, model)
        finally:
            self._gate_opt = None

    def loss(self, task: ClientRound, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if len(y) == 1:  # the gate's BatchNorm1d cannot train on one sample: skipped, as the official code does
            return torch.zeros((), device=y.device, requires_grad=True)
        return super().loss(task, model, x, y)

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        """Step the gate with its own optimizer, then drop its gradients so the model's optimizer skips it."""
        assert self._gate_opt is not None
        gate = list(model.module.gate.parameters())
        nn.utils.clip_grad_norm_(gate, self.hp.gate_clip)
        self._gate_opt.step()
        for p in gate:
            p.grad = None

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        self.serve(cid, model)
        return super().eval_model(cid, stage, model, round_, lr)
