"""The hooks a method overrides (:class:`Method`) and the registry of methods (:data:`METHODS`).

A method is a subclass of :class:`Method` registered with ``@METHODS.register("name")``. The engine owns
the round loop, client sampling, data, evaluation, records and checkpoints; the method owns the server
state (plain tensors in ``self.state``, checkpointed as a whole) and answers a handful of hooks:

=================  ==========================================================================
hook               called
=================  ==========================================================================
``extend_model``   class method, before the worker is built: add heads or replace layers of the client model
``setup``          once, with the initial flat model (not on resume: state comes from the checkpoint)
``begin_round``    once per round with the sampled participants, before any training
``client_worker``  per client and stage (train, pre, post): which worker (width) serves it (default: full)
``client_model``   per participant: the flat model the client starts local training from
``train_client``   per participant: local training on its worker (default: :meth:`local_sgd`)
``train_clients``  with ``train.batched_clients``: the participants of one worker trained together (default:
                   :meth:`stacked_sgd`; only methods that declare ``trains_batched``, bench.core.batched)
``loss``           per batch inside :meth:`local_sgd` (default: cross-entropy)
``before_step``    per batch after ``backward``, before the optimizer step (gradient edits)
``before_step_batched``  the same edits on a batched step's stacked gradients (``train.batched_clients``)
``upload``         per participant after training: the server receives what it needs
``aggregate``      once per round after every participant uploaded
``eval_model``     per evaluated client and stage (with the round and its lr): the flat model to evaluate
``predict``        per evaluation batch (default: the module's logits)
``metrics``        once per round: method-specific numbers to record
=================  ==========================================================================

Workers are stateless: one module (``FlatModel``) per width is reused for every client
(``Federation.worker_for``); whatever must survive a round lives in ``self.state``, which may nest dicts,
tensors, server-side ``nn.Module``s and their optimizers: all of it is checkpointed and restored. Local
optimizers are built afresh for every training; with ``train.keep_optimizer_state`` each client's SGD momentum
is kept in ``self.state`` between its trainings instead (:meth:`Method.kept_optimizer`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batched import StackedBatch, stacked_sgd
from bench.core.capacity import WidthRule
from bench.core.client_state import REF_KEY, ClientTables
from bench.core.federation import ClientRound, Federation
from bench.core.flat import FlatModel
from common.registry import Registry

METHODS: Registry[type[Method]] = Registry("method")
#: the key of ``Method.state`` under which ``train.keep_optimizer_state`` keeps the clients' optimizer states
KEPT_OPTIMIZERS = "kept_optimizers"


@dataclass(frozen=True)
class NoHyperparameters:
    """For methods without hyperparameters of their own."""


class Method:
    """Base class of every method; subclasses override hooks (see the module docstring)."""

    Hyper: ClassVar[type] = NoHyperparameters
    #: True for methods that give each client a model its capacity allows (``client_width``); the others run
    #: the widest model the weakest client can run on every client (bench.core.capacity.weakest_width)
    capacity_aware: ClassVar[bool] = False
    #: non-finite values this method tolerates ("loss", "model"); any other stops the run as diverged
    tolerates_nonfinite: ClassVar[frozenset[str]] = frozenset()
    #: stages this method is evaluated at ("pre": after local training; "post": after aggregation)
    eval_stages: ClassVar[tuple[str, ...]] = ("pre", "post")
    #: True when the locally trained model is the model the client holds (nothing is aggregated): only ``post``
    #: is evaluated and its results also answer ``pre`` protocols
    pre_is_post: ClassVar[bool] = False
    #: the hyperparameter giving the epochs a ``post`` evaluation first fine-tunes the client's model on its
    #: training data (FedBABU, PerFedMask), or None; tables name it in their protocol lines
    post_finetune: ClassVar[str | None] = None
    #: splits ("train", "test") this method copes with being empty on some clients; a partition leaving a client
    #: without any other split is refused before the run starts (bench.builder.check_clients_nonempty)
    empty_splits: ClassVar[frozenset[str]] = frozenset()
    #: True when this class (not inherited: bench.core.batched.declares_batched) can train its participants
    #: together (``train.batched_clients``): see :mod:`bench.core.batched` for what that requires
    trains_batched: ClassVar[bool] = False

    def __init__(self, fed: Federation, hp: Any) -> None:
        self.fed = fed
        self.hp = hp
        self.state: dict[str, Any] = {}

    # ----------------------------------------------------------------- hooks
    @classmethod
    def extend_model(cls, model: nn.Module, hp: Any, width: float = 1.0) -> nn.Module:
        """The client model this method trains, built from the zoo's ``model`` (add a second head, replace
        layers, wrap it). Called under the seeded initialisation, for the full worker (``width`` 1) and every
        narrower one (``model`` is then already narrow; ``width`` tells by how much, e.g. for a scaler).
        Default: the model as it is."""
        return model

    def setup(self, init: torch.Tensor) -> None:
        raise NotImplementedError

    def begin_round(self, round_: int, participants: Sequence[int]) -> None:
        """Prepare per-round server buffers. Default: nothing."""

    def client_width(self, cid: int) -> float:
        """The width of client ``cid``'s model relative to the built full model (recorded in the summary; a
        capacity-aware method derives it from ``fed.capacities``). Default: 1."""
        return 1.0

    def client_cost(self, cid: int) -> float:
        """The share of the built full model client ``cid`` trains, the quantity p^2 <= r_i bounds (recorded in the
        summary). Default: ``client_width(cid)^2``."""
        return self.client_width(cid) ** 2

    def capacity_rule(self) -> str:
        """How this method sized each client's model, in words (recorded in the summary; tables show it). Default:
        the width rule in ``self.width_rule`` for a capacity-aware method, the weakest client's for the others."""
        if not self.capacity_aware:
            return "the weakest client's width on every client (capacity-unaware)"
        rule = getattr(self, "width_rule", None)
        return rule.label() if isinstance(rule, WidthRule) else "the method's own"

    def client_worker(self, cid: int, stage: str) -> FlatModel:
        """The worker that serves client ``cid`` at ``stage`` ("train", "pre" or "post"); every vector the
        method hands out for that client and stage must fit its layout. Default: the full-width worker."""
        return self.fed.worker

    def client_model(self, cid: int) -> torch.Tensor:
        raise NotImplementedError

    def train_client(self, task: ClientRound, model: FlatModel) -> float:
        return self.local_sgd(task, model)

    def train_clients(self, tasks: Sequence[ClientRound], models: torch.Tensor, worker: FlatModel) -> list[float]:
        """The batched counterpart of :meth:`train_client` (``train.batched_clients``): train the rows of
        ``models`` [K, D] (each client's start, in ``worker``'s layout) in place, row k on ``tasks[k]``; returns
        the clients' mean batch losses. Default: :meth:`stacked_sgd`."""
        return self.stacked_sgd(tasks, models, worker)

    def loss(self, task: ClientRound, model: FlatModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model.module(x), y)

    def before_step(self, task: ClientRound, model: FlatModel) -> None:
        """Edit gradients in place (proximal terms, gradient masks). Default: nothing."""

    def before_step_batched(self, batch: StackedBatch) -> None:
        """:meth:`before_step`'s edits on a batched step (``batch.grads`` [k, T], in place). Default: nothing."""

    def upload(self, task: ClientRound, model: FlatModel) -> None:
        raise NotImplementedError

    def aggregate(self, round_: int, participants: Sequence[int]) -> None:
        raise NotImplementedError

    def eval_model(self, cid: int, stage: str, model: FlatModel, round_: int, lr: float) -> torch.Tensor:
        """``pre``: the worker as trained (right after upload); ``post``: the model the client holds. ``model``
        is the client's worker for the stage; ``round_`` and ``lr`` are the round's (for evaluation-time
        training such as fine-tuning)."""
        return model.vector if stage == "pre" else self.client_model(cid)

    def predict(self, cid: int, model: FlatModel, x: torch.Tensor) -> torch.Tensor:
        return model.module(x)

    def metrics(self, round_: int) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """``self.state`` for the checkpoint: tensors and plain values as they are, nested dicts recursively,
        server-side modules and optimizers as their own state dicts, per-client tables kept in files as references
        to snapshots of those files (:meth:`bench.core.client_state.ClientTables.export`)."""
        tables = self.fed.tables
        if tables is None or not tables.files:
            return _export_state(self.state)
        with tables.exporting():
            return _export_state(self.state, tables)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a checkpointed state. Modules and optimizers must already exist in ``self.state`` (create
        them in ``__init__``); their saved states are loaded into them."""
        self.state = _import_state(self.state, state, self.fed.device, self.fed.tables)

    # --------------------------------------------------------------- helpers
    def local_sgd(
        self,
        task: ClientRound,
        model: FlatModel,
        *,
        epochs: int | None = None,
        params: Iterable[nn.Parameter] | None = None,
        lr: float | None = None,
        optim: Mapping[str, Any] | None = None,
        kept_as: str | None = "model",
    ) -> float:
        """Mini-batch training of ``params`` (default: all) for ``epochs``; returns the mean batch loss.

        ``optim`` overrides entries of the ``train`` config (e.g. momentum) for this call only. With
        ``train.keep_optimizer_state`` the optimizer continues from the client's state kept under ``kept_as`` (one
        per client, name and trained parameters: :meth:`kept_optimizer`); ``kept_as=None`` keeps none
        (evaluation-time fine-tuning)."""
        cfg = {**self.fed.train, **(optim or {})}
        trainable = list(model.parameters() if params is None else params)
        optimizer = local_optimizer(trainable, cfg, task.lr if lr is None else lr)
        chosen = {id(p) for p in trainable}
        frozen = [p for p in model.parameters() if id(p) not in chosen and p.requires_grad]
        for p in frozen:  # no gradient work for what is not trained
            p.requires_grad_(False)
        set_train_mode(model.module, cfg.get("norm_mode", "train"), task.round)
        total, batches = torch.zeros((), device=self.fed.device), 0
        try:
            with self.kept_optimizer(kept_as, task.cid, optimizer, model, trainable):
                for _ in range(cfg["epochs"] if epochs is None else epochs):
                    for x, y in task.data.batches(
                        "train", cfg["batch_size"], task.generator, drop_last=cfg.get("drop_last", False)
                    ):
                        optimizer.zero_grad(set_to_none=True)
                        loss = self.loss(task, model, x, y)
                        loss.backward()
                        self.before_step(task, model)
                        if cfg.get("grad_clip"):
                            nn.utils.clip_grad_norm_(trainable, cfg["grad_clip"])
                        optimizer.step()
                        total += loss.detach()
                        batches += 1
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return float(total) / max(batches, 1)

    @contextlib.contextmanager
    def kept_optimizer(self, name: str | None, cid: int, optimizer: torch.optim.Optimizer | PlainSGD,
                       model: FlatModel, params: Sequence[nn.Parameter]) -> Iterator[None]:
        """With ``train.keep_optimizer_state``: client ``cid``'s momentum buffers of ``params`` (parameters of
        ``model``) kept under ``name`` are loaded into ``optimizer`` (a torch SGD) before the block and stored back
        after it, so that the client's optimizer continues from where its previous training left it instead of
        starting afresh (a parameter that never took a step keeps torch's start: no buffer, then the first
        gradient). One state per client, ``name`` and parameter set (positions in ``model`` and sizes): a
        ``Federation.client_table`` of momentum buffers in ``self.state[KEPT_OPTIMIZERS]``, so checkpointed,
        restored and bounded like every per-client table. A no-op when the option is off, ``name`` is None or the
        optimizer has no momentum (no state to keep)."""
        if (name is None or not self.fed.train.get("keep_optimizer_state", False)
                or not isinstance(optimizer, torch.optim.SGD)
                or not any(group["momentum"] for group in optimizer.param_groups)):
            yield
            return
        position = {id(p): i for i, p in enumerate(model.parameters())}
        where = [position[id(p)] for p in params]
        sizes = [p.numel() for p in params]
        span = "all" if where == list(range(len(position))) else ",".join(map(str, where))
        key = f"{name}:{span}/{sum(sizes)}"
        store = self.state.setdefault(KEPT_OPTIMIZERS, {})
        if key not in store:
            store[key] = {"momentum": self.fed.client_table(params[0].new_zeros(sum(sizes))),
                          "started": torch.zeros(self.fed.num_clients, len(sizes), dtype=torch.bool)}
        kept = store[key]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for i, (p, start) in enumerate(zip(params, starts, strict=True)):
            if kept["started"][cid, i]:
                optimizer.state[p]["momentum_buffer"] = kept["momentum"][cid, start:start + sizes[i]].view_as(p).clone()
        yield
        for i, (p, start) in enumerate(zip(params, starts, strict=True)):
            buffer = optimizer.state[p].get("momentum_buffer") if p in optimizer.state else None
            if buffer is not None:
                kept["momentum"][cid, start:start + sizes[i]] = buffer.reshape(-1)
                kept["started"][cid, i] = True

    def stacked_sgd(
        self,
        tasks: Sequence[ClientRound],
        models: torch.Tensor,
        worker: FlatModel,
        *,
        epochs: int | None = None,
        params: Iterable[nn.Parameter] | None = None,
        lr: float | None = None,
        optim: Mapping[str, Any] | None = None,
    ) -> list[float]:
        """:meth:`local_sgd` of every row of ``models`` [K, D] at once (``params`` are ``worker``'s parameters to
        train); the same draws and, up to the order of floating-point sums, the same results
        (:func:`bench.core.batched.stacked_sgd`)."""
        cfg = {**self.fed.train, **(optim or {})}
        set_train_mode(worker.module, cfg.get("norm_mode", "train"), tasks[0].round)
        return stacked_sgd(self, tasks, models, worker, cfg, tasks[0].lr if lr is None else lr,
                           cfg["epochs"] if epochs is None else epochs, params)

    def weights(self, clients: Sequence[int]) -> torch.Tensor:
        """Aggregation weights n_k / sum n_k over ``clients`` (float32 on the device)."""
        n = self.fed.train_sizes[list(clients)]
        return (n / n.sum()).to(dtype=torch.float32, device=self.fed.device)


def _export_state(node: Any, tables: ClientTables | None = None) -> Any:
    if isinstance(node, nn.Module | torch.optim.Optimizer):
        return node.state_dict()
    if isinstance(node, dict):
        return {k: _export_state(v, tables) for k, v in node.items()}
    if tables is not None and tables.is_file(node):
        return tables.export(node)
    return node


def _import_state(current: Any, saved: Any, device: torch.device, tables: ClientTables | None = None) -> Any:
    if isinstance(current, nn.Module | torch.optim.Optimizer):
        current.load_state_dict(saved)
        return current
    if isinstance(saved, Mapping) and REF_KEY in saved:
        if tables is None:
            raise ValueError("this checkpoint keeps a per-client table in a file: resume it with "
                             "client_state.memory_mb set (any value), as when it was written")
        return tables.restore(saved)
    if isinstance(saved, Mapping):
        here = current if isinstance(current, dict) else {}
        return {k: _import_state(here.get(k), v, device, tables) for k, v in saved.items()}
    return saved.to(device) if torch.is_tensor(saved) else saved



def evaluated_stages(method: type[Method] | Method, chosen: Sequence[str] | None) -> tuple[str, ...]:
    """The stages a run evaluates each evaluation round: the method's ``eval_stages``, or (``eval.stages``) those of
    them named in ``chosen``, in the method's order."""
    return tuple(method.eval_stages) if chosen is None else tuple(s for s in method.eval_stages if s in chosen)


def scored_stage(method: type[Method] | Method, stage: str) -> str:
    """The stage whose records answer a protocol of ``stage``: ``post`` for a method that records only ``post``
    (``pre_is_post``), else ``stage`` itself."""
    return "post" if method.pre_is_post else stage


def make_optimizer(params: list[nn.Parameter], cfg: Mapping[str, Any], lr: float) -> torch.optim.Optimizer:
    """The local optimizer named by ``cfg['optimizer']`` (re-created every round, so no state leaks)."""
    name = cfg["optimizer"]
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=cfg.get("momentum", 0.0), weight_decay=cfg.get("weight_decay", 0.0),
            nesterov=cfg.get("nesterov", False),
        )
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.get("weight_decay", 0.0))
    raise ValueError(f"train.optimizer={name!r} is not supported; use 'sgd' or 'adam'")


class PlainSGD:
    """SGD without momentum, weight decay or Nesterov on the CPU: ``p -= lr * grad`` for each parameter with a
    gradient, the very operation ``torch.optim.SGD`` runs there (its single-tensor path, ``param.add_(grad,
    alpha=-lr)`` under ``no_grad``), so the same bits, without its machinery: the first torch optimizer of a
    process imports ``torch._dynamo`` (0.9 CPU s), and every step runs its hooks and profiling wrappers."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float) -> None:
        self.params, self.lr = list(params), float(lr)

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: D102
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:  # noqa: D102
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


def local_optimizer(params: list[nn.Parameter], cfg: Mapping[str, Any], lr: float) -> torch.optim.Optimizer | PlainSGD:
    """The optimizer of one local training (:meth:`Method.local_sgd`): :class:`PlainSGD` for plain SGD on the CPU
    (on other devices torch's SGD may take its multi-tensor path), else :func:`make_optimizer`'s."""
    plain = (cfg["optimizer"] == "sgd" and cfg.get("momentum", 0.0) == 0 and cfg.get("weight_decay", 0.0) == 0
             and not cfg.get("nesterov", False))
    if plain and all(p.device.type == "cpu" for p in params):
        return PlainSGD(params, lr)
    return make_optimizer(params, cfg, lr)


#: ``train.norm_mode``: the mode of the normalisation layers with running statistics during local training
NORM_MODES = ("train", "eval", "eval_after_round_1")


def set_train_mode(module: nn.Module, norm_mode: str, round_: int) -> None:
    """Put ``module`` in training mode, except its normalisation layers with running statistics (BatchNorm) under
    ``norm_mode`` ``eval`` (always) or ``eval_after_round_1`` (from round 2 on): those normalise with their
    running statistics and do not update them. ``eval_after_round_1`` is the official FedSelect code
    (lapisrocks/fedselect ``fedselect.py``: ``evaluate()`` calls ``model.eval()``, nothing calls ``train()``, so
    only the first round trains in training mode); ``train`` is ordinary training."""
    if norm_mode not in NORM_MODES:
        raise ValueError(f"train.norm_mode={norm_mode!r} is invalid: use one of {list(NORM_MODES)}")
    module.train()
    if norm_mode == "eval" or (norm_mode == "eval_after_round_1" and round_ > 1):
        for layer in module.modules():
            if isinstance(layer, nn.modules.batchnorm._NormBase) and layer.track_running_stats:
                layer.eval()



def hyperparameters(method_cls: type[Method], values: Mapping[str, Any]) -> Any:
    """Build ``method_cls.Hyper`` from config values; unknown or missing names are errors."""
    fields = {f.name for f in dataclasses.fields(method_cls.Hyper)}
    unknown = set(values) - fields
    missing = {f.name for f in dataclasses.fields(method_cls.Hyper)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING} - set(values)
    name = getattr(method_cls, "__name__", "method")
    if unknown:
        raise ValueError(f"method {name} has no hyperparameter(s) {sorted(unknown)}; it takes {sorted(fields)}")
    if missing:
        raise ValueError(f"method {name} needs hyperparameter(s) {sorted(missing)} in conf/method/*.yaml")
    return method_cls.Hyper(**values)
