"""FedRolex (Alam, Liu, Yan, Zhang, NeurIPS 2022): HeteroFL with a rolling sub-model window (Sec. 3).

In round t a client of width p keeps, in every hidden layer of C channels, the channels
{(t + j) mod C : j < ceil(pC)}: the window advances by one channel per round and wraps round, so every
channel of the global model is trained about equally often (``FlatModel.positions_in(full, roll=t)``). The
input channels and the head's classes are never pruned (the zoo never scales them; checked at setup). Every
entry is averaged over the participants holding it (n_k-weighted). No label masking by default (our reading of
the paper); ``label_mask`` is HeteroFL's masking, which the official code keeps (its models mask absent labels'
logits, its server averages each head row over the label's owners). Scaler and static BN as in the official
code, which builds on HeteroFL's (methods/_nested.py). Widths: the largest multiple of 1/16 with p^2 <= r_i
(Pa3dFL Sec. 6.1; 1/16 as in the Pa3dFL authors' FLGo FedRolex). Readings: docs/methods/heterofl.md.

``window=backward`` rolls the window the other way, as the official server does (``torch.roll`` of the channel
order by t, resnet_server.py:101-109): in round t the channels {(j - t) mod C : j < ceil(pC)}.
``weights=update_counts`` is the official server's averaging instead of n_k (its ``combine``, default
``--weighting avg``): a plain mean of the conv/linear weight matrices, and every other entry (biases, norm
parameters, the head's rows) weighted by how often it has been updated so far, starting at 1 and counted up
within the round in participant order (its counter is read while the same loop increments it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bench.core.engine import METHODS, ClientRound, Federation
from bench.core.flat import FlatModel
from methods.heterofl import HeteroFL, HeteroFLHyper

WEIGHTS = ("samples", "update_counts")
WINDOWS = {"forward": 1, "backward": -1}


@dataclass(frozen=True)
class FedRolexHyper(HeteroFLHyper):
    weights: str  # samples: n_k for every entry | update_counts: the official server's combine (see above)
    window: str  # forward: channels {(t + j) mod C} (Sec. 3) | backward: {(j - t) mod C}, the official code's


@METHODS.register("fedrolex")
class FedRolex(HeteroFL):
    Hyper = FedRolexHyper

    def __init__(self, fed: Federation, hp: Any) -> None:
        if hp.weights not in WEIGHTS:
            raise ValueError(f"method.weights={hp.weights!r} is invalid: use one of {list(WEIGHTS)}")
        if hp.window not in WINDOWS:
            raise ValueError(f"method.window={hp.window!r} is invalid: use one of {list(WINDOWS)}")
        super().__init__(fed, hp)

    def roll(self, round_: int) -> int:
        return WINDOWS[self.hp.window] * round_

    # ------------------------------------------------------------ weights=update_counts
    def setup(self, init: torch.Tensor) -> None:
        super().setup(init)
        if self.hp.weights == "update_counts":
            self.state["updates"] = torch.ones(init.numel(), dtype=torch.float64, device=init.device)

    def begin_round(self, round_: int, participants: Any) -> None:
        super().begin_round(round_, participants)
        if self.hp.weights == "update_counts":
            self._updated_now = torch.zeros_like(self.state["updates"])
            self._counted = self.fed.worker.mask(lambda e: len(e.shape) <= 1 or e.name == "head.weight")

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        if self.hp.weights == "samples":
            super().upload(task, model)
            return
        size = self.fed.size
        vector = model.vector.double()
        positions = self.positions(self.widths[task.cid], task.round)
        if positions is None:
            positions = torch.arange(size, device=vector.device)
        keep = self.contributes(task, model)
        if keep is not None:
            vector, positions = vector[keep], positions[keep]
        counts = self.state["updates"][positions] + self._updated_now[positions]
        weight = torch.zeros(size, dtype=torch.float64, device=vector.device)
        weight[positions] = torch.where(self._counted[positions], counts, torch.ones_like(counts))
        full = torch.zeros(size, dtype=torch.float64, device=vector.device)
        full[positions] = vector
        self._mean.add(full, weight)
        self._updated_now[positions] += 1

    def aggregate(self, round_: int, participants: Any) -> None:
        super().aggregate(round_, participants)
        if self.hp.weights == "update_counts":
            self.state["updates"] += self._updated_now
