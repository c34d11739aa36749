"""FedBABU (Oh, Kim, Yun, ICLR 2022): the head keeps its random initialisation and is frozen during
federated training; only the body is trained and averaged (FedAvg on the body). Personalization happens at
evaluation: 'post' fine-tunes the global model on the client's training data for ``finetune_epochs``
(``finetune_part``: the whole model as in the paper, or only the head or the body) with the run's optimizer at
the round's lr; 0 epochs evaluates the global model itself. 'pre' is the locally trained model
(docs/methods/fedselect.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.core.engine import METHODS, ClientRound
from bench.core.flat import FlatModel
from methods._masked import check_choice, finetune
from methods.fedavg import FedAvg


@dataclass(frozen=True)
class FedBABUHyper:
    finetune_epochs: int  # fine-tuning epochs before 'post' evaluation (0 = none)
    finetune_part: str  # all | head | body: what fine-tuning trains

    def __post_init__(self) -> None:
        check_choice("finetune_part", self.finetune_part, ("all", "head", "body"))


def named_params(model: FlatModel, part: str) -> list[torch.nn.Parameter]:
    """``head``: the ``head.*`` parameters, ``body``: the others, ``all``: every one."""
    return [p for n, p in model.module.named_parameters() if part == "all" or n.startswith("head.") == (part == "head")]


@METHODS.register("fedbabu")
class FedBABU(FedAvg):
    Hyper = FedBABUHyper
    post_finetune = "finetune_epochs"
    trains_batched = True

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        return self.local_sgd(task, model, params=named_params(model, "body"))

    def train_clients(self, tasks: Sequence[ClientRound], models: torch.Tensor, worker: FlatModel) -> list[float]:
        return self.stacked_sgd(tasks, models, worker, params=named_params(worker, "body"))

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        if stage == "pre":
            return model.vector
        return finetune(self, cid, model, self.state["global"], round_, lr, self.hp.finetune_epochs,
                        named_params(model, self.hp.finetune_part), tag="fedbabu")
