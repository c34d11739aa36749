"""FedAvg (McMahan et al., 2017): clients train from the global model; the server averages.

Server update: w^{t+1} = sum_k (n_k / n) w_k^t over the round's participants (McMahan et al., Alg. 1). Floating
buffers (BatchNorm running statistics) are averaged like parameters, as averaging the state dict does.
'pre' is each participant's locally trained model, 'post' the new global model on every client.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bench.core.aggregate import WeightedMean
from bench.core.engine import METHODS, ClientRound, Method
from bench.core.flat import FlatModel


@METHODS.register("fedavg")
class FedAvg(Method):
    trains_batched = True
    def setup(self, init: torch.Tensor) -> None:
        self.state["global"] = init

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["global"]

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self._mean = WeightedMean()

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self._mean.add(model.vector, float(self.fed.train_sizes[task.cid]))

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["global"] = self._mean.result(self.state["global"].dtype)
