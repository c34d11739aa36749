"""Shared pieces of the methods that train, keep or prune entry-wise masks of the flat model.

Used by FedSelect and FedSelect-CVPR (``fedselect.py``, ``fedselect_cvpr.py``), LotteryFL (``lotteryfl.py``),
FedAlt (``fedalt.py``) and FedBABU (``fedbabu.py``):

- :func:`maskable`: which entries a mask may select (weights, dense weights, or every parameter);
- :func:`ranking_groups` / :func:`select_top`: the top fraction of a score, per tensor or over all of them;
- :class:`MaskedTraining`: a gradient step that moves only the entries of a mask (:meth:`~MaskedTraining.masked_sgd`),
  and LocalAlt (Pillutla et al., 2022), alternating full passes over the personal and the shared entries;
- :func:`finetune`: evaluation-time fine-tuning of a client's model on its training data.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from bench.core.engine import ClientRound, Method
from bench.core.flat import FlatModel
from common.seeding import generator

MASKABLE = ("weights", "dense", "all")
RANKINGS = ("per_tensor", "global")
ALT_SCHEDULES = ("interleaved", "blocked")


def check_choice(key: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"method.{key}={value!r} is invalid: use one of {list(allowed)}")


def maskable(model: FlatModel, kind: str) -> torch.Tensor:
    """Entries a mask may select: ``weights`` = parameters named ``*.weight`` (conv, norm and linear
    weights; biases never), ``dense`` = weights of two or more dimensions (conv and linear), ``all`` = every
    parameter. Buffers (BatchNorm statistics) never are."""
    check_choice("maskable", kind, MASKABLE)
    weight = lambda e: e.name.rpartition(".")[2] == "weight"  # noqa: E731
    rules = {"weights": weight, "dense": lambda e: weight(e) and len(e.shape) >= 2, "all": lambda e: True}
    return model.mask(lambda e: e.kind == "param" and rules[kind](e))


def ranking_groups(model: FlatModel, selectable: torch.Tensor, ranking: str) -> list[torch.Tensor]:
    """Positions ranked together: one group per tensor with selectable entries (``per_tensor``), or all
    selectable positions as one group (``global``)."""
    check_choice("ranking", ranking, RANKINGS)
    if ranking == "global":
        return [model.index(selectable)]
    groups = []
    for e in model.entries:
        positions = model.index(selectable[e.slice]) + e.offset
        if positions.numel():
            groups.append(positions)
    return groups


def top_count(fraction: float, n: int) -> int:
    """round(fraction * n), halves rounded up: how many of ``n`` entries a fraction selects."""
    return math.floor(fraction * n + 0.5 + 1e-9)


def select_top(score: torch.Tensor, candidates: torch.Tensor, groups: Iterable[torch.Tensor], fraction: float,
               of_remaining: bool = True) -> torch.Tensor:
    """Mask of the highest-scoring candidates of every group: ``top_count(fraction, n)`` of them, where ``n``
    counts the group's candidates (``of_remaining``) or the whole group (capped at its candidates). Ties go
    to the lower position (a stable sort), so the selection is deterministic."""
    out = torch.zeros_like(candidates)
    for group in groups:
        live = group[candidates[group]]
        k = min(top_count(fraction, live.numel() if of_remaining else group.numel()), live.numel())
        if k:
            order = torch.sort(score[live], descending=True, stable=True).indices
            out[live[order[:k]]] = True
    return out


def params_touching(model: FlatModel, mask: torch.Tensor) -> list[nn.Parameter]:
    """The parameters with at least one entry in ``mask``."""
    return [p for p, where in model.param_views() if bool(mask[where].any())]


class MaskedTraining(Method):
    """Adds :meth:`masked_sgd` and :meth:`local_alt` to a method.

    A masked step multiplies every gradient by the mask in :meth:`before_step`. The run's weight decay is
    added to the gradient there too, before the mask, and the optimizer gets none: SGD (with momentum or
    Nesterov) and Adam add the L2 term to the gradient themselves, so the masked entries follow exactly the
    unmasked rule, while an entry outside the mask sees a zero gradient, a zero momentum buffer and no decay,
    and does not move at all."""

    _grad_mask: torch.Tensor | None = None  # set only while masked_sgd runs
    _decay: float = 0.0

    def masked_sgd(self, task: ClientRound, model: FlatModel, mask: torch.Tensor, epochs: int | None = None) -> float:
        """``local_sgd`` for ``epochs`` that moves only the entries of ``mask``; returns the mean batch loss
        (nan if the mask holds no parameter: nothing is trained)."""
        params = params_touching(model, mask)
        if not params:
            return math.nan
        weight_decay = float(self.fed.train.get("weight_decay", 0.0))
        self._grad_mask, self._decay = mask, weight_decay
        try:
            return self.local_sgd(task, model, epochs=epochs, params=params, optim={"weight_decay": 0.0})
        finally:
            self._grad_mask = None

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        if self._grad_mask is None:
            return
        for param, where in model.param_views():
            if param.grad is not None:
                if self._decay:
                    param.grad.add_(param.detach(), alpha=self._decay)
                param.grad.mul_(self._grad_mask[where].view_as(param.grad))

    def local_alt(self, task: ClientRound, model: FlatModel, personal: torch.Tensor, epochs: int,
                  schedule: str = "interleaved") -> float:
        """LocalAlt: a full pass over the personal parameter entries v (the shared u fixed), then one over the
        shared entries u (v fixed). ``interleaved``: ``epochs`` times (v pass, u pass); ``blocked``: ``epochs``
        v passes, then ``epochs`` u passes. Returns the mean loss of the passes that trained something."""
        check_choice("alt_schedule", schedule, ALT_SCHEDULES)
        params = model.param_mask
        v, u = personal & params, ~personal & params
        passes = [(v, 1), (u, 1)] * epochs if schedule == "interleaved" else [(v, epochs), (u, epochs)]
        losses = [self.masked_sgd(task, model, mask, n) for mask, n in passes if n]
        losses = [x for x in losses if not math.isnan(x)]
        return sum(losses) / len(losses) if losses else math.nan


def finetune(method: Method, cid: int, model: FlatModel, start: torch.Tensor, round_: int, lr: float, epochs: int,
             params: Sequence[nn.Parameter] | None = None, tag: str = "method") -> torch.Tensor:
    """Load ``start`` into ``model`` and train ``params`` (default: all) on client ``cid``'s training data for
    ``epochs`` with the run's optimizer at ``lr``; batches come from ``(seed, tag, "finetune", round, client)``, so
    evaluation never disturbs training randomness. Returns the fine-tuned vector (the worker's)."""
    model.load(start)
    if epochs:
        if method.fed.data is None:
            raise ValueError("evaluation-time fine-tuning needs the federation's data (Federation.data)")
        batches = generator(method.fed.seed, tag, "finetune", round_, cid)
        task = ClientRound(cid, round_, method.fed.data.client(cid), batches, start, lr)
        method.local_sgd(task, model, epochs=epochs, params=params, kept_as=None)  # no state across evaluations
    return model.vector
