"""The federated training engine and the hooks a method overrides.

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
tensors, server-side ``nn.Module``s and their optimizers: all of it is checkpointed and restored.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from bench.core.batched import StackedBatch, stacked_sgd
from bench.core.capacity import WidthRule
from bench.core.client_state import REF_KEY, ClientTables
from bench.core.data import ClientData, FederatedData
from bench.core.flat import FlatModel
from bench.core.records import RunDir
from bench.core.summary import early_stop, eval_record, summarize
from common.registry import Registry
from common.seeding import derive_seed, generator

METHODS: Registry[type[Method]] = Registry("method")


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
            full = self._workers[1.0]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(derive_seed(0, "worker", width))
                module = self._build(width)
            self._workers[width] = FlatModel(module.to(full.vector.device))
        return self._workers[width]


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
        if self.workers is None:
            raise ValueError("this federation has no worker factory: build it with bench.builder")
        return self.workers(width)

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
    ) -> float:
        """Mini-batch training of ``params`` (default: all) for ``epochs``; returns the mean batch loss.

        ``optim`` overrides entries of the ``train`` config (e.g. momentum) for this call only."""
        cfg = {**self.fed.train, **(optim or {})}
        trainable = list(model.parameters() if params is None else params)
        optimizer = make_optimizer(trainable, cfg, task.lr if lr is None else lr)
        chosen = {id(p) for p in trainable}
        frozen = [p for p in model.parameters() if id(p) not in chosen and p.requires_grad]
        for p in frozen:  # no gradient work for what is not trained
            p.requires_grad_(False)
        set_train_mode(model.module, cfg.get("norm_mode", "train"), task.round)
        total, batches = torch.zeros((), device=self.fed.device), 0
        try:
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


@torch.no_grad()
def evaluate(
    method: Method, model: FlatModel, data: ClientData, split: str, batch_size: int
) -> tuple[int, float, int]:
    """(correct, summed loss, count) of the model currently in the worker on one client's split."""
    model.module.eval()
    correct = torch.zeros((), dtype=torch.long, device=model.vector.device)
    loss = torch.zeros((), dtype=torch.float64, device=model.vector.device)
    for x, y in data.batches(split, batch_size, shuffle=False, augment=False):
        logits = method.predict(data.cid, model, x)
        loss += F.cross_entropy(logits, y, reduction="sum").double()
        correct += (logits.argmax(1) == y).sum()
    return int(correct), float(loss), data.size(split)


class Diverged(RuntimeError):
    """A participant's training loss or trained model is not finite."""

    def __init__(self, round_: int, cid: int, what: str, value: float) -> None:
        super().__init__(f"diverged in round {round_} on client {cid}: its {what} is {value} (not finite); lower "
                         "train.lr, clip gradients (train.grad_clip) or check the method's hyperparameters")
        self.round, self.client, self.what, self.value = round_, cid, what, value

    def record(self) -> dict[str, Any]:
        return {"kind": "diverged", "round": self.round, "client": self.client, "what": self.what,
                "value": str(self.value), "message": str(self)}


def check_finite(method: Method, task: ClientRound, loss: float, worker: FlatModel) -> None:
    """Raise :class:`Diverged` if the loss or the trained model is not finite (unless the method tolerates it)."""
    if "loss" not in method.tolerates_nonfinite and not math.isfinite(loss):
        raise Diverged(task.round, task.cid, "training loss", loss)
    if "model" not in method.tolerates_nonfinite and not bool(torch.isfinite(worker.vector).all()):
        bad = float(worker.vector[~torch.isfinite(worker.vector)][0])
        raise Diverged(task.round, task.cid, "trained model", bad)


class ClientCallback(Protocol):
    def __call__(self, task: ClientRound, worker: FlatModel) -> None: ...


class RoundCallback(Protocol):
    def on_round(self, round_: int, records: Sequence[Mapping[str, Any]]) -> None: ...
    def on_end(self, summary: Mapping[str, Any]) -> None: ...


@dataclass
class EngineConfig:
    rounds: int
    participation: float
    eval_every: int
    eval_batch_size: int
    checkpoint_every_rounds: int
    checkpoint_every_seconds: float
    seed: int
    #: stop when the validation accuracy of ``stop_stage`` (``stop_weighting``) has not improved for more than this
    #: many rounds (``eval.early_stop``; bench.core.summary.early_stop); None: run every round
    early_stop: int | None = None
    stop_stage: str = "post"
    stop_weighting: str = "unweighted"

    def __post_init__(self) -> None:
        rules = [
            ("rounds", self.rounds, self.rounds >= 1, ">= 1"),
            ("participation", self.participation, 0.0 < self.participation <= 1.0, "in (0, 1]"),
            ("eval.every", self.eval_every, self.eval_every >= 1, ">= 1"),
            ("eval.batch_size", self.eval_batch_size, self.eval_batch_size >= 1, ">= 1"),
            ("checkpoint.every_rounds", self.checkpoint_every_rounds, self.checkpoint_every_rounds >= 1, ">= 1"),
        ]
        if self.early_stop is not None:
            whole = isinstance(self.early_stop, int) and not isinstance(self.early_stop, bool)
            rules.append(("eval.early_stop", self.early_stop, whole and self.early_stop >= 1, "null or an int >= 1"))
        for key, value, ok, allowed in rules:
            if not ok:
                raise ValueError(f"{key}={value!r} is invalid: it must be {allowed}")


class Engine:
    """Runs the rounds of one method on one federated dataset, with records and resume."""

    def __init__(
        self,
        cfg: EngineConfig,
        data: FederatedData | None,
        method: Method,
        run: RunDir | None,
        config_hash: str,
        callbacks: Sequence[RoundCallback] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg, self.data, self.method, self.run_dir = cfg, data, method, run
        self.config_hash = config_hash
        self.callbacks = list(callbacks)
        self.clock = clock
        self.num_clients = method.fed.num_clients
        self.num_participants = max(1, math.floor(cfg.participation * self.num_clients + 0.5))

    def participants(self, round_: int) -> list[int]:
        if self.num_participants == self.num_clients:
            return list(range(self.num_clients))
        perm = torch.randperm(self.num_clients, generator=generator(self.cfg.seed, "sample", round_))
        return sorted(perm[: self.num_participants].tolist())

    def is_eval_round(self, round_: int) -> bool:
        return round_ % self.cfg.eval_every == 0 or round_ == self.cfg.rounds

    def run(self) -> list[dict[str, Any]]:
        """Train from the last checkpoint (or from scratch) to the last round; returns the summary results."""
        if self.run_dir is None:
            raise ValueError("Engine.run needs a run directory (Engine.round alone does not)")
        state = self.run_dir.load_checkpoint(self.config_hash)
        if state is None:
            self.method.setup(self.method.fed.worker.read())
            start = 0
        else:
            self.method.load_state_dict(state["method"])
            start = int(state["round"])
        last_save = self.clock()
        watched = [r for r in self.run_dir.records() if self.stop_watches(r)] if start else []
        for round_ in range(start + 1, self.cfg.rounds + 1):
            if self.stopped(watched):
                break  # resumed from the checkpoint of the round it stopped at
            records = self.round(round_)
            self.run_dir.append_records(records)
            for cb in self.callbacks:
                cb.on_round(round_, records)
            watched += [r for r in records if self.stop_watches(r)]
            stopping = self.stopped(watched)
            due = round_ % self.cfg.checkpoint_every_rounds == 0 or round_ == self.cfg.rounds or stopping
            if due or self.clock() - last_save >= self.cfg.checkpoint_every_seconds:
                self.run_dir.save_checkpoint(round_, self.method.state_dict(), self.config_hash)
                last_save = self.clock()
            if stopping:
                break
        return summarize(self.run_dir.records(), pre_is_post=self.method.pre_is_post)

    def stop_stage(self) -> str:
        """The stage early stopping watches: the configured one, ``post`` for a method that records only ``post``
        (``pre_is_post``: its ``post`` results answer ``pre``)."""
        return "post" if self.method.pre_is_post else self.cfg.stop_stage

    def stop_watches(self, record: Mapping[str, Any]) -> bool:
        """Whether early stopping reads ``record`` (never without ``eval.early_stop``)."""
        return (self.cfg.early_stop is not None and record.get("kind") == "eval" and record["split"] == "val"
                and record["stage"] == self.stop_stage())

    def stopped(self, watched: Sequence[Mapping[str, Any]]) -> bool:
        """Whether early stopping ends the run after the validation records ``watched``."""
        return bool(watched) and early_stop(watched, self.cfg.early_stop or 0, self.stop_stage(),
                                            self.cfg.stop_weighting)["stopped_round"] is not None

    def round(self, round_: int, on_client: ClientCallback | None = None,
              evaluate: bool | None = None) -> list[dict[str, Any]]:
        """One round: local training of the participants, aggregation, evaluation; returns its records.
        ``on_client(task, worker)`` sees each participant's trained worker before its upload; ``evaluate``
        overrides the evaluation schedule (scripts that only train). An engine without data (a federation built
        for cost measurements) runs rounds with ``evaluate=False`` and a ``train_client`` that needs no data."""
        method = self.method
        evaluating = self.is_eval_round(round_) if evaluate is None else evaluate
        if evaluating and self.data is None:
            raise ValueError(f"round {round_} evaluates, but this engine has no data: call round(t, evaluate=False)")
        lr = method.fed.lr_at(round_)
        clients = self.participants(round_)
        losses, pre = [], []
        method.begin_round(round_, clients)
        together = bool(method.fed.train.get("batched_clients", False))
        trained = self.train_together(round_, clients, lr) if together else self.train_in_turn(round_, clients, lr)
        for task, worker, loss in trained:
            losses.append(loss)
            check_finite(method, task, losses[-1], worker)
            if on_client is not None:
                on_client(task, worker)
            method.upload(task, worker)
            if evaluating and "pre" in method.eval_stages:
                pre.append(self.evaluate_client(task.cid, "pre", round_, lr))
            method.fed.client_step()
        method.aggregate(round_, clients)
        method.fed.release_tables()
        records: list[dict[str, Any]] = [
            {"kind": "train", "round": round_, "clients": clients, "loss": losses,
             "mean_loss": sum(losses) / len(losses), "lr": lr}
        ]
        extra = method.metrics(round_)
        if extra:
            records.append({"kind": "method", "round": round_, **extra})
        if evaluating:
            if pre:
                records += self.stage_records(round_, "pre", clients, pre)
            if "post" in method.eval_stages:
                everyone = list(range(self.num_clients))
                post = []
                for cid in everyone:
                    post.append(self.evaluate_client(cid, "post", round_, lr))
                    method.fed.client_step()
                records += self.stage_records(round_, "post", everyone, post)
        return records

    def task(self, cid: int, round_: int, start: torch.Tensor, lr: float) -> ClientRound:
        data = self.data.client(cid) if self.data is not None else None
        return ClientRound(cid, round_, data, generator(self.cfg.seed, "train", round_, cid), start, lr)

    def train_in_turn(self, round_: int, clients: Sequence[int], lr: float
                      ) -> Iterator[tuple[ClientRound, FlatModel, float]]:
        """Each participant trained on its worker, one after another: (task, trained worker, loss) per participant,
        each yielded (and uploaded by the caller) before the next one starts."""
        for cid in clients:
            worker = self.method.client_worker(cid, "train")
            start = self.method.client_model(cid)
            worker.load(start)
            task = self.task(cid, round_, start, lr)
            yield task, worker, self.method.train_client(task, worker)

    def train_together(self, round_: int, clients: Sequence[int], lr: float
                       ) -> Iterator[tuple[ClientRound, FlatModel, float]]:
        """``train.batched_clients``: the participants of each worker trained as one batch
        (:meth:`Method.train_clients`), then yielded one by one in participant order, each loaded in its worker."""
        method = self.method
        by_worker: dict[int, tuple[FlatModel, list[int]]] = {}
        for cid in clients:
            worker = method.client_worker(cid, "train")
            by_worker.setdefault(id(worker), (worker, []))[1].append(cid)
        done: dict[int, tuple[ClientRound, FlatModel, torch.Tensor, float]] = {}
        for worker, group in by_worker.values():
            starts = torch.stack([method.client_model(cid) for cid in group])
            tasks = [self.task(cid, round_, starts[k], lr) for k, cid in enumerate(group)]
            models = starts.clone()
            group_losses = method.train_clients(tasks, models, worker)
            for k, task in enumerate(tasks):
                done[task.cid] = (task, worker, models[k], group_losses[k])
        for cid in clients:
            task, worker, vector, loss = done.pop(cid)
            worker.load(vector)
            yield task, worker, loss

    def evaluate_client(self, cid: int, stage: str, round_: int, lr: float) -> dict[str, tuple[int, float, int]]:
        """Evaluate client ``cid`` at ``stage`` on the method's worker for that stage. At ``pre`` that worker
        still holds the client's trained model when it is the training worker (the default ``eval_model``
        returns it); a method serving ``pre`` with another worker returns the vector in ``eval_model``."""
        worker = self.method.client_worker(cid, stage)
        vector = self.method.eval_model(cid, stage, worker, round_, lr)
        if vector is not worker.vector:
            worker.load(vector)
        data = self.data.client(cid)
        splits = ("test", "val") if data.size("val") else ("test",)
        return {s: evaluate(self.method, worker, data, s, self.cfg.eval_batch_size) for s in splits}

    def stage_records(
        self, round_: int, stage: str, clients: list[int], results: list[dict[str, tuple[int, float, int]]]
    ) -> list[dict[str, Any]]:
        out = []
        for split in ("test", "val"):
            if split not in results[0]:
                continue
            correct, loss, n = zip(*(r[split] for r in results), strict=True)
            out.append(eval_record(round_, stage, split, clients, correct, loss, n))
        return out


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
