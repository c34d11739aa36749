"""FedSelect, CVPR 2024 version (Tamirisa et al., arXiv 2404.02478; official code lapisrocks/fedselect), the
algorithm the official repository runs. Readings: docs/methods/fedselect.md.

Unlike the workshop algorithm (``fedselect.py``) there is no per-round search with rewinding: the personal
masks start empty (everything shared) and only grow.

- Every round each participant runs LocalAlt on its current mask (``alt_epochs``, each a pass over the
  personal entries v, then one over the shared entries u); the server averages the shared entries entry by
  entry and writes the average back (as in ``fedselect.py``, BN statistics local).
- In rounds t = 1 + j * ``grow_every`` (j >= 1; the code's 0-based ``round % lth_epoch_iters == 0``, not
  round 0), after training, each participant grows its mask for the next round: in every tensor whose
  personal fraction is still <= ``target``, the largest ``grow_rate`` of the shared entries, ranked by
  |theta_now - theta at the previous growth (the initial model the first time)|, become personal. A tensor
  may overshoot the target by one step, then it stops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from bench.core.engine import METHODS, ClientRound
from bench.core.flat import FlatModel
from methods._masked import select_top
from methods.fedselect import MaskedHyper, MaskedPersonalization


@dataclass(frozen=True)
class FedSelectCVPRHyper(MaskedHyper):
    grow_every: int  # lth_epoch_iters: rounds between mask growths
    grow_rate: float  # prune_percent / 100: fraction of a tensor's shared entries made personal per growth
    target: float  # prune_target / 100: a tensor whose personal fraction exceeds it stops growing

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grow_every < 1 or not 0.0 <= self.grow_rate <= 1.0 or not 0.0 <= self.target <= 1.0:
            raise ValueError(f"method.grow_every={self.grow_every} must be >= 1, method.grow_rate={self.grow_rate} "
                             f"and method.target={self.target} in [0, 1]")


def is_growth_round(round_: int, every: int) -> bool:
    """Rounds (1-based) after whose training the masks grow: 1 + every, 1 + 2 every, ..."""
    return round_ > 1 and (round_ - 1) % every == 0


def grow(mask: torch.Tensor, score: torch.Tensor, groups: Iterable[torch.Tensor], rate: float,
         target: float) -> torch.Tensor:
    """``mask`` plus, in every group whose personal fraction is <= ``target``, the top ``rate`` of its
    still-shared entries by ``score``."""
    groups = list(groups)
    open_ = torch.zeros_like(mask)
    for group in groups:
        if int(mask[group].sum()) <= target * group.numel() + 1e-9:
            open_[group] = True
    return mask | select_top(score, open_ & ~mask, groups, rate)


@METHODS.register("fedselect_cvpr")
class FedSelectCVPR(MaskedPersonalization):
    Hyper = FedSelectCVPRHyper

    def setup(self, init: torch.Tensor) -> None:
        super().setup(init)
        self.state["anchor"] = self.fed.client_table(init)  # theta at each client's last growth

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        return self.local_alt(task, model, self.state["masks"][task.cid], self.hp.alt_epochs, self.hp.alt_schedule)

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        super().upload(task, model)  # averaged with the mask the round trained with
        if is_growth_round(task.round, self.hp.grow_every):
            cid, anchor = task.cid, self.state["anchor"]
            delta = (model.vector - anchor[cid]).abs()
            self.state["masks"][cid] = grow(self.state["masks"][cid], delta, self.groups, self.hp.grow_rate,
                                            self.hp.target)
            anchor[cid] = model.vector
