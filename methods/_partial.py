"""Shared machinery for partial personalization: a personal slice of the model stays on each client.

The server keeps the shared model ``global`` [D] and each client's personal entries ``personal``
[N, D_personal] (the positions are ``personal_mask(worker)``). A client starts from the global model with
its own personal entries written in; after training, the shared entries are averaged over the round's
participants (weights n_k) and the personal entries are stored back. FedPer (head), FedBN (norm layers),
FedRep (head, alternating training) and LG-FedAvg (body) differ only in the mask and local training.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bench.core.aggregate import WeightedMean
from bench.core.engine import ClientRound, Method
from bench.core.flat import FlatModel


def head_mask(model: FlatModel) -> torch.Tensor:
    return model.mask(lambda e: e.name.startswith("head."))


class PartialPersonalization(Method):
    """Base for methods whose personal part is a fixed set of flat-vector positions."""

    def personal_mask(self, model: FlatModel) -> torch.Tensor:
        raise NotImplementedError

    def setup(self, init: torch.Tensor) -> None:
        mask = self.personal_mask(self.fed.worker)
        self.state["personal_index"] = self.fed.worker.index(mask)
        self.state["global"] = init
        self.state["personal"] = self.fed.client_table(init[self.state["personal_index"]])

    def client_model(self, cid: int) -> torch.Tensor:
        vector = self.state["global"].clone()
        vector[self.state["personal_index"]] = self.state["personal"][cid]
        return vector

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._mean = WeightedMean()

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self._mean.add(model.vector, float(self.fed.train_sizes[task.cid]))
        self.state["personal"][task.cid] = model.vector[self.state["personal_index"]]

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        personal = self.state["personal_index"]
        mean = self._mean.result(self.state["global"].dtype)
        mean[personal] = self.state["global"][personal]  # personal positions of the global model never change
        self.state["global"] = mean
