"""Client capacities and the model widths they allow (Pa3dFL Sec. 3 and 6.1; HeteroFL, FedRolex, FLANC).

Client i has capacity r_i in (0, 1]: the share of the full model it can hold. A model of width p (every
hidden width scaled by p) costs about p^2 of the full one, so a width-reduction method gives client i a
width with p_i^2 <= r_i.

- ``ideal``: every r_i = 1.
- ``hetero``: r_i ~ U[low, high] i.i.d., drawn from the data seed (the clients' hardware belongs to the
  federation, like their data).
- ``grid``: r_i evenly spaced from ``low`` to ``high`` (the other reading of "uniformly distributed").

Widths (:func:`widths_for`):

- ``multiple``: p_min = the largest of {1, 1/2, ..., 1/32} with p_min^2 <= min_i r_i; p_i = the largest multiple
  of ``step`` (default p_min), counting down from 1, with p_i^2 <= r_i (FLANC, FedRolex, TailorFL: step 1/16);
- ``levels``: p_i = 0.5^k with the smallest k such that p_i^2 <= r_i (HeteroFL).

Which rule a method uses (:class:`WidthRule`): its own (``capacity.width_rule=method``, the default: HeteroFL and
FjORD ``levels``, FedRolex and TailorFL multiples of 1/16, FLANC and Pa3dFL multiples of p_min), or one rule
every method of the run's table shares (``capacity.width_rule=multiple`` / ``levels`` with ``capacity.width_step``;
Pa3dFL Sec. 6.1: every width-reduction method gets p_i with p_i^2 <= r_i, so that equal capacities give equal
widths whatever the method).

Capacity-unaware methods run the widest model the weakest client can run (:func:`unaware_width`) on every
client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from common.seeding import generator

SETTINGS = ("ideal", "hetero", "grid")
#: the setting of a config without a ``capacity`` entry (configs written before capacities existed)
IDEAL = {"setting": "ideal", "low": 0.01, "high": 1.0}
RULES = ("multiple", "levels")
#: ``capacity.width_rule``: "method" = each method's own rule, or one of :data:`RULES` shared by every method
SHARED_RULES = ("method", *RULES)
#: the widths a client's model may have (1/32 is the narrowest the zoo's models stay meaningful at)
PREFERRED_WIDTHS = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125)


def check_capacity_config(cfg: Mapping[str, Any]) -> None:
    """Refuse a bad ``capacity`` config, naming the key, its value and the allowed values."""
    if cfg["setting"] not in SETTINGS:
        raise ValueError(f"capacity.setting={cfg['setting']!r} is invalid: use one of {list(SETTINGS)}")
    low, high = cfg["low"], cfg["high"]
    if not (isinstance(low, int | float) and isinstance(high, int | float) and 0 < low <= high <= 1):
        raise ValueError(f"capacity.low={low!r}, capacity.high={high!r} are invalid: need 0 < low <= high <= 1")
    if low < PREFERRED_WIDTHS[-1] ** 2:
        raise ValueError(f"capacity.low={low} is below {PREFERRED_WIDTHS[-1] ** 2:g}, the capacity of the narrowest "
                         f"width {PREFERRED_WIDTHS[-1]}: raise capacity.low")
    rule, step = cfg.get("width_rule", "method"), cfg.get("width_step")
    if rule not in SHARED_RULES:
        raise ValueError(f"capacity.width_rule={rule!r} is invalid: use one of {list(SHARED_RULES)}")
    if step is not None and not (isinstance(step, int | float) and 0 < step <= 1):
        raise ValueError(f"capacity.width_step={step!r} is invalid: use a number in (0, 1] or null (p_min)")
    if step is not None and rule != "multiple":
        raise ValueError(f"capacity.width_step={step} applies to capacity.width_rule=multiple only, not "
                         f"{rule!r}: set capacity.width_step=null")


def client_capacities(cfg: Mapping[str, Any] | None, num_clients: int, data_seed: int) -> torch.Tensor:
    """r_i (float64 ``[num_clients]``) of the ``capacity`` config (None: ideal)."""
    cfg = cfg or IDEAL
    check_capacity_config(cfg)
    low, high = float(cfg["low"]), float(cfg["high"])
    if cfg["setting"] == "ideal":
        return torch.ones(num_clients, dtype=torch.float64)
    if cfg["setting"] == "grid":
        return torch.linspace(low, high, num_clients, dtype=torch.float64)
    u = torch.rand(num_clients, generator=generator(data_seed, "capacity"), dtype=torch.float64)
    return low + (high - low) * u


def weakest_width(capacities: torch.Tensor) -> float:
    """p_min: the largest preferred width whose cost p^2 fits the weakest client's capacity."""
    weakest = float(capacities.min())
    return next(p for p in PREFERRED_WIDTHS if p * p <= weakest + 1e-12)


def widths_for(capacities: torch.Tensor, rule: str = "multiple", step: float | None = None) -> list[float]:
    """p_i per client under ``rule`` (see the module docstring)."""
    if rule not in RULES:
        raise ValueError(f"width rule {rule!r} is invalid: use one of {list(RULES)}")
    if rule == "levels":
        return [next(p for p in PREFERRED_WIDTHS if p * p <= float(r) + 1e-12) for r in capacities]
    step = step or weakest_width(capacities)
    if not 0 < step <= 1:
        raise ValueError(f"width step={step} is invalid: it must be in (0, 1]")
    out = []
    for r in capacities.tolist():
        k = math.floor(1 / step + 1e-9)
        while k > 1 and (k * step) ** 2 > r + 1e-12:
            k -= 1
        out.append(k * step)
    return out


@dataclass(frozen=True)
class WidthRule:
    """How clients' widths follow from their capacities: :func:`widths_for`'s ``rule`` and ``step``."""

    rule: str  # "multiple" | "levels"
    step: float | None = None  # "multiple" only: the grid's step; None = p_min

    def widths(self, capacities: torch.Tensor) -> list[float]:
        """p_i per client."""
        return widths_for(capacities, self.rule, self.step)

    def label(self) -> str:
        """The rule in words, for run summaries and table captions."""
        if self.rule == "levels":
            return "the largest p in {1, 1/2, 1/4, ...} with p² ≤ r"
        return f"the largest multiple p of {'p_min' if self.step is None else f'{self.step:g}'} with p² ≤ r"


def shared_width_rule(cfg: Mapping[str, Any] | None) -> WidthRule | None:
    """The width rule every method of a run with ``capacity`` config ``cfg`` follows; None: each its own."""
    cfg = cfg or IDEAL
    rule = cfg.get("width_rule", "method")
    return None if rule == "method" else WidthRule(rule, cfg.get("width_step"))


def unaware_width(capacities: torch.Tensor, shared: WidthRule | None = None) -> float:
    """The width a capacity-unaware method runs on every client: the weakest client's, under the shared rule
    when there is one (the narrowest of its widths), else :func:`weakest_width`."""
    return weakest_width(capacities) if shared is None else min(shared.widths(capacities))
