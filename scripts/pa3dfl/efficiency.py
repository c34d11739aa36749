"""Training cost of the capacity-heterogeneous methods: FLOPs, peak memory and model size per method, client size
ratio and batch size, in the layout of Pa3dFL's Table 2 (batch 128) and Table 8 (batch 16/64/128/512), with the
paper's numbers (``conf/paper/pa3dfl/efficiency.csv``) beside ours.

What is measured. For every method and size ratio r (a client that can hold the share r of the full model) the client
model is built exactly as a run builds it: the composed config (``conf/``, default ResNet-18-GN of Pa3dFL App. D.2,
torchvision layout, CIFAR-10 input 3x32x32, 10 classes) goes through :func:`bench.builder.build_worker` /
:func:`bench.builder.model_builder` (the zoo's model and the method's ``extend_model``), and a capacity-aware
method, built without data (:func:`bench.builder.build_without_data`) on a federation whose clients have the
capacities r, hands out the worker it trains
(``client_worker``, ``client_width``; pFedGate's sparsity budget via ``serve``). Capacity-unaware methods (FedAvg,
pFedHN) run the widest model the weakest client can run (``weakest_width``). One training step is then measured on
a random batch: ``zero_grad``, forward, cross-entropy, backward, (gradient clipping if ``train.grad_clip``),
optimizer step with the config's ``train`` optimizer. Method-specific loss terms (FLANC's orthogonality regulariser,
TailorFL's L1 on the scores, FjORD's extra pass through a sampled narrower submodel with distillation, HeteroFL's
label mask, Pa3dFL's cross-entropy through its fixed global head and its orthogonality regulariser) are not part of
the step: the step is "training the model", as the paper's numbers are.

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` around the training step (forward + backward; the optimizer
  update is elementwise and, like every elementwise, normalisation and pooling op, not counted by torch's counter,
  which counts matrix products and convolutions, their backward included). One multiply-add = 2 FLOPs. Reported in
  GFLOPs (1e9). The forward pass alone (``torch.no_grad``) is recorded too.
- Peak memory: on CPU, the peak of live tensor bytes during the step: a ``TorchDispatchMode`` sees every tensor an
  op returns and keeps a weak reference to its storage; at the start it holds the parameters, buffers, optimizer
  state and the batch; after each op the bytes of the storages still alive are summed and the maximum kept. That is
  parameters + gradients + optimizer state + activations saved for backward + temporaries, as a caching allocator
  would have them allocated, without allocator rounding/caching, library workspaces or a CUDA context. On CUDA:
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was allocated before the step,
  plus the same starting tensors (so other models resident on the device are not counted). MB = 1e6 bytes.
- Model size: bytes of the client model's parameters (float32), MB = 1e6 bytes.

Variants beside the methods themselves: ``flanc (factored)`` runs the same FLANC layers in the authors' FLGo form
(input groups convolved with the shared basis, then a 1x1 convolution with the coefficients) instead of composing
the weight first (our implementation; the same function); ``pfedgate (D.4)`` is the paper's App. D.4 accounting
(cost of the width-sqrt(r) plain model + the gating overhead = cost of pFedGate's model at sparsity 1 minus the
plain full model), while ``pfedgate`` is the model as implemented (zero-masked dense full model plus the gate).
Pa3dFL's client trains its decomposed model (each body layer in the cheaper of two orders of the same map: its
weight composed from the general U and the personal V, then one convolution, or a 1x1 convolution with V then a
grouped convolution with U; ``pa3dfl (recover)``: every layer composed first; the local head in the forward pass,
the fixed global head counted in the model size); its server hypernetwork, which generates V, is reported separately
(``server_mb``), as pFedHN's is. pFedHN has no row in the paper; its client trains the target network.

CLI: ``python -m scripts.pa3dfl.efficiency --out results/pa3dfl [--batch-sizes ...] [--methods ...]`` writes
``efficiency.md``, ``efficiency.csv`` and ``efficiency.json`` (atomic writes).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import io
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from bench.builder import (
    InputShape,
    base_width,
    build_without_data,
    build_worker,
    method_class,
    model_builder,
    model_scaled,
)
from bench.core.capacity import PREFERRED_WIDTHS, weakest_width
from bench.core.engine import make_optimizer
from bench.experiment.compose import compose_config, to_container
from bench.experiment.provenance import cpu_name
from bench.experiment.result import Result, bullets, grid, heading, paragraph, rerender_from_json, to_markdown
from common.seeding import derive_seed
from common.verified_io import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
PAPER_CSV = ROOT / "conf" / "paper" / "pa3dfl" / "efficiency.csv"
PAPER_FILE = str(PAPER_CSV.relative_to(ROOT)) if PAPER_CSV.is_relative_to(ROOT) else str(PAPER_CSV)
DEFAULT_BATCH_SIZES = (16, 64, 128, 512)
DEFAULT_SIZE_RATIOS = ("1/256", "1/64", "1/4", "1")
#: Pa3dFL's CIFAR-10 model (Sec. 6.1, App. D.2): ResNet-18 with GroupNorm (2 groups), torchvision layout
#: Pa3dFL's R1 = p_min T with the Hetero setting's p_min = 1/16 (r >= 1 %): the measured federation of one client per
#: size ratio is not the run config's, from which method.rank_width=null would derive p_min
DEFAULT_CONFIG = ("model=resnet18", "model.options.norm=gn", "model.options.gn_groups=2",
                  "pa3dfl:method.rank_width=0.0625")
TABLE2_BATCH_SIZE = 128  # Pa3dFL Table 2's batch size (Sec. 6.4)
MB = 1e6
GIGA = 1e9

#: our method -> the paper's row (Table 2: "p-width" = HeteroFL, FjORD, FedRolex and TailorFL; None = no paper row)
PAPER_ROW: dict[str, str | None] = {
    "fedavg": "FedAvg", "heterofl": "p-width", "fjord": "p-width", "fedrolex": "p-width", "tailorfl": "p-width",
    "flanc": "FLANC", "pfedgate": "pFedGate", "pfedhn": None, "pa3dfl": "Pa3dFL",
}
METHODS = tuple(PAPER_ROW)
#: methods the paper reports at full width only
FULL_WIDTH_ONLY = frozenset({"fedavg"})
#: methods of the paper's comparison that are not measured (their rows carry the paper's numbers only); none now
NOT_BUILT: frozenset[str] = frozenset()
#: measured variants of a method besides the method as implemented ("" = as implemented)
VARIANTS: dict[str, tuple[str, ...]] = {"flanc": ("", "factored"), "pfedgate": ("", "D.4"), "pa3dfl": ("", "recover")}
METRICS = ("flops", "peak_memory_mb", "model_size_mb")
#: the ``train`` keys the header's optimizer line shows, in this order (also when read back from the sorted JSON)
OPTIMIZER_KEYS = ("optimizer", "lr", "momentum", "weight_decay", "grad_clip")


# ------------------------------------------------------------------------------------------------ options
def parse_ratio(text: str) -> Fraction:
    """A size ratio ``"1/256"``, ``"0.25"`` or ``"1"`` as a fraction in (0, 1]; a bad one raises ``ValueError``."""
    try:
        ratio = Fraction(str(text).strip())
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"size ratio {text!r} is invalid: give a fraction such as 1/256, 0.25 or 1") from None
    smallest = Fraction(PREFERRED_WIDTHS[-1]) ** 2
    if not smallest <= ratio <= 1:
        raise ValueError(f"size ratio {text!r} is invalid: it must be in [{smallest}, 1] (the narrowest width "
                         f"{PREFERRED_WIDTHS[-1]} holds {smallest} of the model)")
    return ratio


def check_options(methods: Sequence[str], batch_sizes: Sequence[Any]) -> None:
    """Refuse an unknown method or a batch size that is not a positive integer, naming the bad value."""
    for name in methods:
        if name not in PAPER_ROW:
            raise ValueError(f"method {name!r} is unknown: choose from {list(METHODS)}")
    for b in batch_sizes:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch size {b!r} is invalid: batch sizes must be positive integers")


def ratio_label(ratio: Fraction) -> str:
    return str(ratio)


# ------------------------------------------------------------------------------------------------ configs
def method_config(name: str, overrides: Sequence[str] = DEFAULT_CONFIG, seed: int = 0) -> dict[str, Any]:
    """The resolved run config of method ``name`` with ``overrides`` (Hydra syntax; ``NAME:key=value`` applies to
    method ``NAME`` only), checked as a run's config is."""
    from bench.experiment.validation import check_config

    own = []
    for item in overrides:
        target, sep, rest = item.partition(":")
        if sep and "=" not in target:
            if target not in PAPER_ROW:
                raise ValueError(f"override {item!r} names method {target!r}, which is unknown: choose from "
                                 f"{list(METHODS)}")
            if target == name:
                own.append(rest)
        else:
            own.append(item)
    cfg = to_container(compose_config([f"method={name}", f"seed={seed}", *own]))
    check_config(cfg)
    return cfg


# --------------------------------------------------------------------------------------------- measuring
def train_step(module: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               grad_clip: float | None = None) -> None:
    """One local-training step as ``Method.local_sgd`` takes it (plain cross-entropy)."""
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(module(x), y)
    loss.backward()
    if grad_clip:
        nn.utils.clip_grad_norm_([p for p in module.parameters() if p.requires_grad], grad_clip)
    optimizer.step()


def conv_backward_flops(grad_out_shape: Sequence[int], x_shape: Sequence[int], w_shape: Sequence[int], _bias: Any,
                        _stride: Any, _padding: Any, _dilation: Any, transposed: bool, _output_padding: Any,
                        groups: int, output_mask: Sequence[bool], out_shape: Sequence[Any], **kwargs: Any) -> int:
    """FLOPs of ``aten.convolution_backward``: torch's formula (``flop_counter.conv_backward_flop``) with the weight
    gradient of a grouped convolution divided by the group count (torch 2.x counts it as if every input channel met
    every output channel, ``groups`` times too much; the input gradient and the forward are right)."""
    def t(shape: Sequence[int]) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(list(grad_out_shape), list(w_shape), list(out_shape[0]), not transposed)
    if output_mask[1]:
        inp, weight = (t(grad_out_shape), t(x_shape)) if transposed else (t(x_shape), t(grad_out_shape))
        flops += conv_flop_count(inp, weight, t(out_shape[1]), transposed=False) // groups
    return flops


FLOP_FORMULAS = {torch.ops.aten.convolution_backward: conv_backward_flops}


def count_flops(module: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None,
                optimizer: torch.optim.Optimizer | None = None) -> int:
    """FLOPs (multiply-add = 2) that ``torch.utils.flop_counter`` counts (with :func:`conv_backward_flops`): the
    forward pass of ``x`` without gradients when ``y`` is None, else one training step (forward + backward of the
    cross-entropy on ``y``, then ``optimizer``'s update if given, which adds no counted FLOPs). Works on the meta
    device too."""
    module.train()
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        if y is None:
            with torch.no_grad():
                module(x)
        elif optimizer is None:
            F.cross_entropy(module(x), y).backward()
        else:
            train_step(module, optimizer, x, y)
    if y is not None and optimizer is None:
        module.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


class LiveTensorBytes(TorchDispatchMode):
    """Peak of the bytes of live tensor storages: every tensor an op returns is tracked until its storage dies
    (weak references, checked after every op); :meth:`track` adds tensors that exist before (parameters, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def track(self, tensor: Any) -> None:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        ref = StorageWeakRef(storage)
        if ref.cdata not in self._live:
            self._live[ref.cdata] = (ref, storage.nbytes())
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)

    def _prune(self) -> None:
        dead = [key for key, (ref, _) in self._live.items() if ref.expired()]
        for key in dead:
            self.current -= self._live.pop(key)[1]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            self.track(t)
        self.peak = max(self.peak, self.current)
        self._prune()
        return out


def resident_tensors(module: nn.Module, optimizer: torch.optim.Optimizer, *batch: torch.Tensor) -> list[torch.Tensor]:
    """What lives before a step: parameters, existing gradients, buffers, optimizer state and the batch."""
    out = [*module.parameters(), *module.buffers(), *batch]
    out += [p.grad for p in module.parameters() if p.grad is not None]
    out += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return out


def storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one vector count once)."""
    tracker = LiveTensorBytes()
    for t in tensors:
        tracker.track(t)
    return tracker.current


def peak_memory(module: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                grad_clip: float | None = None) -> tuple[int, int]:
    """(peak bytes, bytes at the start) of one training step (module docstring: CPU tracking, CUDA allocator)."""
    module.train()
    optimizer.zero_grad(set_to_none=True)
    start = resident_tensors(module, optimizer, x, y)
    if x.device.type == "cuda":
        baseline = storage_bytes(start)
        torch.cuda.synchronize(x.device)
        torch.cuda.reset_peak_memory_stats(x.device)
        before = torch.cuda.memory_allocated(x.device)
        train_step(module, optimizer, x, y, grad_clip)
        torch.cuda.synchronize(x.device)
        return torch.cuda.max_memory_allocated(x.device) - before + baseline, baseline
    tracker = LiveTensorBytes()
    for t in start:
        tracker.track(t)
    baseline = tracker.current
    del start
    with tracker:
        train_step(module, optimizer, x, y, grad_clip)
    return tracker.peak, baseline


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def model_bytes(module: nn.Module) -> int:
    """Bytes of the parameters (at their dtype; float32 in every run)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


@dataclass
class Measurement:
    """One training step of one client model at one batch size."""

    params: int
    model_size_mb: float
    gflops_train_step: float
    gflops_forward: float
    peak_memory_mb: float
    start_memory_mb: float  # parameters, buffers, optimizer state and the batch before the step
    seconds: float


def random_batch(batch_size: int, in_channels: int, image_size: int, num_classes: int, device: torch.device,
                 seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(derive_seed(seed, "efficiency", batch_size))
    x = torch.randn(batch_size, in_channels, image_size, image_size, generator=gen)
    y = torch.randint(num_classes, (batch_size,), generator=gen)
    return x.to(device), y.to(device)


def measure(module: nn.Module, batch_size: int, *, train: Mapping[str, Any], in_channels: int, image_size: int,
            num_classes: int, device: torch.device, seed: int = 0) -> Measurement:
    """FLOPs (forward; training step), peak memory and model size of one training step of ``module``. The FLOP
    step comes first and leaves the optimizer in its steady state (momentum buffers exist) for the memory step.
    The module's parameters are trained by the two steps; its structure is not changed."""
    started = time.perf_counter()
    x, y = random_batch(batch_size, in_channels, image_size, num_classes, device, seed)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, train, float(train["lr"]))
    forward = count_flops(module, x)
    step = count_flops(module, x, y, optimizer)
    peak, start = peak_memory(module, optimizer, x, y, train.get("grad_clip"))
    optimizer.zero_grad(set_to_none=True)
    return Measurement(params=parameter_count(module), model_size_mb=model_bytes(module) / MB,
                       gflops_train_step=step / GIGA, gflops_forward=forward / GIGA, peak_memory_mb=peak / MB,
                       start_memory_mb=start / MB, seconds=time.perf_counter() - started)


# ------------------------------------------------------------------------------------- FLANC, factored
class FactoredDecomposed(nn.Module):
    """A FLANC layer (:class:`methods._decomposed.Decomposed`, same parameters) run in the authors' FLGo form: the
    input's groups of R1 channels convolved with the shared basis (a grouped convolution), then a 1x1 convolution
    (a linear map for a linear layer) with the coefficients. The same function as composing the weight first."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.layer
        rank, group = d.basis.shape[:2]
        groups = d.coeff.shape[1] // rank
        pad = groups * group - d.in_features
        if d.conv is None:
            if pad:
                x = F.pad(x, (0, pad))
            h = (x.unflatten(-1, (groups, group)) @ d.basis.reshape(rank, group).T).flatten(-2)
            return F.linear(h, d.coeff, d.bias)
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
        h = F.conv2d(x, d.basis.repeat(groups, 1, 1, 1), None, groups=groups, **d.conv)
        return F.conv2d(h, d.coeff[:, :, None, None], d.bias)


@contextlib.contextmanager
def pa3dfl_order(module: nn.Module, order: str) -> Iterator[nn.Module]:
    """``module`` with every Pa3dFL layer computed in ``order`` (``method.layer_order``; restored on exit)."""
    from methods.pa3dfl import Pa3dLayer

    layers = [m for m in module.modules() if isinstance(m, Pa3dLayer)]
    before = [layer.order for layer in layers]
    for layer in layers:
        layer.order = order
    try:
        yield module
    finally:
        for layer, was in zip(layers, before, strict=True):
            layer.order = was


@contextlib.contextmanager
def factored_flanc(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with every FLANC layer run by :class:`FactoredDecomposed` (restored on exit)."""
    from methods._decomposed import Decomposed

    swapped = [(name, m) for name, m in module.named_modules() if isinstance(m, Decomposed)]
    for name, layer in swapped:
        parent, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, child, FactoredDecomposed(layer))
    try:
        yield module
    finally:
        for name, layer in swapped:
            parent, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent) if parent else module, child, layer)


# ----------------------------------------------------------------------------------------- client models
@dataclass
class ClientModel:
    """The model a client of size ratio ``ratio`` trains under a method, ready to be measured."""

    ratio: Fraction
    width: float  # relative to the zoo's full model
    module: nn.Module
    prepare: Callable[[], None]  # makes ``module`` serve this client (pFedGate's sparsity budget)
    sparsity: float | None = None
    server_mb: float | None = None  # server-side state kept for the clients (pFedHN's and Pa3dFL's hypernetworks)


def client_models(name: str, cfg: Mapping[str, Any], ratios: Sequence[Fraction], shape: InputShape,
                  device: torch.device, num_clients: int = 100) -> list[ClientModel]:
    """For each size ratio, the client model method ``name`` trains, built through the project's builder
    (``num_clients``: the federation the server-side state is sized for)."""
    cls, hp = method_class(cfg)
    dims = (shape.num_classes, shape.in_channels, shape.image_size)
    caps = torch.tensor([float(r) for r in ratios], dtype=torch.float64)
    out = []
    if not cls.capacity_aware:  # every client runs the widest model the weakest client can run: one per ratio
        for r, cap in zip(ratios, caps, strict=True):
            width = base_width(cls, cap[None])
            worker = build_worker(model_scaled(cfg, width), *dims, device, cls, hp)
            server_mb = hypernetwork_mb(cfg, worker.module, num_clients) if name == "pfedhn" else None
            out.append(ClientModel(r, width * float(cfg["model"].get("width", 1.0)), worker.module, lambda: None,
                                   server_mb=server_mb))
        return out
    # the server's hypernetwork (Pa3dFL) does not shape the client models: a 1-wide one stands in here (the real one
    # holds (hidden + 1) x the model's parameters, 2.9 GB for ResNet-18), and the real one's size is computed on meta
    stand_in = dataclasses.replace(hp, embed_dim=1, hidden_dim=1, encoder_depth=1) \
        if cfg["method"]["name"] == "pa3dfl" else None
    experiment = build_without_data(cfg, shape, device, capacities=caps, hp=stand_in)
    method, scaled = experiment.method, experiment.config
    server_mb = None
    if cfg["method"]["name"] == "pa3dfl":
        sizes = [dec[-1].out_features for dec in method.state["hn"]["net"].decoders]
        server_mb = pa3dfl_hypernetwork_mb(hp, sizes, num_clients)
    for cid, r in enumerate(ratios):
        client = method.client_worker(cid, "train")
        serve = getattr(method, "serve", None)
        prepare = functools.partial(serve, cid, client) if serve is not None else (lambda: None)
        sparsity = float(method.budgets[cid]) if hasattr(method, "budgets") else None
        out.append(ClientModel(r, float(method.client_width(cid)) * float(scaled["model"].get("width", 1.0)),
                               client.module, prepare, sparsity, server_mb))
    return out


def plain_model(cfg: Mapping[str, Any], width: float, shape: InputShape, device: torch.device) -> nn.Module:
    """The zoo's model (no method extension) at ``width``, seeded as a run's initial model."""
    build = model_builder(cfg, shape.num_classes, shape.in_channels, shape.image_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg["seed"], "init"))
        return build(width).to(device)


def pa3dfl_hypernetwork_mb(hp: Any, sizes: Sequence[int], num_clients: int) -> float:
    """Parameter MB of Pa3dFL's server hypernetwork (``hp``'s embedding, hidden width and encoder depth) generating
    tensors of ``sizes`` for ``num_clients`` clients (built on the meta device)."""
    from methods.pa3dfl import HyperNet

    return meta_mb(lambda: HyperNet(num_clients, list(sizes), hp))


def hypernetwork_mb(cfg: Mapping[str, Any], module: nn.Module, num_clients: int) -> float:
    """Parameter MB of pFedHN's server hypernetwork for ``module`` as target (built on the meta device)."""
    from methods.pfedhn import HyperNet

    _, hp = method_class(cfg)
    sizes = [p.numel() for n, p in module.named_parameters()
             if not (hp.personal_classifier and n.startswith("head."))]
    return meta_mb(lambda: HyperNet(num_clients, sizes, hp))


def meta_mb(build: Callable[[], nn.Module]) -> float:
    """Parameter MB of the module ``build`` makes, built on the meta device (no memory is allocated)."""
    with torch.device("meta"):
        return model_bytes(build()) / MB


# ------------------------------------------------------------------------------------------------- rows
def row_name(method: str, variant: str) -> str:
    return f"{method} ({variant})" if variant else method


def base_row(method: str, variant: str, batch_size: int, ratio: Fraction) -> dict[str, Any]:
    return {"row": row_name(method, variant), "method": method, "variant": variant,
            "paper_method": PAPER_ROW[method] or "", "batch_size": batch_size, "size_ratio": ratio_label(ratio),
            "width": None, "sparsity": None, "status": "", "params": None, "model_size_mb": None,
            "gflops_train_step": None, "gflops_forward": None, "peak_memory_mb": None, "start_memory_mb": None,
            "server_mb": None, "seconds": None, "note": ""}


def with_measurement(row: dict[str, Any], m: Measurement) -> dict[str, Any]:
    return {**row, "status": "measured", "params": m.params, "model_size_mb": m.model_size_mb,
            "gflops_train_step": m.gflops_train_step, "gflops_forward": m.gflops_forward,
            "peak_memory_mb": m.peak_memory_mb, "start_memory_mb": m.start_memory_mb, "seconds": m.seconds}


@dataclass(frozen=True)
class Options:
    """Everything a run of the measurement depends on (the CLI's arguments)."""

    methods: tuple[str, ...] = METHODS
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    size_ratios: tuple[Fraction, ...] = tuple(parse_ratio(r) for r in DEFAULT_SIZE_RATIOS)
    config: tuple[str, ...] = DEFAULT_CONFIG
    shape: InputShape = InputShape(num_classes=10, in_channels=3, image_size=32)
    device: str = "cpu"
    seed: int = 0
    num_clients: int = 100  # pFedHN's hypernetwork has one embedding per client
    table2_batch_size: int = TABLE2_BATCH_SIZE


def measure_method(name: str, opts: Options, log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """Every row of method ``name``: its variants x the batch sizes x the size ratios."""
    check_options([name], opts.batch_sizes)
    ratios = [r for r in opts.size_ratios if name not in FULL_WIDTH_ONLY or r == 1]
    if name in NOT_BUILT:
        return [{**base_row(name, "", b, r), "status": "not built",
                 "note": f"{PAPER_ROW[name]} is not measured yet (see scripts.pa3dfl.efficiency.NOT_BUILT)"}
                for b in opts.batch_sizes for r in ratios]
    device = torch.device(opts.device)
    cfg = method_config(name, opts.config, opts.seed)
    train = cfg["train"]
    kw = {"train": train, "in_channels": opts.shape.in_channels, "image_size": opts.shape.image_size,
          "num_classes": opts.shape.num_classes, "device": device, "seed": opts.seed}
    rows = []
    clients = client_models(name, cfg, ratios, opts.shape, device, opts.num_clients)
    for variant in VARIANTS.get(name, ("",)):
        if variant == "D.4":
            rows += pfedgate_d4(cfg, clients, opts, kw, log)
            continue
        for client in clients:
            client.prepare()
            for b in opts.batch_sizes:
                with (factored_flanc(client.module) if variant == "factored" else
                      pa3dfl_order(client.module, variant) if variant == "recover" else contextlib.nullcontext()):
                    m = measure(client.module, b, **kw)
                row = {**base_row(name, variant, b, client.ratio), "width": client.width, "sparsity": client.sparsity}
                row = with_measurement(row, m)
                row["server_mb"] = client.server_mb
                if name == "pfedhn":
                    row["note"] = (f"client trains the target network; server hypernetwork ({opts.num_clients} "
                                   "client embeddings) in server_mb")
                if name == "pa3dfl":
                    row["note"] = (f"decomposed model (W = U V per layer) + local head; server hypernetwork "
                                   f"({opts.num_clients} client embeddings) in server_mb")
                if name == "pfedgate":
                    row["note"] = "as implemented: zero-masked dense full model + gating layer (sparsity = r)"
                if variant == "factored":
                    row["note"] = "same layers run as basis grouped conv + 1x1 coefficient conv (authors' FLGo form)"
                if variant == "recover":
                    row["note"] = "same layers, each computed as W = U V then the layer (method.layer_order=recover)"
                rows.append(row)
                log(f"{row['row']:<20} B={b:<4} r={row['size_ratio']:<6} {m.gflops_train_step:9.3f} GFLOPs "
                    f"{m.peak_memory_mb:9.1f} MB peak {m.model_size_mb:8.2f} MB model ({m.seconds:.1f} s)")
    return rows


def pfedgate_d4(cfg: Mapping[str, Any], clients: Sequence[ClientModel], opts: Options, kw: Mapping[str, Any],
                log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Pa3dFL App. D.4: cost(r) = cost(plain model of width sqrt(r)) + [cost(pFedGate's model at sparsity 1) -
    cost(plain full model)]; model size = pFedGate's model (full model + gate) at every r."""
    gated = clients[0].module
    gated.sparsity = 1.0
    device = kw["device"]
    full = plain_model(cfg, 1.0, opts.shape, device)
    widths = {c.ratio: weakest_width(torch.tensor([float(c.ratio)], dtype=torch.float64)) for c in clients}
    plain = {w: full if w == 1.0 else plain_model(cfg, w, opts.shape, device) for w in set(widths.values())}
    rows = []
    for b in opts.batch_sizes:
        g, p = measure(gated, b, **kw), measure(full, b, **kw)
        for client in clients:
            width = widths[client.ratio]
            n = measure(plain[width], b, **kw)
            row = {**base_row("pfedgate", "D.4", b, client.ratio), "width": width, "sparsity": client.sparsity,
                   "status": "derived", "params": g.params, "model_size_mb": g.model_size_mb,
                   "seconds": g.seconds + p.seconds + n.seconds,
                   "note": "paper App. D.4: plain width-sqrt(r) model + (pFedGate at sparsity 1 - plain full model)"}
            for key in ("gflops_train_step", "gflops_forward", "peak_memory_mb", "start_memory_mb"):
                row[key] = getattr(n, key) + getattr(g, key) - getattr(p, key)
            rows.append(row)
            log(f"{row['row']:<20} B={b:<4} r={row['size_ratio']:<6} {row['gflops_train_step']:9.3f} GFLOPs "
                f"{row['peak_memory_mb']:9.1f} MB peak {row['model_size_mb']:8.2f} MB model")
    return rows


# ------------------------------------------------------------------------------------------------ paper
def load_paper(path: Path = PAPER_CSV) -> dict[tuple[str, int, str, str], tuple[float, str]]:
    """(paper method, batch size, size ratio, metric) -> (value, table); Table 2 wins where both report a value."""
    out: dict[tuple[str, int, str, str], tuple[float, str]] = {}
    with open(path, newline="") as f:
        for rec in sorted(csv.DictReader(f), key=lambda r: r["table"] == "2"):
            out[(rec["method"], int(rec["batch_size"]), rec["size_ratio"], rec["metric"])] = (float(rec["value"]),
                                                                                           rec["table"])
    return out


def paper_value(paper: Mapping[tuple[str, int, str, str], tuple[float, str]], row: Mapping[str, Any],
                metric: str) -> float | None:
    """The paper's value for ``row``; the model size (batch-independent, Table 2 only) at any batch size."""
    method, ratio = row["paper_method"], row["size_ratio"]
    if not method:
        return None
    hit = paper.get((method, int(row["batch_size"]), ratio, metric))
    if hit is None and metric == "model_size_mb":
        hit = next((v for (m, _, r, k), v in paper.items() if (m, r, k) == (method, ratio, metric)), None)
    return hit[0] if hit else None


def add_paper(rows: Sequence[dict[str, Any]], paper: Mapping[tuple[str, int, str, str], tuple[float, str]]
              ) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        extra = {f"paper_{m}": paper_value(paper, row, m) for m in METRICS}
        hit = paper.get((row["paper_method"], int(row["batch_size"]), row["size_ratio"], "flops"))
        out.append({**row, **extra, "paper_table": hit[1] if hit else ""})
    return out


# ----------------------------------------------------------------------------------------------- output
COLUMNS = ("row", "method", "variant", "paper_method", "batch_size", "size_ratio", "width", "sparsity", "status",
           "params", "model_size_mb", "gflops_train_step", "gflops_forward", "peak_memory_mb", "start_memory_mb",
           "server_mb", "seconds", "paper_table", "paper_flops", "paper_peak_memory_mb", "paper_model_size_mb", "note")


def fmt(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, str):
        return value
    v = float(value)
    if v == 0:
        return "0"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in COLUMNS})
    return buf.getvalue()


def header_info(opts: Options, cfg: Mapping[str, Any]) -> dict[str, Any]:
    device = torch.device(opts.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    model = cfg["model"]
    full = plain_model(cfg, 1.0, opts.shape, torch.device("cpu"))
    return {
        "device": f"{device} ({name})", "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "model": f"{model['name']} options {dict(model.get('options') or {})} width {model.get('width', 1.0)} "
                 f"({parameter_count(full):,} parameters at full width)",
        "input": f"{opts.shape.in_channels}x{opts.shape.image_size}x{opts.shape.image_size}, "
                 f"{opts.shape.num_classes} classes, random batch (seed {opts.seed})",
        "optimizer": {k: cfg["train"][k] for k in OPTIMIZER_KEYS},
        "config": list(opts.config),
        "flops": "torch.utils.flop_counter.FlopCounterMode over one training step (forward + backward of the "
                 "cross-entropy; the optimizer update is elementwise and not counted); matrix products and "
                 "convolutions only (elementwise, normalisation and pooling ops are not counted); 1 multiply-add = "
                 "2 FLOPs; GFLOPs = 1e9 FLOPs; torch's convolution-backward formula is corrected for grouped "
                 "convolutions (its weight gradient was counted groups times; only flanc (factored) has them). "
                 "gflops_forward: the forward pass alone.",
        "memory": ("torch.cuda.max_memory_allocated during one training step, minus what was allocated before it, "
                   "plus the model's parameters, buffers, optimizer state and the batch"
                   if device.type == "cuda" else
                   "CPU: peak of live tensor storage bytes during one training step (TorchDispatchMode tracking every "
                   "tensor an op returns until its storage dies, plus the parameters, buffers, optimizer state and "
                   "batch present at the start): parameters + gradients + optimizer state + activations saved for "
                   "backward + temporaries; no allocator caching, library workspace or CUDA context. MB = 1e6 bytes."),
        "model_size": "bytes of the client model's parameters (float32), MB = 1e6 bytes",
        "paper": PAPER_FILE,
    }


def _row_order(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    order = {m: i for i, m in enumerate(METHODS)}
    names = {(order[r["method"]], VARIANTS.get(r["method"], ("",)).index(r["variant"]), r["row"]) for r in rows}
    return [n for *_, n in sorted(names)]


def _cell(rows: Mapping[tuple[str, int, str], Mapping[str, Any]], name: str, b: int, ratio: str, key: str) -> str:
    row = rows.get((name, b, ratio))
    if row is None:
        return "-"
    if key.startswith("paper_"):  # as the paper prints it
        return "-" if row.get(key) is None else f"{row[key]:g}"
    if row["status"] == "not built":
        return "not built"
    return fmt(row.get(key))


def memory_slopes(by: Mapping[tuple[str, int, str], Mapping[str, Any]], name: str, ratio: str, low: int, high: int
                  ) -> tuple[str, str]:
    """(ours, paper) peak-memory MB per extra sample between batch sizes ``low`` and ``high``."""
    a, b = by.get((name, low, ratio)), by.get((name, high, ratio))
    out = []
    for key in ("peak_memory_mb", "paper_peak_memory_mb"):
        if a is None or b is None or a.get(key) is None or b.get(key) is None:
            out.append("not built" if a is not None and a["status"] == "not built" and not key.startswith("paper_")
                       else "-")
        else:
            out.append(fmt((b[key] - a[key]) / (high - low)))
    return out[0], out[1]


METRIC_KEYS = {"flops": "gflops_train_step", "peak_memory_mb": "peak_memory_mb", "model_size_mb": "model_size_mb"}
METRIC_TITLES = {"flops": "FLOPs of one training step (GFLOPs; paper: unit as printed, see notes)",
                 "peak_memory_mb": "Peak memory of one training step (MB)", "model_size_mb": "Model size (MB)"}


def fact(value: Any) -> Any:
    """A header value as the Markdown shows it: the optimizer's settings in :data:`OPTIMIZER_KEYS` order."""
    if isinstance(value, Mapping) and set(value) <= set(OPTIMIZER_KEYS):
        return {k: value[k] for k in OPTIMIZER_KEYS if k in value}
    return value


def efficiency_result(rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], ratios: Sequence[str],
                      batch_sizes: Sequence[int], table2_batch: int, notes: Sequence[str] = ()) -> Result:
    """Tables 2 and 8 as a result: ours beside the paper's numbers (``header["paper"]`` names their file), per
    metric, batch size and size ratio, with the ratios to FedAvg, the memory per extra sample and the server state."""
    by = {(r["row"], int(r["batch_size"]), r["size_ratio"]): r for r in rows}
    names = _row_order(rows)
    paper_of = {r["row"]: r["paper_method"] or "-" for r in rows}
    intro = ("Ours measured here; columns labelled **paper** are Pa3dFL's numbers "
             f"({header.get('paper', PAPER_FILE)}). r = size ratio (share of the full model a client can hold; "
             "width-reduction methods use width sqrt(r)).")
    facts = [f"**{key}**: {fact(header[key])}" for key in ("device", "torch", "python", "threads", "model", "input",
                                                      "optimizer", "config", "flops", "memory", "model_size",
                                                      "wall_seconds") if key in header]
    blocks = [bullets(facts, kind="facts"), heading(f"Table 2 layout (batch size {table2_batch})")]
    ratio_head = [h for r in ratios for h in (f"r={r} ours", f"r={r} paper")]
    if table2_batch in batch_sizes:
        for metric in METRICS:
            body = [[n, paper_of[n], *[c for r in ratios for c in (
                _cell(by, n, table2_batch, r, METRIC_KEYS[metric]), _cell(by, n, table2_batch, r, f"paper_{metric}"))]]
                for n in names]
            blocks += [heading(METRIC_TITLES[metric], 3), grid(["method", "paper row", *ratio_head], body, "table")]
        fedavg = by.get(("fedavg", table2_batch, "1"))
        if fedavg is not None:
            body = []
            for n in names:
                cells = []
                for r in ratios:
                    row = by.get((n, table2_batch, r))
                    for metric in ("flops", "peak_memory_mb"):
                        ours = row and row["status"] != "not built" and row.get(METRIC_KEYS[metric])
                        theirs = row and row.get(f"paper_{metric}")
                        base_p = fedavg.get(f"paper_{metric}")
                        cells += [fmt(ours / fedavg[METRIC_KEYS[metric]]) if ours else "-",
                                  fmt(theirs / base_p) if theirs and base_p else "-"]
                body.append([n, *cells])
            head = [h for r in ratios for h in (f"r={r} FLOPs ours", f"r={r} FLOPs paper", f"r={r} mem ours",
                                                 f"r={r} mem paper")]
            blocks += [heading("Relative to full-width FedAvg (unit-free: FLOPs and peak memory / FedAvg's)", 3),
                       grid(["method", *head], body, "table")]
    else:
        blocks.append(paragraph(f"(batch size {table2_batch} was not measured)"))
    blocks.append(heading("Table 8 layout (FLOPs and peak memory by batch size)"))
    for metric in ("flops", "peak_memory_mb"):
        body = [[n, str(b), *[c for r in ratios for c in (_cell(by, n, b, r, METRIC_KEYS[metric]),
                                                          _cell(by, n, b, r, f"paper_{metric}"))]]
                for n in names for b in batch_sizes]
        blocks += [heading(METRIC_TITLES[metric], 3), grid(["method", "B", *ratio_head], body, "table")]
    if len(batch_sizes) > 1:
        low, high = min(batch_sizes), max(batch_sizes)
        body = [[n, *[c for r in ratios for c in memory_slopes(by, n, r, low, high)]] for n in names]
        blocks += [heading(f"Peak memory per extra sample (MB per sample, between B={low} and B={high})", 3),
                   paragraph("What the activations saved for backward cost per sample: independent of what a "
                             "measurement counts as fixed (parameters, gradients, workspaces)."),
                   grid(["method", *ratio_head], body, "table")]
    extra = [r for r in rows if r.get("server_mb")]
    if extra:
        body = [[r["row"], r["size_ratio"], fmt(r["server_mb"])] for r in extra if r["batch_size"] == batch_sizes[0]]
        blocks += [heading("Server-side state (not on the client)", 3), grid(["method", "r", "server MB"], body,
                                                                              "table")]
    blocks += [heading("Notes"), bullets(notes, kind="notes")]
    return Result("Pa3dFL Tables 2 and 8: training cost of the capacity-heterogeneous methods", [intro], blocks)


NOTES = (
    "p-width (paper) = HeteroFL, FjORD, FedRolex and TailorFL. HeteroFL, FjORD and FedRolex train the same "
    "convolutional network at width sqrt(r) (HeteroFL and FedRolex add the scaler, an elementwise division by the "
    "width in training; FjORD has none); TailorFL the same widths plus one importance score per filter (an elementwise "
    "scaling). They are measured one by one: their counted FLOPs coincide; their peak memory nearly does (HeteroFL's "
    "and FedRolex's scaler adds short-lived temporaries; TailorFL's score scaling keeps one more activation per "
    "layer for the backward pass). FjORD's step here is one pass of the client's model; its distillation adds a "
    "pass through a sampled narrower submodel in training.",
    "flanc = our implementation (each layer's weight composed from basis x coefficients, then one convolution); "
    "flanc (factored) = the same parameters run as the authors' FLGo code runs them (grouped convolution of the input "
    "with the shared basis, then a 1x1 convolution with the coefficients). The paper's FLANC numbers (fewer FLOPs "
    "than FedAvg at full width, more at small widths) follow the factored form.",
    "pfedgate = our model as implemented (the official code's zero-masking: the dense full model runs at every "
    "sparsity, plus the gating layer and the masked copy of the weights); pfedgate (D.4) = the paper's App. D.4 "
    "accounting: the plain width-sqrt(r) model's cost + the gating overhead (pFedGate's model at sparsity 1 minus "
    "the plain full model), model size = full model + gate at every r. Our pFedGate step peaks late in the backward "
    "pass (the masked copy of every weight and its gradient), the plain model's at the end of the forward pass, so "
    "D.4's difference of peaks shrinks as the batch grows (a negative per-sample slope): its memory column is the "
    "paper's formula applied to our measurements, not a measured peak.",
    "pfedhn has no row in the paper; its client trains the target network (the zoo model at the weakest client's "
    "width, as every capacity-unaware method); the hypernetwork stays on the server (its size is listed separately).",
    "Pa3dFL is not measured yet (scripts.pa3dfl.efficiency.NOT_BUILT): its rows carry the paper's numbers only."
    if "pa3dfl" in NOT_BUILT else
    "pa3dfl = Pa3dFL's client model: every body layer decomposed into U [R1, k^2, R2] (general) and V [T/R1, S, R2] "
    "(personal) with R1 = T/16 (p_min of the Hetero setting, method.rank_width) and conv R2 = round(0.75 R1 k^2) "
    "(method.rank_scale, App. A's 'hyperparameter to scale R2 of convolution layers') capped at the layer's rank "
    "bound (T/R1) S, at width sqrt(r); U is never pruned (Eq. 10), so every client holds each layer's full U; "
    "each layer runs in the order with fewer multiply-adds for its input (method.layer_order=cheaper, the runs' "
    "default): W composed from U V (an einsum, counted), then one convolution (App. A's 'parameter recovery'), or "
    "factored (a 1x1 convolution with V, then a grouped convolution with U), which layer4 takes at 32x32, where "
    "recovering W costs R2 / (B H W) = 1.69 times the convolution (Eq. 16); pa3dfl (recover) = the same layers, "
    "each composed first (method.layer_order=recover). rank_scale 0.75 is the largest of 0.5-1 in steps of 1/8 "
    "that keeps the r = 1 step within 1.15x FedAvg's FLOPs (the paper's 1.02x; its Table 2 sizes, 0.94x FedAvg's "
    "at r = 1 and 1.12x p-width's at r = 1/4, put R2 nearer R1 k^2: our model is smaller). The step trains the "
    "local head (the global head is fixed, so only its size counts). Its server hypernetwork (conf/method/pa3dfl.yaml: "
    "embedding 64, hidden 64, 3 encoder layers; one decoder Linear(hidden, |V_l|) per layer) is in server_mb; its "
    "cost per round is Table 9 (scripts/pa3dfl/hn_cost.py).",
    "The paper's FLOPs unit did not survive the text extraction (the column header reads 'FLOPs ()'); its full-width "
    "value (188.0 at batch 128, linear in the batch size) is neither our training step nor our forward pass in "
    "GFLOPs, so compare the relative table (FLOPs / FedAvg's). The paper's FedAvg model size (30.4 MB) is also "
    "smaller than a float32 ResNet-18 (11.2M parameters = 44.7 MB); its width ratios (1/4 -> 7.6 MB) match ours.",
    "Our peak memory counts the parameters and their gradients (2 x 44.7 MB at full width) besides the "
    "activations; the paper's full-width peak (71.1 MB at batch 128) is below a 30.4 MB model's parameters + "
    "gradients + activations, so it counts less of the fixed part (and has a floor of about 17 MB at the narrowest "
    "width and batch 16, e.g. a GPU's workspaces). What the batch adds per sample agrees: see the per-sample table.",
    "Paper model sizes are from Table 2 (batch 128) and shown at every batch size in the CSV (a model's size does "
    "not depend on the batch size). Paper values at batch 128 are Table 2's where Tables 2 and 8 differ.",
)


def write_outputs(out: Path, rows: Sequence[Mapping[str, Any]], header: Mapping[str, Any], opts: Options) -> None:
    """``efficiency.md``, ``.csv`` and ``.json`` under ``out``, each written atomically."""
    layout = {"size_ratios": [ratio_label(r) for r in opts.size_ratios], "batch_sizes": list(opts.batch_sizes),
              "table2_batch_size": opts.table2_batch_size}
    write_result(out, {"header": dict(header), "notes": list(NOTES), "rows": list(rows), "layout": layout})


def write_result(out: Path, measured: Mapping[str, Any]) -> Result:
    """``efficiency.md``, ``.csv`` and ``.json`` (``measured``: its header, notes, rows and layout, and the result)
    under ``out``, each written atomically, from what was measured."""
    rows, layout = measured["rows"], measured.get("layout") or {}
    ratios = layout.get("size_ratios") or sorted(dict.fromkeys(r["size_ratio"] for r in rows), key=Fraction)
    batch_sizes = layout.get("batch_sizes") or list(dict.fromkeys(int(r["batch_size"]) for r in rows))
    result = efficiency_result(rows, measured["header"], ratios, batch_sizes,
                               layout.get("table2_batch_size", TABLE2_BATCH_SIZE), measured["notes"])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "efficiency.md", to_markdown(result))
    atomic_write_text(out / "efficiency.csv", to_csv(rows))
    atomic_write_json(out / "efficiency.json", {**measured, "result": result.as_json()})
    return result


def run(opts: Options, out: Path, log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """Measure every method of ``opts`` and write the three files; returns the rows."""
    check_options(opts.methods, opts.batch_sizes)
    started = time.perf_counter()
    header = header_info(opts, method_config("fedavg", opts.config, opts.seed))
    rows: list[dict[str, Any]] = []
    for name in opts.methods:
        rows += measure_method(name, opts, log)
    rows = add_paper(rows, load_paper())
    header = {**header, "wall_seconds": round(time.perf_counter() - started, 1)}
    write_outputs(out, rows, header, opts)
    return rows


# ------------------------------------------------------------------------------------------------ CLI
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scripts.pa3dfl.efficiency", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/pa3dfl"), help="output folder (default: %(default)s)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), metavar="NAME",
                   help=f"methods to measure (default: all of {', '.join(METHODS)})")
    p.add_argument("--batch-sizes", nargs="+", default=list(DEFAULT_BATCH_SIZES), metavar="B",
                   help="batch sizes (default: %(default)s, Pa3dFL Table 8)")
    p.add_argument("--size-ratios", nargs="+", default=list(DEFAULT_SIZE_RATIOS), metavar="R",
                   help="client size ratios r (default: %(default)s, Pa3dFL Table 2)")
    p.add_argument("--table2-batch-size", type=int, default=TABLE2_BATCH_SIZE,
                   help="batch size of the Table 2 layout (default: %(default)s)")
    p.add_argument("--config", nargs="+", default=list(DEFAULT_CONFIG), metavar="OVERRIDE",
                   help="Hydra overrides of every method's config; NAME:key=value for method NAME only "
                        "(default: %(default)s)")
    p.add_argument("--num-classes", type=int, default=10, help="classes (default: %(default)s, CIFAR-10)")
    p.add_argument("--in-channels", type=int, default=3, help="input channels (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=32, help="input height = width (default: %(default)s)")
    p.add_argument("--num-clients", type=int, default=100,
                   help="clients of the federation, for pFedHN's server hypernetwork size (default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the models and the batch (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--rerender", action="store_true",
                   help="measure nothing: rewrite the Markdown, CSV and result of <out>/efficiency.json from its rows")
    return p


def options_from(args: argparse.Namespace) -> Options:
    """Checked :class:`Options` from parsed arguments; a bad value raises ``ValueError`` naming it."""
    sizes = []
    for b in args.batch_sizes:
        try:
            sizes.append(int(b))
        except (TypeError, ValueError):
            raise ValueError(f"batch size {b!r} is invalid: batch sizes must be positive integers") from None
    check_options(args.methods, sizes)
    if args.table2_batch_size < 1:
        raise ValueError(f"--table2-batch-size {args.table2_batch_size} is invalid: it must be a positive integer")
    for key in ("num_classes", "in_channels", "image_size", "num_clients", "threads"):
        if getattr(args, key) < 1:
            raise ValueError(f"--{key.replace('_', '-')} {getattr(args, key)} is invalid: it must be >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {args.device} is invalid: use cpu, cuda or cuda:N")
    ratios = tuple(dict.fromkeys(parse_ratio(r) for r in args.size_ratios))
    return Options(methods=tuple(dict.fromkeys(args.methods)), batch_sizes=tuple(dict.fromkeys(sizes)),
                   size_ratios=ratios, config=tuple(args.config),
                   shape=InputShape(args.num_classes, args.in_channels, args.image_size), device=args.device,
                   seed=args.seed, num_clients=args.num_clients, table2_batch_size=args.table2_batch_size)


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.rerender:
        return rerender_from_json(args.out / "efficiency.json", lambda measured: write_result(args.out, measured))
    try:
        opts = options_from(args)
    except ValueError as err:
        p.error(str(err))
    torch.set_num_threads(args.threads)
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    started = time.perf_counter()
    try:
        run(opts, args.out, log)
    except ValueError as err:  # a bad config override or model option
        print(f"error: {err}", file=sys.stderr)
        return 2
    log(f"wrote {args.out / 'efficiency.md'}, .csv, .json in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
