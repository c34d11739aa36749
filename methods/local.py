"""Local / Separate / LocalOnly: every client trains alone on its own data; nothing is communicated.

The server only stores each client's model (``models``: [num_clients, D]). Before and after aggregation
are the same model, so only 'post' is evaluated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bench.core.engine import METHODS, ClientRound, Method
from bench.core.flat import FlatModel


@METHODS.register("local")
class Local(Method):
    eval_stages = ("post",)
    pre_is_post = True
    trains_batched = True

    def setup(self, init: torch.Tensor) -> None:
        self.state["models"] = self.fed.client_table(init)

    def client_model(self, cid: int) -> torch.Tensor:
        return self.state["models"][cid]

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        self.state["models"][task.cid].copy_(model.vector)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        pass
