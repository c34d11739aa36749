"""Toy methods that exercise the engine's architecture hooks (``imports=[tests.toy_methods]``):

- ``toy_widths``: HeteroFL-style training of one full model by clients of different widths (prefix slices,
  or FedRolex-style rolling windows), aggregated by the scattered weighted mean;
- ``toy_server``: a client model extended with a second head, and a server-side module with its own
  optimizer (Adam) that is checkpointed with the method's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.aggregate import WeightedMean
from bench.core.engine import METHODS, ClientRound, Federation, Method
from bench.core.flat import FlatModel
from common.seeding import derive_seed
from methods.fedavg import FedAvg


@dataclass(frozen=True)
class ToyWidthsHyper:
    widths: tuple[float, ...] = (1.0,)  # client c has width widths[c % len(widths)]
    rolling: bool = False  # FedRolex-style window moving by one channel per round


@METHODS.register("toy_widths")
class ToyWidths(Method):
    Hyper = ToyWidthsHyper

    def width(self, cid: int) -> float:
        return float(self.hp.widths[cid % len(self.hp.widths)])

    def positions(self, cid: int, round_: int) -> torch.Tensor:
        worker = self.fed.worker_for(self.width(cid))
        return worker.positions_in(self.fed.worker, roll=round_ if self.hp.rolling else 0)

    def setup(self, init: torch.Tensor) -> None:
        self.state["global"] = init
        self.state["round"] = 0

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self.state["round"] = round_
        self._mean = WeightedMean()

    def client_worker(self, cid: int, stage: str) -> FlatModel:
        return self.fed.worker_for(self.width(cid))

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["global"][self.positions(cid, self.state["round"])]

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self._mean.add(model.vector, float(self.fed.train_sizes[task.cid]), index=self.positions(task.cid, task.round),
                       size=self.fed.size)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["global"] = self._mean.result(self.state["global"].dtype, fallback=self.state["global"])


class TwoHeads(nn.Module):
    """The zoo's model plus a second head on the same features; predictions add both heads' logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.body, self.head = model.body, model.head
        self.aux = nn.Linear(model.feature_dim, model.head.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.body(x)
        return self.head(features) + self.aux(features)


@dataclass(frozen=True)
class ToyServerHyper:
    server_lr: float = 0.01


@METHODS.register("toy_server")
class ToyServer(FedAvg):
    """FedAvg of the two-headed model; the server also fits a tiny module (a scalar gate, Adam) to the mean
    training loss of each round, so its parameters and optimizer state change every round."""

    Hyper = ToyServerHyper

    def __init__(self, fed: Federation, hp: Any) -> None:
        super().__init__(fed, hp)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(fed.seed, "toy_server"))
            gate = nn.Linear(1, 1)
        self.state["server"] = {"gate": gate, "opt": torch.optim.Adam(gate.parameters(), lr=hp.server_lr)}

    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        return TwoHeads(model)

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        super().begin_round(round_, participants)
        self._losses: list[float] = []

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        loss = self.local_sgd(task, model)
        self._losses.append(loss)
        return loss

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        super().aggregate(round_, participants)
        gate, opt = self.state["server"]["gate"], self.state["server"]["opt"]
        target = torch.tensor([[sum(self._losses) / len(self._losses)]])
        opt.zero_grad()
        F.mse_loss(gate(torch.ones(1, 1)), target).backward()
        opt.step()

    def metrics(self, round_: int) -> dict[str, float]:
        return {"gate_weight": float(self.state["server"]["gate"].weight.detach())}
