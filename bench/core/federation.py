"""What a method knows of the federation (:class:`Federation`: clients, their sizes and capacities, the workers of
each width, the ``train`` config) and of one participant's round (:class:`ClientRound`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bench.core.capacity import WidthRule
from bench.core.client_state import ClientTables
from bench.core.data import ClientData, FederatedData
from bench.core.flat import FlatModel
from common.seeding import derive_seed


class WorkerFactory:
    """Builds the worker of a given width on first use and keeps it (one module per width, reused by every
    client of that width). ``build(width)`` returns the module; its initial values never matter, since the
    engine loads a client's flat model into the worker before every use."""

    def __init__(self, build: Callable[[float], nn.Module], full: FlatModel) -> None:
        self._build = build
        self._workers: dict[float, FlatModel] = {1.0: full}

    def __call__(self, width: float) -> FlatModel:
        width = float(width)
        if not 0.0 < width <= 1.0:
            raise ValueError(f"a worker's width must be in (0, 1], got {width}")
        if width not in self._workers:
            self._workers[width] = self._seeded_build(width, derive_seed(0, "worker", width))
        return self._workers[width]

    def initial(self, width: float, seed: int) -> torch.Tensor:
        """A freshly built model of ``width`` under ``seed``, flat in the layout of that width's worker."""
        self(width)  # validates the width (and builds its worker once)
        return self._seeded_build(float(width), seed).vector

    def _seeded_build(self, width: float, seed: int) -> FlatModel:
        """``build(width)`` under ``seed``, leaving the global RNG as it was, on the full worker's device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = self._build(width)
        return FlatModel(module.to(self._workers[1.0].vector.device))


@dataclass(frozen=True)
class Federation:
    """Read-only facts about the federation that a method may use."""

    num_clients: int
    train_sizes: torch.Tensor  # float64 [num_clients]
    worker: FlatModel  # the full-width worker (its layout tells where each named tensor lives)
    train: Mapping[str, Any]  # the ``train`` config: epochs, batch_size, optimizer, lr, ...
    device: torch.device
    seed: int
    data: FederatedData | None = None  # for evaluation-time steps (fine-tuning, fusion on validation data)
    workers: WorkerFactory | None = None  # narrower workers on demand (clients of different capacities)
    #: r_i per client (float64 [N]; bench.core.capacity); given as None, it is all ones
    capacities: torch.Tensor = None  # type: ignore[assignment]
    #: the width rule every capacity-aware method of the run follows (``capacity.width_rule``); None: each its own
    width_rule: WidthRule | None = None
    #: where per-client tables live (``client_state`` config); None: in memory
    tables: ClientTables | None = None

    def __post_init__(self) -> None:
        if self.capacities is None:
            object.__setattr__(self, "capacities", torch.ones(self.num_clients, dtype=torch.float64))

    @property
    def size(self) -> int:
        return self.worker.size

    def client_widths(self, own: WidthRule) -> tuple[WidthRule, list[float]]:
        """(the rule in force, p_i per client): the run's shared rule if it has one, else the method's ``own``."""
        rule = self.width_rule or own
        return rule, rule.widths(self.capacities)

    def client_table(self, row: torch.Tensor) -> torch.Tensor:
        """A ``[num_clients, row.numel()]`` tensor of per-client state, every row starting as ``row`` (e.g. each
        client's personal model); in memory, or memory-mapped from a file under the ``client_state`` bound
        (:mod:`bench.core.client_state`). Use it like any tensor; keep it in ``Method.state``."""
        if self.tables is None:
            return row.repeat(self.num_clients, 1)
        return self.tables.table(row)

    def client_step(self) -> None:
        """The engine finished with one client (trained or evaluated): bound the file tables' resident pages."""
        if self.tables is not None:
            self.tables.step()

    def release_tables(self) -> None:
        if self.tables is not None:
            self.tables.release()

    def worker_for(self, width: float = 1.0) -> FlatModel:
        """The worker of ``width`` (a multiplier of every hidden width; 1 = the full model), built once."""
        if float(width) == 1.0:
            return self.worker
        return self._worker_factory()(width)

    def initial_model(self, width: float, *path: object) -> torch.Tensor:
        """A model of ``width`` with its own default initialisation (not a slice of the full model), seeded by the
        run's seed, the width and ``path`` (a label of the caller); flat in the layout of ``worker_for(width)``."""
        return self._worker_factory().initial(width, derive_seed(self.seed, "init", float(width), *path))

    def _worker_factory(self) -> WorkerFactory:
        if self.workers is None:
            raise ValueError("this federation has no worker factory: build it with bench.builder")
        return self.workers

    def lr_at(self, round_: int) -> float:
        """The local learning rate of round ``round_`` (1-based): ``lr * lr_decay^(round - 1)``."""
        return float(self.train["lr"]) * float(self.train.get("lr_decay", 1.0)) ** (round_ - 1)


@dataclass
class ClientRound:
    """One participant's work in one round."""

    cid: int
    round: int  # 1-based
    data: ClientData | None  # None in an engine without data (cost measurements)
    generator: torch.Generator  # all randomness of this client in this round
    start: torch.Tensor  # the flat model the client started from (valid until ``upload`` returns)
    lr: float

