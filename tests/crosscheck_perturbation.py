"""Imported by a run (``imports=[tests.crosscheck_perturbation]``): FedAvg's server update perturbed.

The server moves only a tenth of the way from the old global model to the clients' mean (a server learning
rate of 0.1 instead of FedAvg's 1), a small change of the update rule that a cross-check must catch.
"""

from __future__ import annotations

from collections.abc import Sequence

from methods.fedavg import FedAvg

_original = FedAvg.aggregate


def _damped(self: FedAvg, round_: int, participants: Sequence[int]) -> None:
    old = self.state["global"]
    _original(self, round_, participants)
    self.state["global"] = old + 0.1 * (self.state["global"] - old)


FedAvg.aggregate = _damped  # type: ignore[method-assign]
