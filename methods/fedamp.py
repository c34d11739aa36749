"""FedAMP (Huang et al., AAAI 2021): attention-inducing personalized cloud models (Huang et al., Sec. 3-4).

Server, over the round's participants and the parameters of their models w_j:
    xi_ij = alpha_k * A'(||w_i - w_j||^2),  A(x) = 1 - exp(-x / sigma),  A'(x) = exp(-x / sigma) / sigma  (j != i)
    xi_ii = 1 - sum_{j != i} xi_ij                                   (every row sums to one)
    u_i   = sum_j xi_ij w_j                                          personalized cloud model
Client i minimizes F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2; the proximal gradient
(lambda / alpha_k)(w - u_i) is added before each step. ``start=own`` continues from the client's own
model (PFLlib's port); ``start=cloud`` starts from u_i. Buffers (BN statistics) stay the client's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.core.batched import StackedBatch
from bench.core.engine import METHODS, ClientRound, Method
from bench.core.flat import FlatModel


@dataclass(frozen=True)
class FedAMPHyper:
    alpha_k: float  # server step alpha_k
    lam: float  # lambda, weight of the attention-inducing proximal term
    sigma: float  # scale of A(x) = 1 - exp(-x / sigma)
    start: str  # own | cloud: where local training starts

    def __post_init__(self) -> None:
        if self.start not in ("own", "cloud"):
            raise ValueError(f"method.start={self.start!r} is invalid: use 'own' or 'cloud'")
        if self.sigma <= 0 or self.alpha_k <= 0:
            raise ValueError("method.sigma and method.alpha_k must be > 0")


def attention_weights(models: torch.Tensor, alpha_k: float, sigma: float) -> torch.Tensor:
    """xi [N, N] from flat parameter vectors [N, P]: off-diagonal alpha_k A'(d^2), rows summing to one."""
    distance = torch.cdist(models.double(), models.double(), compute_mode="donot_use_mm_for_euclid_dist").pow(2)
    xi = alpha_k * torch.exp(-distance / sigma) / sigma
    xi.fill_diagonal_(0.0)
    xi += torch.diag(1.0 - xi.sum(1))
    return xi


@METHODS.register("fedamp")
class FedAMP(Method):
    Hyper = FedAMPHyper
    trains_batched = True

    def setup(self, init: torch.Tensor) -> None:
        self.state["models"] = self.fed.client_table(init)  # w_i
        self.state["clouds"] = self.fed.client_table(init)  # u_i

    def client_model(self, cid: int) -> torch.Tensor:
        if self.hp.start == "cloud":
            return self.state["clouds"][cid]
        return self.state["models"][cid]

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        cloud = self.state["clouds"][task.cid]
        coef = self.hp.lam / self.hp.alpha_k
        for param, where in model.param_views():
            if param.grad is not None:
                param.grad.add_(param.detach() - cloud[where].view_as(param), alpha=coef)

    def before_step_batched(self, batch: StackedBatch) -> None:
        clouds = self.state["clouds"][[t.cid for t in batch.tasks]]
        batch.pull_towards(clouds[:, batch.where], self.hp.lam / self.hp.alpha_k)

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self.state["models"][task.cid] = model.vector

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        params = self.fed.worker.param_mask
        models = self.state["models"][participants]
        xi = attention_weights(models[:, params], self.hp.alpha_k, self.hp.sigma)
        clouds = (xi @ models.double()).to(models.dtype)
        self.state["clouds"][participants] = torch.where(params, clouds, models)
        self._self_weight = float(xi.diagonal().mean())

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        return model.vector if stage == "pre" else self.state["models"][cid]

    def metrics(self, round_: int) -> dict[str, float]:
        return {"self_weight_mean": self._self_weight}
