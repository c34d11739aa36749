"""PerFedMask (Setayesh, Li, Wong, ICLR 2023): masked training of body blocks under per-client compute budgets,
masked aggregation, and local fine-tuning before evaluation. Algorithm notes: docs/methods/perfedmask.md.

1. The body is cut into blocks b with P_b parameters (stem, each residual block, each conv/FC layer).
2. Masking vectors M_i in {0,1}^B (one per client) fill client i's budget nu_i * sum_b P_b while keeping every
   block's coverage balanced (paper Sec. 4; the official code solves it with SCA + MOSEK; here a greedy fill
   that always picks the least-covered block that still fits; nu = 1 gives all-ones masks).
3. Client i trains only the blocks with M_ib = 1; the head is frozen during federated training.
4. Server: every entry is averaged over the round's participants that trained it (masked aggregation);
   entries nobody trained keep their value.
5. Evaluation ('post'): the global model fine-tuned on the client's training data for ``finetune_epochs``
   (all parameters, SGD with momentum and weight decay as in the official code); 'pre' is before fine-tuning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.engine import METHODS, ClientRound, Method
from bench.flat import FlatModel
from bench.seeding import generator


@dataclass(frozen=True)
class PerFedMaskHyper:
    budget: float | list  # nu: fraction of the body each client can train (one value, or one per client)
    freeze_head: bool  # the head is not trained during federated rounds (official code: lr 0 on the head)
    finetune_epochs: int  # local fine-tuning epochs before evaluation
    finetune_momentum: float
    finetune_weight_decay: float


def body_blocks(model: FlatModel) -> dict[str, list[int]]:
    """Block name -> indices of its parameter entries: ``body.layerK.J`` for residual blocks, else ``body.<child>``."""
    blocks: dict[str, list[int]] = {}
    for i, e in enumerate(model.entries):
        if e.kind != "param" or not e.name.startswith("body."):
            continue
        parts = e.name.split(".")
        key = ".".join(parts[:3]) if parts[1].startswith("layer") else ".".join(parts[:2])
        blocks.setdefault(key, []).append(i)
    return blocks


def masking_vectors(block_sizes: Sequence[int], budgets: Sequence[float]) -> torch.Tensor:
    """Greedy masks [N, B]: each client repeatedly takes the least-covered block (ties: larger, then first)
    that still fits in budget * total; every client gets at least its smallest affordable block."""
    total = sum(block_sizes)
    coverage = [0] * len(block_sizes)
    masks = torch.zeros(len(budgets), len(block_sizes), dtype=torch.bool)
    for i, nu in enumerate(budgets):
        room = nu * total + 1e-9
        while True:
            fits = [b for b in range(len(block_sizes)) if not masks[i, b] and block_sizes[b] <= room]
            if not fits:
                break
            b = min(fits, key=lambda j: (coverage[j], -block_sizes[j], j))
            masks[i, b] = True
            coverage[b] += 1
            room -= block_sizes[b]
        if not masks[i].any():
            masks[i, min(range(len(block_sizes)), key=lambda j: block_sizes[j])] = True
    return masks


@METHODS.register("perfedmask")
class PerFedMask(Method):
    Hyper = PerFedMaskHyper

    def setup(self, init: torch.Tensor) -> None:
        worker, n = self.fed.worker, self.fed.num_clients
        budgets = self.hp.budget if isinstance(self.hp.budget, list) else [self.hp.budget] * n
        if len(budgets) != n or not all(0 < b <= 1 for b in budgets):
            raise ValueError(f"method.budget={self.hp.budget!r} is invalid: one value or {n} values in (0, 1]")
        blocks = body_blocks(worker)
        sizes = [sum(worker.entries[i].numel for i in idx) for idx in blocks.values()]
        block_masks = masking_vectors(sizes, budgets)
        trains = torch.zeros(n, worker.size, dtype=torch.bool)
        for b, idx in enumerate(blocks.values()):
            for i in idx:
                trains[:, worker.entries[i].slice] = block_masks[:, b:b + 1]
        if not self.hp.freeze_head:
            trains[:, worker.mask(lambda e: e.name.startswith("head."))] = True
        # floating buffers (BN statistics) follow the parameters of their module
        for e in worker.entries:
            if e.kind == "buffer":
                owner = e.name.rpartition(".")[0]
                same = [p for p in worker.entries if p.kind == "param" and p.name.rpartition(".")[0] == owner]
                if same:
                    trains[:, e.slice] = trains[:, same[0].offset:same[0].offset + 1]
        self.state["global"] = init
        self.state["trains"] = trains.to(init.device)
        self.state["block_masks"] = block_masks

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["global"]

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        trains = self.state["trains"][task.cid]
        params = [p for p, where in model.param_views() if bool(trains[where.start])]
        return self.local_sgd(task, model, params=params)

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._sum = torch.zeros_like(self.state["global"], dtype=torch.float64)
        self._weight = torch.zeros_like(self._sum)

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        w = float(self.fed.train_sizes[task.cid]) * self.state["trains"][task.cid].double()
        self._sum += w * model.vector.double()
        self._weight += w

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        trained = self._weight > 0
        new = self.state["global"].clone()
        new[trained] = (self._sum[trained] / self._weight[trained]).to(new.dtype)
        self.state["global"] = new

    def eval_model(self, cid: int, stage: str, model: FlatModel) -> torch.Tensor:
        if stage == "pre":
            return model.vector
        model.load(self.state["global"])
        if self.hp.finetune_epochs and self.fed.data is not None:
            task = ClientRound(cid, 0, self.fed.data.client(cid), generator(self.fed.seed, "finetune", cid),
                               self.state["global"], float(self.fed.train["lr"]))
            self.local_sgd(task, model, epochs=self.hp.finetune_epochs,
                           optim={"optimizer": "sgd", "momentum": self.hp.finetune_momentum,
                                  "weight_decay": self.hp.finetune_weight_decay})
        return model.vector

    def metrics(self, round_: int) -> dict[str, float]:
        return {"trained_fraction": float(self.state["block_masks"].float().mean())}
