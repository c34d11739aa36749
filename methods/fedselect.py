"""FedSelect (Tamirisa et al., "FedSelect: Customized Selection of Parameters for Fine-Tuning during
Personalized Federated Learning", ICML 2023 workshop, arXiv 2306.13264). Readings: docs/methods/fedselect.md.

Partial personalization theta_k = (u, v_k) (Eq. 2) in which the split is a per-entry mask m_k (1 = personal,
"LTN" entry; 0 = shared), found anew every round. For participant k in round t, with theta_0 := theta_k^{t-1}:

GradLTN(theta_0, L, r = 1 - p)   (Alg. 1, Sec. 2.3.1)
  i = 0       m_0 = all ones; train E epochs from theta_0
  i = 1..L    gamma = |theta_{i-1} - theta_0| (.) m_{i-1}       the change made by the previous iteration
              m_i   = the largest p of gamma among m_{i-1}        each iteration freezes (1 - p) of what is left
              theta <- theta_0                                   rewind ("reinitialize model")
              train E epochs with g (.) m_i                      only m_i moves
  return u = theta_0 (.) not m_L, v = theta_0 (.) m_L, m_L       only the mask is kept from the search
LocalAlt(u, v)   (Sec. 2.3.2, after Pillutla et al. 2022): 5 epochs, each a pass over v then a pass over u
Server   (Alg. 2)
  theta_G^t[e] = mean of u_k^{t+}[e] over the participants with m_k[e] = 0 ("non-LTN parameters";
                 Sec. 2.3.2: "averaging ... only occurs across parameters for which ... m_k is 0");
                 an entry no participant shares keeps theta_G^{t-1}[e]
  participant i: theta_i^t (.) not m_i <- theta_G^t,  theta_i^t (.) m_i <- v_i^{t+}

The paper leaves open: the mask fraction (Sec. 2.3.2: "(1-p) x 100% parameters are frozen during each of
GradLTN's iterations"; ``fraction``), per-tensor or global ranking (``ranking``), which tensors are maskable
(``maskable``), the LocalAlt epoch (``alt_schedule``), the averaging weights (``weighting``), BatchNorm
statistics (``bn_stats``) and what a client outside the round receives (``unsampled``; Alg. 2 writes
theta_G into its m_G entries). ``ltn_return=last`` returns theta_L instead of theta_0 (Sec. 2.3.2, future work).

:class:`MaskedPersonalization` is the server side shared with FedSelect-CVPR (``fedselect_cvpr.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from bench.core.aggregate import WeightedMean
from bench.core.engine import METHODS, ClientRound, Federation
from bench.core.flat import FlatModel
from methods._masked import (
    ALT_SCHEDULES,
    MASKABLE,
    RANKINGS,
    MaskedTraining,
    check_choice,
    maskable,
    ranking_groups,
    select_top,
)

CHOICES = {
    "alt_schedule": ALT_SCHEDULES,
    "weighting": ("uniform", "samples"),
    "bn_stats": ("local", "shared"),
    "unsampled": ("shared", "written", "none"),
}


@dataclass(frozen=True)
class MaskedHyper:
    maskable: str  # weights: conv, norm and fc weights (biases always shared) | dense: conv/fc weights | all
    ranking: str  # per_tensor | global: where the top fraction of a score is taken
    alt_epochs: int  # LocalAlt epochs
    alt_schedule: str  # interleaved: epochs x (v pass, u pass) | blocked: epochs v passes, then epochs u passes
    weighting: str  # uniform (official code) | samples (n_k) in the masked average
    bn_stats: str  # local: running statistics never averaged (official code) | shared: averaged by everyone
    unsampled: str  # a client outside the round takes theta_G on: shared (its own shared entries) |
    #                 written (Alg. 2 as written: the m_G entries) | none

    def __post_init__(self) -> None:
        for key, allowed in CHOICES.items():
            check_choice(key, getattr(self, key), allowed)
        check_choice("maskable", self.maskable, MASKABLE)
        check_choice("ranking", self.ranking, RANKINGS)
        if self.alt_epochs < 0:
            raise ValueError(f"method.alt_epochs={self.alt_epochs} is invalid: it must be >= 0")


def final_linear_weight(model: FlatModel) -> torch.Tensor:
    """Mask of the final linear layer's weight: ``head.weight`` in the zoo, else the last 2-d weight."""
    dense = [e for e in model.entries if e.kind == "param" and len(e.shape) == 2]
    names = {e.name for e in model.entries}
    return model.mask_of(["head.weight"] if "head.weight" in names else [dense[-1].name])


def mask_iou(masks: torch.Tensor) -> torch.Tensor:
    """Intersection over union of every pair of rows of ``masks`` [M, D] (bool) -> [M, M]; two empty masks
    count as identical (1)."""
    m = masks.double()
    inter = m @ m.T
    union = m.sum(1)[:, None] + m.sum(1)[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(inter))


class MaskedPersonalization(MaskedTraining):
    """Server side of FedSelect: every client's model ``models`` [N, D] and personal mask ``masks`` [N, D]
    (True = personal); the shared entries are averaged entry by entry over the participants sharing them
    (``global`` [D] holds that average), then written back into each participant's shared entries.

    A subclass's ``train_client`` sets ``masks[cid]`` to the mask of the round before training ends."""

    def __init__(self, fed: Federation, hp: Any) -> None:
        super().__init__(fed, hp)
        worker = fed.worker
        self.selectable = maskable(worker, hp.maskable)
        self.groups = ranking_groups(worker, self.selectable, hp.ranking)
        # entries the server may average: parameters, plus the BN statistics if they are shared
        self.averaged = worker.param_mask if hp.bn_stats == "local" else torch.ones_like(worker.param_mask)
        self.head_weight = final_linear_weight(worker)

    def setup(self, init: torch.Tensor) -> None:
        n = self.fed.num_clients
        self.state["global"] = init.clone()
        self.state["models"] = init.repeat(n, 1)
        self.state["masks"] = torch.zeros(n, init.numel(), dtype=torch.bool, device=init.device)

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["models"][cid]

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._mean = WeightedMean()
        self._shared: dict[int, torch.Tensor] = {}

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        shared = self.averaged & ~self.state["masks"][task.cid]
        weight = 1.0 if self.hp.weighting == "uniform" else float(self.fed.train_sizes[task.cid])
        self._mean.add(model.vector, weight * shared.double())
        self._shared[task.cid] = shared
        self.state["models"][task.cid] = model.vector

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        models, masks = self.state["models"], self.state["masks"]
        theta_g = self._mean.result(models.dtype, fallback=self.state["global"])
        self.state["global"] = theta_g
        for cid in participants:
            models[cid] = torch.where(self._shared[cid], theta_g, models[cid])
        absent = [c for c in range(self.fed.num_clients) if c not in set(participants)]
        if absent and self.hp.unsampled != "none":
            written = masks[list(participants)].any(0)  # m_G: the OR of the participants' masks
            for cid in absent:
                where = self.averaged & ~masks[cid] if self.hp.unsampled == "shared" else written
                models[cid] = torch.where(where, theta_g, models[cid])

    def metrics(self, round_: int) -> dict[str, Any]:
        """The personal fraction of the maskable entries (mean, min, max over the participants) and the
        intersection-over-union of every pair of participants' masks on the final linear layer's weight
        (Fig. 1; ``head_mask_iou`` [M][M] over ``head_mask_clients``)."""
        size, masks = int(self.selectable.sum()), self.state["masks"]
        clients = sorted(self._shared)
        active = [int((masks[c] & self.selectable).sum()) / max(size, 1) for c in clients]
        return {"personal_fraction": sum(active) / len(active), "personal_fraction_min": min(active),
                "personal_fraction_max": max(active), "head_mask_clients": clients,
                "head_mask_iou": mask_iou(masks[clients][:, self.head_weight]).tolist()}


@dataclass(frozen=True)
class FedSelectHyper(MaskedHyper):
    p: float  # personalization rate: each GradLTN iteration keeps the largest p of the remaining entries
    ltn_iters: int  # L, GradLTN pruning iterations
    ltn_epochs: int  # E, epochs of every GradLTN iteration
    fraction: str  # compounding: p of the still-trainable entries (|m_L| ~ p^L) | fixed: p of the whole tensor
    ltn_return: str  # start: theta_0 (Alg. 1) | last: theta_L (Sec. 2.3.2, future work)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("fraction", self.fraction, ("compounding", "fixed"))
        check_choice("ltn_return", self.ltn_return, ("start", "last"))
        if not 0.0 < self.p <= 1.0:
            raise ValueError(f"method.p={self.p} is invalid: it must be in (0, 1]")
        if self.ltn_iters < 1 or self.ltn_epochs < 1:
            raise ValueError(f"method.ltn_iters={self.ltn_iters} and method.ltn_epochs={self.ltn_epochs} must be >= 1")


@METHODS.register("fedselect")
class FedSelect(MaskedPersonalization):
    Hyper = FedSelectHyper

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        mask = self.grad_ltn(task, model)
        self.state["masks"][task.cid] = mask
        return self.local_alt(task, model, mask, self.hp.alt_epochs, self.hp.alt_schedule)

    def grad_ltn(self, task: ClientRound, model: FlatModel) -> torch.Tensor:
        """Alg. 1 on the worker (which holds theta_0); returns m_L and leaves theta_0 in the worker (theta_L
        with ``ltn_return=last``). Iteration L's training only matters for theta_L, so it runs only then."""
        hp, theta_0 = self.hp, model.read()
        mask = model.param_mask  # m_0: every parameter
        for i in range(hp.ltn_iters + 1):
            if i > 0:
                gamma = (model.vector - theta_0).abs()
                mask = select_top(gamma, mask & self.selectable, self.groups, hp.p, hp.fraction == "compounding")
                model.load(theta_0)
            if i < hp.ltn_iters or hp.ltn_return == "last":
                self.masked_sgd(task, model, mask, hp.ltn_epochs)
        return mask
