"""FedAMP (Huang et al., AAAI 2021): attention-inducing personalized cloud models (Huang et al., Sec. 3-5).

Server, over the round's participants and the parameters of their models w_j, one of two attention forms:
  distance (Sec. 3, Eq. of the cloud model; Fling's FedAMP):
    xi_ij = alpha_k * A'(||w_i - w_j||^2),  A(x) = 1 - exp(-x / sigma),  A'(x) = exp(-x / sigma) / sigma  (j != i)
    xi_ii = 1 - sum_{j != i} xi_ij                                   (every row sums to one)
  cosine (HeurFedAMP, Sec. 5; FLGo's default): a fixed self-weight xi_ii, the rest shared by a softmax
    xi_ij = (1 - xi_ii) exp(cos_scale cos(w_i, w_j)) / sum_{h != i} exp(cos_scale cos(w_i, w_h))
u_i = sum_j xi_ij w_j is client i's personalized cloud model. Client i minimizes F_i(w) + lambda / (2 alpha_k)
||w - u_i||^2; the proximal gradient (lambda / alpha_k)(w - u_i) is added before each step. alpha_k is multiplied
by ``alpha_decay`` after every ``decay_every`` rounds (Fling, FLGo: 0.1 every 30). ``start=own`` continues from the
client's own model (PFLlib's port); ``start=cloud`` starts from u_i (Fling, FLGo). Buffers (BN statistics) stay the
client's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.core.batched import StackedBatch
from bench.core.engine import METHODS, ClientRound, Method
from bench.core.flat import FlatModel


@dataclass(frozen=True)
class FedAMPHyper:
    alpha_k: float  # server step alpha_k (also divides lambda in the client's proximal term)
    lam: float  # lambda, weight of the attention-inducing proximal term
    sigma: float  # distance form: scale of A(x) = 1 - exp(-x / sigma)
    start: str  # own | cloud: where local training starts
    attention: str = "distance"  # distance (Sec. 3) | cosine (HeurFedAMP, Sec. 5)
    alpha_decay: float = 1.0  # alpha_k *= alpha_decay after every decay_every rounds
    decay_every: int = 0  # rounds between decays of alpha_k (0 = never)
    cos_scale: float = 25.0  # cosine form: the softmax's scale on cos(w_i, w_j)
    self_weight: float | None = None  # cosine form: xi_ii (None = 1 / participants, FLGo)

    def __post_init__(self) -> None:
        if self.start not in ("own", "cloud"):
            raise ValueError(f"method.start={self.start!r} is invalid: use 'own' or 'cloud'")
        if self.attention not in ("distance", "cosine"):
            raise ValueError(f"method.attention={self.attention!r} is invalid: use 'distance' or 'cosine'")
        if self.sigma <= 0 or self.alpha_k <= 0:
            raise ValueError("method.sigma and method.alpha_k must be > 0")
        if not 0 < self.alpha_decay <= 1 or self.decay_every < 0:
            raise ValueError(f"method.alpha_decay={self.alpha_decay} must be in (0, 1] and method.decay_every="
                             f"{self.decay_every} >= 0 (0 = never)")
        if self.self_weight is not None and not 0 <= self.self_weight <= 1:
            raise ValueError(f"method.self_weight={self.self_weight} is invalid: use a value in [0, 1] or null")


def attention_weights(models: torch.Tensor, alpha_k: float, sigma: float) -> torch.Tensor:
    """xi [N, N] of the distance form from flat parameter vectors [N, P]: off-diagonal alpha_k A'(d^2), rows
    summing to one."""
    distance = torch.cdist(models.double(), models.double(), compute_mode="donot_use_mm_for_euclid_dist").pow(2)
    xi = alpha_k * torch.exp(-distance / sigma) / sigma
    xi.fill_diagonal_(0.0)
    xi += torch.diag(1.0 - xi.sum(1))
    return xi


def cosine_attention_weights(models: torch.Tensor, cos_scale: float, self_weight: float) -> torch.Tensor:
    """xi [N, N] of HeurFedAMP: xi_ii = self_weight, the rest a softmax of cos_scale * cos(w_i, w_j) over j != i."""
    unit = torch.nn.functional.normalize(models.double(), dim=1)
    logits = cos_scale * (unit @ unit.T)
    logits.fill_diagonal_(float("-inf"))
    xi = (1.0 - self_weight) * torch.softmax(logits, dim=1)
    return xi + torch.diag(torch.full((len(models),), self_weight, dtype=xi.dtype))


def attention_spread(xi: torch.Tensor, participants: Sequence[int]) -> dict[str, Any]:
    """The round's attention as a spread: mean self-weight, the off-diagonal min / median / max, the mean share
    of a client's off-diagonal weight that goes to its top partner (1 / (M - 1) when the attention is uniform,
    0 when nobody gets any), and each participant's top partner (client ids, in ``participants``' order)."""
    n = len(xi)
    spread: dict[str, Any] = {"self_weight_mean": float(xi.diagonal().mean())}
    if n < 2:
        return spread
    off = xi.masked_fill(torch.eye(n, dtype=torch.bool), float("-inf"))
    top, partner = off.max(1)
    values = xi[~torch.eye(n, dtype=torch.bool)]
    mass = xi.sum(1) - xi.diagonal()
    share = torch.where(mass > 0, top / mass.clamp_min(1e-300), torch.zeros_like(mass))
    spread.update({"xi_offdiag_min": float(values.min()), "xi_offdiag_median": float(values.median()),
                   "xi_offdiag_max": float(values.max()), "xi_top_share": float(share.mean()),
                   "xi_top_partner": [int(participants[j]) for j in partner.tolist()]})
    return spread


@METHODS.register("fedamp")
class FedAMP(Method):
    Hyper = FedAMPHyper
    trains_batched = True

    def setup(self, init: torch.Tensor) -> None:
        self.state["models"] = self.fed.client_table(init)  # w_i
        self.state["clouds"] = self.fed.client_table(init)  # u_i

    def alpha(self, round_: int) -> float:
        """alpha_k in round ``round_`` (1-based): decayed after every ``decay_every`` finished rounds."""
        decays = (round_ - 1) // self.hp.decay_every if self.hp.decay_every else 0
        return self.hp.alpha_k * self.hp.alpha_decay ** decays

    def client_model(self, cid: int) -> torch.Tensor:
        if self.hp.start == "cloud":
            return self.state["clouds"][cid]
        return self.state["models"][cid]

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        cloud = self.state["clouds"][task.cid]
        coef = self.hp.lam / self.alpha(task.round)
        for param, where in model.param_views():
            if param.grad is not None:
                param.grad.add_(param.detach() - cloud[where].view_as(param), alpha=coef)

    def before_step_batched(self, batch: StackedBatch) -> None:
        clouds = self.state["clouds"][[t.cid for t in batch.tasks]]
        batch.pull_towards(clouds[:, batch.where], self.hp.lam / self.alpha(batch.tasks[0].round))

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self.state["models"][task.cid] = model.vector

    def weights(self, round_: int, models: torch.Tensor) -> torch.Tensor:
        """xi [M, M] over the round's participants from their flat parameter vectors [M, P]."""
        if self.hp.attention == "cosine":
            own = self.hp.self_weight if self.hp.self_weight is not None else 1.0 / len(models)
            return cosine_attention_weights(models, self.hp.cos_scale, own)
        return attention_weights(models, self.alpha(round_), self.hp.sigma)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        params = self.fed.worker.param_mask
        models = self.state["models"][participants]
        xi = self.weights(round_, models[:, params])
        clouds = (xi @ models.double()).to(models.dtype)
        self.state["clouds"][participants] = torch.where(params, clouds, models)
        self._spread = attention_spread(xi, participants)

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        return model.vector if stage == "pre" else self.state["models"][cid]

    def metrics(self, round_: int) -> dict[str, Any]:
        return dict(self._spread)
