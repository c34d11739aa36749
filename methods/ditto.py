"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): a global model trained by FedAvg plus a personal model per
client, pulled towards the global one (Li et al., ICML 2021, Alg. 1).

Participant k in round t, starting from the global model w^t:
  personal   v_k <- SGD on F_k(v) + (lambda / 2) ||v - w^t||^2 for ``personal_epochs``   (gradient + lambda (v - w^t))
  global     w_k <- local SGD on F_k from w^t for ``train.epochs``; the server averages w_k (weights n_k)
Both 'pre' and 'post' evaluate the personal model v_k (the server never changes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.core.batched import StackedBatch
from bench.core.engine import METHODS, ClientRound
from bench.core.flat import FlatModel
from methods.fedavg import FedAvg


@dataclass(frozen=True)
class DittoHyper:
    lam: float  # lambda, the pull of the personal model towards the global one
    personal_epochs: int | None  # epochs of personal training per round; null = train.epochs


@METHODS.register("ditto")
class Ditto(FedAvg):
    Hyper = DittoHyper
    trains_batched = True
    _anchor: torch.Tensor | None = None  # w^t while the personal model trains
    _pulling = False  # the batched personal phase: the gradient is pulled towards each client's start w^t

    def setup(self, init: torch.Tensor) -> None:
        super().setup(init)
        self.state["personal"] = self.fed.client_table(init)

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        model.load(self.state["personal"][task.cid])
        self._anchor = task.start
        try:
            self.local_sgd(task, model, epochs=self.hp.personal_epochs, kept_as="personal")
        finally:
            self._anchor = None
        self.state["personal"][task.cid] = model.vector
        model.load(task.start)
        return self.local_sgd(task, model)  # the worker ends with w_k, which upload() averages

    def train_clients(self, tasks: Sequence[ClientRound], models: torch.Tensor, worker: FlatModel) -> list[float]:
        cids = [t.cid for t in tasks]
        personal = self.state["personal"][cids]
        self._pulling = True
        try:
            self.stacked_sgd(tasks, personal, worker, epochs=self.hp.personal_epochs)
        finally:
            self._pulling = False
        self.state["personal"][cids] = personal
        return self.stacked_sgd(tasks, models, worker)

    def before_step_batched(self, batch: StackedBatch) -> None:
        if self._pulling:
            batch.pull_towards(batch.starts, self.hp.lam)

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        if self._anchor is not None:
            for param, where in model.param_views():
                if param.grad is not None:
                    param.grad.add_(param.detach() - self._anchor[where].view_as(param), alpha=self.hp.lam)

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        return self.state["personal"][cid]
