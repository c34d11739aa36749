"""FedProx (Li et al., 2020): FedAvg whose local objective adds a proximal term.

Local objective: F_k(w) + (mu / 2) ||w - w^t||^2 over the parameters (Li et al., Eq. 2); its gradient
mu (w - w^t) is added to each parameter's gradient before the optimizer step. Aggregation is FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.core.batched import StackedBatch
from bench.core.engine import METHODS, ClientRound
from bench.core.flat import FlatModel
from methods.fedavg import FedAvg


@dataclass(frozen=True)
class FedProxHyper:
    mu: float  # proximal coefficient (FedC2I uses 0.01)


@METHODS.register("fedprox")
class FedProx(FedAvg):
    Hyper = FedProxHyper
    trains_batched = True

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        for param, where in model.param_views():
            if param.grad is not None:
                param.grad.add_(param.detach() - task.start[where].view_as(param), alpha=self.hp.mu)

    def before_step_batched(self, batch: StackedBatch) -> None:
        batch.pull_towards(batch.starts, self.hp.mu)
