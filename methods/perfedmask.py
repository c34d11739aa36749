"""PerFedMask (Setayesh, Li, Wong, ICLR 2023); algorithm and official-code references: docs/methods/perfedmask.md.

Body blocks b (P_b params) get per-client masks M [N, B] that minimize the official objective
J(M) = sum_i [P max_b K_ib - sum_b K_ib P_b + eps_i], K_ib = M_ib / sum_j M_jb, eps_i = nu_i P - sum_b M_ib P_b >= 0
(greedy fill + exact-objective local search instead of SCA + MOSEK). Clients train only their masked blocks
(head frozen), the server averages each entry over the participants that trained it, and 'post' evaluates
the global model fine-tuned on the client's training data; 'pre' is the locally trained model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.core.aggregate import WeightedMean
from bench.core.engine import METHODS, ClientRound, Method
from bench.core.flat import FlatModel
from bench.core.models import NORM_TYPES
from common.seeding import generator


@dataclass(frozen=True)
class PerFedMaskHyper:
    budget: float | list[float]  # nu: one value for all, or K values for K equal client groups (official schedule)
    freeze_head: bool  # the head is not trained during federated rounds (official code: lr 0 on the head)
    finetune_epochs: int  # local fine-tuning epochs before 'post' evaluation (official: 5)
    finetune_momentum: float
    finetune_weight_decay: float


def client_budgets(budget: float | Sequence[float], n: int) -> list[float]:
    """nu_i: client i gets budget[floor(K i / n)] (K = 1 for a scalar; K = n gives one value per client)."""
    values = [float(budget)] if isinstance(budget, int | float) else [float(b) for b in budget]
    if not values or not all(0 < b <= 1 for b in values) or len(values) > n:
        raise ValueError(f"method.budget={budget!r} is invalid: one value or at most {n} values in (0, 1]")
    return [values[len(values) * i // n] for i in range(n)]


def body_blocks(model: FlatModel) -> dict[str, list[int]]:
    """Block name -> entry indices (params, then buffers of the same modules): ``body.layerK.J`` for residual
    blocks, else the owning layer; a norm layer joins the block of the layer before it."""
    blocks: dict[str, list[int]] = {}
    owner_block: dict[str, str] = {}
    key: str | None = None
    for i, e in enumerate(model.entries):
        if e.kind != "param" or not e.name.startswith("body."):
            continue
        owner, parts = e.name.rpartition(".")[0], e.name.split(".")
        if parts[1].startswith("layer") and len(parts) > 3:
            key = ".".join(parts[:3])
        elif key is None or not issubclass(e.module_type, NORM_TYPES):
            key = owner
        blocks.setdefault(key, []).append(i)
        owner_block[owner] = key
    for i, e in enumerate(model.entries):
        if e.kind == "buffer" and e.name.rpartition(".")[0] in owner_block:
            blocks[owner_block[e.name.rpartition(".")[0]]].append(i)
    return blocks


def objective(masks: torch.Tensor, sizes: Sequence[int], budgets: Sequence[float]) -> float:
    """J(M) of the official code (see the module docstring)."""
    m, p = masks.double(), torch.tensor(sizes, dtype=torch.float64)
    total, k = p.sum(), m / m.sum(0).clamp_min(1)
    eps = torch.tensor(budgets, dtype=torch.float64) * total - m @ p
    return float((total * k.max(1).values - k @ p + eps).sum())


def masking_vectors(block_sizes: Sequence[int], budgets: Sequence[float]) -> torch.Tensor:
    """Masks [N, B]: greedy fill (least covered block that fits; ties: larger, then first), then local search
    on J over single flips and in-row swaps that keep every budget. A client whose budget fits no block gets
    its smallest block (and is left out of the search)."""
    total, nb = sum(block_sizes), len(block_sizes)
    masks = torch.zeros(len(budgets), nb, dtype=torch.bool)
    coverage, fixed = [0] * nb, set()
    for i, nu in enumerate(budgets):
        room = nu * total + 1e-9
        while fits := [b for b in range(nb) if not masks[i, b] and block_sizes[b] <= room]:
            b = min(fits, key=lambda j: (coverage[j], -block_sizes[j], j))
            masks[i, b], coverage[b], room = True, coverage[b] + 1, room - block_sizes[b]
        if not masks[i].any():
            masks[i, min(range(nb), key=lambda j: block_sizes[j])] = True
            fixed.add(i)
    moves = [[b] for b in range(nb)] + [list(pair) for pair in itertools.combinations(range(nb), 2)]
    best, improved = objective(masks, block_sizes, budgets), True
    while improved:
        improved = False
        for i in (i for i in range(len(budgets)) if i not in fixed):
            for move in moves:
                masks[i, move] = ~masks[i, move]
                used = sum(s for s, on in zip(block_sizes, masks[i].tolist(), strict=True) if on)
                ok = bool(masks[i].any()) and used <= budgets[i] * total + 1e-9
                value = objective(masks, block_sizes, budgets) if ok else math.inf
                if value < best - 1e-9:
                    best, improved = value, True
                else:
                    masks[i, move] = ~masks[i, move]
    return masks


@METHODS.register("perfedmask")
class PerFedMask(Method):
    Hyper = PerFedMaskHyper
    post_finetune = "finetune_epochs"

    def setup(self, init: torch.Tensor) -> None:
        worker, n = self.fed.worker, self.fed.num_clients
        budgets = client_budgets(self.hp.budget, n)
        blocks = list(body_blocks(worker).values())
        sizes = [sum(worker.entries[i].numel for i in idx if worker.entries[i].kind == "param") for idx in blocks]
        block_masks = masking_vectors(sizes, budgets)
        trains = torch.zeros(n, worker.size, dtype=torch.bool)
        for b, idx in enumerate(blocks):
            for i in idx:
                trains[:, worker.entries[i].slice] = block_masks[:, b:b + 1]
        if not self.hp.freeze_head:
            trains[:, worker.mask(lambda e: e.name.startswith("head."))] = True
        self.state["global"] = init
        self.state["trains"] = trains.to(init.device)
        self.state["block_masks"] = block_masks
        self.state["trained_fraction"] = block_masks.double() @ torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        self.state["objective"] = torch.tensor(objective(block_masks, sizes, budgets), dtype=torch.float64)

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["global"]

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        trains = self.state["trains"][task.cid]
        return self.local_sgd(task, model, params=[p for p, where in model.param_views() if bool(trains[where.start])])

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._mean = WeightedMean()

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        # each entry is averaged over the participants that trained it (weight n_k on their masks)
        self._mean.add(model.vector, float(self.fed.train_sizes[task.cid]) * self.state["trains"][task.cid].double())

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["global"] = self._mean.result(self.state["global"].dtype, fallback=self.state["global"])

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        if stage == "pre":
            return model.vector
        model.load(self.state["global"])
        if self.hp.finetune_epochs:
            if self.fed.data is None:
                raise ValueError("PerFedMask fine-tuning needs the federation's data (Federation.data)")
            task = ClientRound(cid, round_, self.fed.data.client(cid),
                               generator(self.fed.seed, "perfedmask", "finetune", round_, cid),
                               self.state["global"], lr)
            self.local_sgd(task, model, epochs=self.hp.finetune_epochs,
                           optim={"optimizer": "sgd", "momentum": self.hp.finetune_momentum,
                                  "weight_decay": self.hp.finetune_weight_decay}, kept_as=None)
        return model.vector

    def metrics(self, round_: int) -> dict[str, float]:
        return {"trained_fraction": float(self.state["trained_fraction"].mean()),
                "mask_objective": float(self.state["objective"])}
