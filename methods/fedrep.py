"""FedRep (Collins et al., 2021): local head, shared body, trained in alternation (Collins et al., Alg. 1).

Each round a participant first trains only its head for ``head_epochs`` with the body frozen, then only
the body for ``body_epochs`` with the head frozen. Only the body is averaged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.core.engine import METHODS, ClientRound
from bench.core.flat import FlatModel
from methods._partial import PartialPersonalization, head_mask


@dataclass(frozen=True)
class FedRepHyper:
    head_epochs: int  # epochs of head-only training per round
    body_epochs: int  # epochs of body-only training per round


@METHODS.register("fedrep")
class FedRep(PartialPersonalization):
    Hyper = FedRepHyper
    trains_batched = True

    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        return head_mask(model)

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        head, body = head_and_body(model)
        head_loss = self.local_sgd(task, model, epochs=self.hp.head_epochs, params=head)
        if self.hp.body_epochs == 0:
            return head_loss
        return self.local_sgd(task, model, epochs=self.hp.body_epochs, params=body)

    def train_clients(self, tasks: Sequence[ClientRound], models: torch.Tensor, worker: FlatModel) -> list[float]:
        head, body = head_and_body(worker)
        head_loss = self.stacked_sgd(tasks, models, worker, epochs=self.hp.head_epochs, params=head)
        if self.hp.body_epochs == 0:
            return head_loss
        return self.stacked_sgd(tasks, models, worker, epochs=self.hp.body_epochs, params=body)


def head_and_body(model: FlatModel) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """The ``head.*`` parameters and the others."""
    named = list(model.module.named_parameters())
    return [p for n, p in named if n.startswith("head.")], [p for n, p in named if not n.startswith("head.")]
