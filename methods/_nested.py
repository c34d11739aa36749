"""Nested-width training shared by HeteroFL, FjORD and FedRolex (readings: docs/methods/heterofl.md).

The server keeps one full model (``global`` [D]). Client i has width p_i (``bench.core.capacity.widths_for``
on its capacity r_i): it trains the worker of width p_i, whose entries sit at ``positions`` of the full
vector (``FlatModel.positions_in``: the prefix of every shrunk dimension, or FedRolex's rolling window).
After a round every entry is the n_k-weighted mean over the participants that hold it; an entry no
participant held keeps its value (HeteroFL Sec. 3, with FedAvg's n_k weights). Width 1 needs no positions,
so a federation of full-width clients averages exactly as FedAvg does.

Two model edits of HeteroFL (Diao et al., ICLR 2021, Sec. 3), both options:

- **scaler**: the output of every conv / linear layer of the body that a normalisation layer follows is
  divided by p in training and left as it is at evaluation (a ``Scaler`` child of the layer, run by a forward
  hook, so parameter names and the flat layout do not change); the norm absorbs the scale, so the model
  trained is the model evaluated (a layer without a norm after it gets none: ``add_scalers``);
- **static BN** (``static_bn``): ``sbn`` tracks no BatchNorm statistics in training and recollects them
  before each evaluation by one pass over training data (cumulative average): all clients' data for the
  model a client holds (the server's pass), the client's own data for its locally trained model; ``batch``
  never tracks them (BatchNorm normalises with the batch's statistics at evaluation too); ``none`` is
  ordinary BatchNorm whose statistics are averaged like parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.fx
from torch import nn

from bench.core.aggregate import WeightedMean
from bench.core.capacity import WidthRule
from bench.core.engine import ClientRound, Federation, Method
from bench.core.flat import FlatModel
from bench.core.models import NORM_TYPES

STATIC_BN = ("sbn", "batch", "none")


@dataclass(frozen=True)
class NestedHyper:
    width_rule: str  # "levels" (p = 0.5^k, HeteroFL) | "multiple" (largest multiple of width_step)
    width_step: float | None  # "multiple" only; None = the weakest client's level p_min
    scaler: bool  # divide body conv/linear outputs by p in training (identity at evaluation)
    static_bn: str  # "sbn" | "batch" | "none" (module docstring)


class Scaler(nn.Module):
    """HeteroFL's scaler: ``x / p`` in training, ``x`` at evaluation."""

    def __init__(self, width: float) -> None:
        super().__init__()
        self.width = float(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.width if self.training else x

    def extra_repr(self) -> str:
        return f"width={self.width:g}"


def _scale_output(layer: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    return layer.scaler(output)


def normalised_layers(body: nn.Module) -> list[nn.Conv2d | nn.Linear]:
    """The conv / linear layers of ``body`` whose output goes only into a normalisation layer (traced by
    ``torch.fx``): the layers HeteroFL's models put a scaler after, right before their norm."""
    modules = dict(body.named_modules())
    graph = torch.fx.symbolic_trace(body).graph
    is_norm = {node: node.op == "call_module" and isinstance(modules[str(node.target)], NORM_TYPES)
               for node in graph.nodes}
    return [modules[str(node.target)] for node in graph.nodes
            if node.op == "call_module" and isinstance(modules[str(node.target)], nn.Conv2d | nn.Linear)
            and node.users and all(is_norm[user] for user in node.users)]


def add_scalers(body: nn.Module, width: float) -> None:
    """A scaler after every conv / linear layer of ``body`` that a normalisation layer follows.

    HeteroFL's models put ``Scaler(rate)`` between each conv and its norm (official ``models/conv.py``,
    ``models/resnet.py``): the norm divides by the batch's (sBN: the recollected) spread, so x / p in training
    and x at evaluation give the same normalised output. Without a norm nothing absorbs it, and the model
    trained (x / p) is not the model evaluated (x): a width-1/4 client's logits differ by ~26x and its predicted
    classes by 100 %. So a layer not followed by a norm gets no scaler (docs/methods/heterofl.md)."""
    for layer in normalised_layers(body):
        layer.add_module("scaler", Scaler(width))
        layer.register_forward_hook(_scale_output)


def batch_norms(module: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def make_static(module: nn.Module, mode: str) -> None:
    """Apply ``static_bn=mode`` to every BatchNorm of ``module``."""
    for bn in batch_norms(module) if mode != "none" else []:
        bn.track_running_stats = False  # training normalises with batch statistics and updates nothing
        if mode == "batch":  # no statistics at all: evaluation uses the batch's too (and they leave the layout)
            bn.running_mean = bn.running_var = bn.num_batches_tracked = None


@torch.no_grad()
def recollect_bn(model: FlatModel, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """sBN: reset every BatchNorm's statistics of ``model`` and set them to the cumulative average over
    ``batches`` (only the norms in training mode: scalers stay the identity, as at evaluation)."""
    norms = batch_norms(model.module)
    momenta = [bn.momentum for bn in norms]
    model.module.eval()
    for bn in norms:
        bn.track_running_stats, bn.momentum = True, None
        bn.reset_running_stats()  # (resets nothing unless statistics are tracked)
        bn.train()
    try:
        for x, _ in batches:
            model.module(x)
    finally:
        for bn, momentum in zip(norms, momenta, strict=True):
            bn.track_running_stats, bn.momentum = False, momentum
            bn.eval()


def check_hyper(hp: NestedHyper) -> None:
    if hp.static_bn not in STATIC_BN:
        raise ValueError(f"method.static_bn={hp.static_bn!r} is invalid: use one of {list(STATIC_BN)}")


class NestedWidths(Method):
    """Base of the width-reduction methods: widths, positions, nested aggregation, sBN evaluation."""

    Hyper: ClassVar[type] = NestedHyper
    capacity_aware = True

    def __init__(self, fed: Federation, hp: Any) -> None:
        super().__init__(fed, hp)
        check_hyper(hp)
        self.width_rule, self.widths = fed.client_widths(WidthRule(hp.width_rule, hp.width_step))
        self._positions: dict[tuple[float, int], torch.Tensor] = {}
        self._recollected: dict[tuple[float, int], torch.Tensor] = {}

    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        check_hyper(hp)
        if hp.scaler:
            add_scalers(model.body, width)
        make_static(model, hp.static_bn)
        return model

    # ------------------------------------------------------------ widths and positions
    def client_width(self, cid: int) -> float:
        return self.widths[cid]

    def client_worker(self, cid: int, stage: str) -> FlatModel:
        return self.fed.worker_for(self.widths[cid])

    def roll(self, round_: int) -> int:
        """Offset of the kept channel window in round ``round_`` (0: the prefix; FedRolex rolls it)."""
        return 0

    def positions(self, width: float, round_: int) -> torch.Tensor | None:
        """Where the width-``width`` worker's entries sit in the full vector in round ``round_`` (None: all,
        in order); cached for the current window."""
        if width == 1.0:
            return None
        key = (width, self.roll(round_))
        if key not in self._positions:
            self._positions = {k: v for k, v in self._positions.items() if k[1] == key[1]}
            self._positions[key] = self.fed.worker_for(width).positions_in(self.fed.worker, roll=key[1])
        return self._positions[key]

    # ------------------------------------------------------------ the round
    def setup(self, init: torch.Tensor) -> None:
        classes = self.fed.worker.entry("head.weight").shape[0]
        for width in sorted(set(self.widths)):
            if self.fed.worker_for(width).entry("head.weight").shape[0] != classes:
                raise ValueError(f"the width-{width} model prunes the head's classes: nested methods need all")
        self.state["global"] = init
        self.state["round"] = 0

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        self.state["round"] = round_
        self._mean = WeightedMean()
        self._recollected = {}

    def client_model(self, cid: int) -> torch.Tensor:
        positions = self.positions(self.widths[cid], self.state["round"])
        return self.state["global"] if positions is None else self.state["global"][positions]

    def contributes(self, task: ClientRound, model: FlatModel) -> torch.Tensor | None:
        """Boolean mask over the worker's entries this client's upload adds to the mean (None: all)."""
        return None

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        weight = float(self.fed.train_sizes[task.cid])
        positions = self.positions(self.widths[task.cid], task.round)
        keep = self.contributes(task, model)
        vector = model.vector
        if keep is not None:
            if positions is None:
                positions = torch.arange(model.size, device=vector.device)
            vector, positions = vector[keep], positions[keep]
        if positions is None:
            self._mean.add(vector, weight)
        else:
            self._mean.add(vector, weight, index=positions, size=self.fed.size)

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        self.state["global"] = self._mean.result(self.state["global"].dtype, fallback=self.state["global"])
        self._recollected = {}

    # ------------------------------------------------------------ evaluation (sBN)
    def train_batches(self, clients: Iterable[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.fed.data is None:
            raise ValueError("static_bn=sbn needs the federation's data (Federation.data) to recollect statistics")
        for cid in clients:
            yield from self.fed.data.client(cid).batches("train", int(self.fed.train["batch_size"]), shuffle=False,
                                                         augment=False)

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        recollect = self.hp.static_bn == "sbn" and bool(batch_norms(model.module))
        if stage == "pre":
            if recollect:
                recollect_bn(model, self.train_batches([cid]))
            return model.vector
        vector = self.client_model(cid)
        if not recollect:
            return vector
        key = (self.widths[cid], self.roll(self.state["round"]))
        if key not in self._recollected:  # one server pass per width (and window) and round
            model.load(vector)
            recollect_bn(model, self.train_batches(range(self.fed.num_clients)))
            self._recollected[key] = model.read()
        return self._recollected[key]
