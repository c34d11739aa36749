"""The one place where an experiment is assembled: data -> worker -> federation -> method -> engine.

``bench.experiment.run`` (every run, table and launcher), the benchmark, the figure scripts and the tests all build
through :func:`build_experiment`, so a change in how a run is put together happens once; the cost tables build
through :func:`build_without_data` (the same worker, federation and method for an input shape, without data).

The assembly layer: it imports the core, ``datasets`` and, of ``methods``, only the module of the method it builds
(``methods.load``; a plug-in's method comes from the modules the config ``imports``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import methods
from bench.core.batched import declares_batched
from bench.core.capacity import IDEAL, WidthRule, client_capacities, shared_width_rule, unaware_width
from bench.core.client_state import ClientTables
from bench.core.data import FederatedData, build_federated_data, load_sources
from bench.core.engine import (
    METHODS,
    Engine,
    EngineConfig,
    Federation,
    Method,
    RoundCallback,
    WorkerFactory,
    hyperparameters,
)
from bench.core.flat import FlatModel
from bench.core.models import build_model
from bench.core.pretrained import load_pretrained_source
from bench.core.records import RunDir
from common.seeding import derive_seed
from datasets.partition import Partition


def engine_config(cfg: Mapping[str, Any]) -> EngineConfig:
    """The engine's settings from a run config (rounds, participation, evaluation, checkpoints, seed)."""
    return EngineConfig(
        rounds=int(cfg["rounds"]),
        participation=float(cfg["participation"]),
        eval_every=int(cfg["eval"]["every"]),
        eval_batch_size=int(cfg["eval"]["batch_size"]),
        checkpoint_every_rounds=int(cfg["checkpoint"]["every_rounds"]),
        checkpoint_every_seconds=float(cfg["checkpoint"]["every_seconds"]),
        seed=int(cfg["seed"]),
        early_stop=cfg["eval"].get("early_stop"),
        stop_stage=cfg["eval"]["primary"]["stage"],
        stop_weighting=cfg["eval"]["primary"]["weighting"],
        eval_stages=chosen_stages(cfg),
    )


def chosen_stages(cfg: Mapping[str, Any]) -> tuple[str, ...] | None:
    """``eval.stages`` of a run config as a tuple (None: the method's own stages); a value that is not a list is
    refused."""
    stages = cfg["eval"].get("stages")
    if stages is None:
        return None
    if isinstance(stages, str) or not isinstance(stages, Sequence):
        raise ValueError(f"eval.stages={stages!r} is invalid: give a list, e.g. eval.stages=[post], or null (the "
                         "method's own stages)")
    return tuple(stages)


def batched_methods() -> list[str]:
    """The methods that can train their clients together (``train.batched_clients``), ours and the plug-ins'
    imported so far."""
    return sorted(name for name in methods.load_all() if declares_batched(METHODS.get(name)))


def check_batched_config(cfg: Mapping[str, Any], method_cls: type[Method]) -> None:
    """Refuse ``train.batched_clients=true`` for a method or setting the batched path does not cover."""
    if not cfg["train"].get("batched_clients", False):
        return
    name = cfg["method"]["name"]
    if not declares_batched(method_cls):
        raise ValueError(f"train.batched_clients=true is not supported by method={name}: its local update is not a "
                         f"plain SGD step on a loss; use train.batched_clients=false, or one of {batched_methods()}")
    if cfg["train"]["optimizer"] != "sgd":
        raise ValueError(f"train.batched_clients=true needs train.optimizer=sgd (got {cfg['train']['optimizer']!r}); "
                         "use train.batched_clients=false")
    if cfg.get("compile"):
        raise ValueError("train.batched_clients=true cannot be combined with compile=true; choose one")


def check_kept_optimizer_config(cfg: Mapping[str, Any]) -> None:
    """Refuse ``train.keep_optimizer_state=true`` where it cannot keep what it says: it keeps SGD's momentum
    buffers of clients trained one by one (``Method.kept_optimizer``)."""
    if not cfg["train"].get("keep_optimizer_state", False):
        return
    if cfg["train"]["optimizer"] != "sgd":
        raise ValueError(f"train.keep_optimizer_state=true keeps SGD's momentum only, not the state of "
                         f"train.optimizer={cfg['train']['optimizer']!r}; use train.optimizer=sgd or "
                         "train.keep_optimizer_state=false")
    if cfg["train"].get("batched_clients", False):
        raise ValueError("train.keep_optimizer_state=true cannot be combined with train.batched_clients=true (the "
                         "batched path starts every client's momentum from zero); choose one")


def import_plugins(cfg: Mapping[str, Any]) -> None:
    """Import the config's ``imports`` (modules that register your own methods, models or data sources)."""
    import importlib

    for name in cfg.get("imports") or []:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"imports: module {name!r} cannot be imported ({err}); give a module importable "
                             "from the project root or installed in the environment") from err


def method_class(cfg: Mapping[str, Any]) -> tuple[type[Method], Any]:
    """The method class of ``cfg['method']`` (importing only its module) and its hyperparameters."""
    cls = methods.load(cfg["method"]["name"])
    return cls, hyperparameters(cls, {k: v for k, v in cfg["method"].items() if k != "name"})


def model_builder(cfg: Mapping[str, Any], num_classes: int, in_channels: int, image_size: int,
                  method: type[Method] | None = None, hp: Any = None) -> Callable[[float], nn.Module]:
    """``width -> client module``: the zoo's model at ``model.width * width``, extended by the method."""
    model_cfg = cfg["model"]

    def build(width: float = 1.0) -> nn.Module:
        module = build_model(model_cfg["name"], num_classes=num_classes, in_channels=in_channels,
                             image_size=image_size, width=float(model_cfg.get("width", 1.0)) * width,
                             **dict(model_cfg.get("options") or {}))
        module = method.extend_model(module, hp, width) if method is not None else module
        return compiled(module) if cfg.get("compile") else module

    return build


def compiled(module: nn.Module) -> nn.Module:
    """``module`` with its body (the whole module if it has none) run through ``torch.compile`` (``compile=true``).
    In place (``nn.Module.compile``): parameter names, the flat layout and every hook stay as they are, and the
    methods that call ``module.body`` directly (feature-based losses) get the compiled body too."""
    target = module.body if isinstance(getattr(module, "body", None), nn.Module) else module
    target.compile()
    return module


def build_worker(cfg: Mapping[str, Any], num_classes: int, in_channels: int, image_size: int,
                 device: torch.device, method: type[Method] | None = None, hp: Any = None) -> FlatModel:
    """The initial model, a pure function of (model config, method, seed), wrapped as the full-width worker."""
    build = model_builder(cfg, num_classes, in_channels, image_size, method, hp)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg["seed"], "init"))
        module = build(1.0)
    if cfg["model"].get("pretrained"):
        load_pretrained_source(module, cfg["model"]["pretrained"], cfg["model"]["name"])
    return FlatModel(module.to(device))


@dataclass(frozen=True)
class InputShape:
    """What a model is built for when there is no data: the classes and the images' channels and size."""

    num_classes: int
    in_channels: int
    image_size: int


@dataclass
class Experiment:
    """An assembled experiment: its data (None when built without data), federation (with the workers) and
    method."""

    config: Mapping[str, Any]
    data: FederatedData | None
    fed: Federation
    method: Method

    def engine(self, run: RunDir | None = None, config_hash: str = "",
               callbacks: Sequence[RoundCallback] = ()) -> Engine:
        """The engine of this experiment; without a run directory it can only run single rounds
        (``engine.round(t, on_client=..., evaluate=False)`` in scripts, after ``method.setup``)."""
        return Engine(engine_config(self.config), self.data, self.method, run, config_hash, callbacks)


def build_experiment(cfg: Mapping[str, Any], device: torch.device | str = "cpu",
                     data: FederatedData | None = None, client_dir: str | os.PathLike | None = None) -> Experiment:
    """Data (unless given), the full-width worker, a factory of narrower workers, the federation and the
    method of the resolved config ``cfg``; per-client tables beyond ``client_state.memory_mb`` go to files in
    ``client_dir`` (``bench.core.client_state``)."""
    device = torch.device(device)
    import_plugins(cfg)
    cls, hp = method_class(cfg)
    check_batched_config(cfg, cls)
    check_kept_optimizer_config(cfg)
    capacities = client_capacities(cfg.get("capacity"), int(cfg["num_clients"]), int(cfg["data_seed"]))
    shared = shared_width_rule(cfg.get("capacity"))
    cfg = model_scaled(cfg, base_width(cls, capacities, shared))
    sources = None
    if data is None:  # the model is checked against the data before the partition is computed (and cached)
        sources = load_sources(cfg["dataset"], cfg.get("data_root"))
        first = sources[0][0]
        probe = first.images[:2].to(device)
        try:
            worker = build_worker(cfg, len(first.classes), probe.shape[1], probe.shape[-1], device, cls, hp)
        except RuntimeError as err:  # the zoo's models probe their flatten size while being built
            raise ValueError(f"model={cfg['model']['name']} does not fit the input of dataset={cfg['dataset']['name']}"
                             f" ({'x'.join(map(str, probe.shape[1:]))} images): {str(err).splitlines()[0]}; choose "
                             "another model or set dataset.image_size / dataset.channels") from None
        check_model_fits(worker, probe, len(first.classes), cfg)
        data = build_federated_data(cfg["dataset"], cfg["partition"], num_clients=cfg["num_clients"],
                                    data_seed=int(cfg["data_seed"]), data_root=cfg.get("data_root"),
                                    cache_dir=cfg.get("cache_dir"), device=device, sources=sources,
                                    accept=partition_check(cfg))
    else:
        worker = build_worker(cfg, data.num_classes, data.in_channels, data.image_size, device, cls, hp)
        check_model_fits(worker, data.images[:2], data.num_classes, cfg)
        check_clients_nonempty({s: data.sizes(s).tolist() for s in EMPTY_SPLIT_FIX}, cls, cfg["partition"]["scheme"])
    shape = InputShape(data.num_classes, data.in_channels, data.image_size)
    fed = federation(cfg, cls, hp, worker, shape, device, data, capacities, shared, client_dir)
    return Experiment(cfg, data, fed, cls(fed, hp))


def build_without_data(cfg: Mapping[str, Any], shape: InputShape, device: torch.device | str = "cpu",
                       capacities: torch.Tensor | None = None, hp: Any = None) -> Experiment:
    """The experiment of ``cfg`` for inputs of ``shape`` without data, for cost measurements (sizes, FLOPs, memory,
    the server's work per round): the same worker, federation and method as :func:`build_experiment`, every
    client weighted 1. ``capacities`` (r_i per client, float64) replaces the config's capacity setting and sets
    the number of clients; ``hp`` replaces the method's hyperparameters (the workers are still built with the
    config's). Its engine runs rounds only with ``evaluate=False`` and a ``train_client`` that needs no data."""
    device = torch.device(device)
    import_plugins(cfg)
    cls, config_hp = method_class(cfg)
    if capacities is None:
        capacities = client_capacities(cfg.get("capacity"), int(cfg["num_clients"]), int(cfg["data_seed"]))
    shared = shared_width_rule(cfg.get("capacity"))
    cfg = model_scaled(cfg, base_width(cls, capacities, shared))
    worker = build_worker(cfg, shape.num_classes, shape.in_channels, shape.image_size, device, cls, config_hp)
    fed = federation(cfg, cls, config_hp, worker, shape, device, None, capacities, shared)
    return Experiment(cfg, None, fed, cls(fed, config_hp if hp is None else hp))


def federation(cfg: Mapping[str, Any], cls: type[Method], hp: Any, worker: FlatModel, shape: InputShape,
               device: torch.device, data: FederatedData | None, capacities: torch.Tensor,
               shared: WidthRule | None = None, client_dir: str | os.PathLike | None = None) -> Federation:
    """The federation around the full-width ``worker``: narrower workers built on demand, clients weighted by
    their training samples (1 each without data), per-client tables as ``cfg['client_state']`` bounds them."""
    factory = WorkerFactory(model_builder(cfg, shape.num_classes, shape.in_channels, shape.image_size, cls, hp),
                            worker)
    num_clients = data.num_clients if data is not None else len(capacities)
    sizes = data.sizes("train") if data is not None else torch.ones(num_clients, dtype=torch.float64)
    state = cfg.get("client_state") or {}
    tables = ClientTables(num_clients, state.get("memory_mb"), client_dir) \
        if state.get("memory_mb") is not None else None
    return Federation(num_clients, sizes, worker, cfg["train"], device, int(cfg["seed"]), data, factory,
                      capacities, shared, tables)


#: what gives an emptied client samples again, per split
EMPTY_SPLIT_FIX = {
    "train": "use fewer clients, give each client more data (partition.min_size, n_train) or a lower "
             "partition.val_fraction",
    "test": "use fewer clients or give each client more test data (partition.n_test, partition.test_fraction)",
}


def check_clients_nonempty(sizes: Mapping[str, Sequence[int]], method: type[Method], scheme: str) -> None:
    """Refuse a federation whose ``sizes`` (split -> samples per client) leave a client without training or test
    samples, unless the method copes with that split being empty (``Method.empty_splits``)."""
    for split, fix in EMPTY_SPLIT_FIX.items():
        if split in method.empty_splits:
            continue
        empty = [cid for cid, n in enumerate(sizes[split]) if n == 0]
        if empty:
            shown = ", ".join(map(str, empty[:5])) + (", ..." if len(empty) > 5 else "")
            raise ValueError(f"partition={scheme} leaves {len(empty)} of {len(sizes[split])} clients without {split} "
                             f"samples (client {shown}), which method {method.__name__} cannot handle: {fix}")


def partition_check(cfg: Mapping[str, Any]) -> Callable[[Partition], None]:
    """What :func:`build_experiment` requires of ``cfg``'s partition (:func:`check_clients_nonempty` for its
    method), checked before the partition is cached; the table's pre-launch check applies it too."""
    method = method_class(cfg)[0]
    return lambda partition: check_clients_nonempty(
        {split: [getattr(c, split).numel() for c in partition.clients] for split in EMPTY_SPLIT_FIX}, method,
        partition.scheme)


def check_model_fits(worker: FlatModel, images: torch.Tensor, num_classes: int, cfg: Mapping[str, Any]) -> None:
    """One forward pass of two images: a model that does not fit the data's input is refused at once."""
    shape = "x".join(str(d) for d in images.shape[1:])
    worker.module.eval()
    try:
        with torch.no_grad():
            out = worker.module(images)
    except RuntimeError as err:
        raise ValueError(f"model={cfg['model']['name']} does not fit the input of dataset={cfg['dataset']['name']} "
                         f"({shape} images): {str(err).splitlines()[0]}; choose another model or set "
                         "dataset.image_size / dataset.channels") from None
    if tuple(out.shape) != (images.shape[0], num_classes):
        raise ValueError(f"model={cfg['model']['name']} gives outputs of shape {tuple(out.shape[1:])} for "
                         f"dataset={cfg['dataset']['name']}, which has {num_classes} classes")


def base_width(method: type[Method], capacities: torch.Tensor, shared: WidthRule | None = None) -> float:
    """The width the full model is built at: 1 for capacity-aware methods (they narrow it per client), else
    the widest model the weakest client can run (under the run's ``shared`` width rule, if any)."""
    return 1.0 if method.capacity_aware else unaware_width(capacities, shared)


def model_scaled(cfg: Mapping[str, Any], width: float) -> Mapping[str, Any]:
    """``cfg`` with ``model.width`` multiplied by ``width`` (the same config when ``width`` is 1)."""
    if width == 1.0:
        return cfg
    return {**cfg, "model": {**cfg["model"], "width": float(cfg["model"].get("width", 1.0)) * width}}


def client_capacity_table(experiment: Experiment) -> dict[str, Any]:
    """Every client's capacity, model width and cost (the share of the zoo's full model it trains: p^2 for a
    width, pFedGate's sparsity), and the rule that sized them, for the run records."""
    fed, method = experiment.fed, experiment.method
    base = float(experiment.config["model"].get("width", 1.0))
    return {"setting": (experiment.config.get("capacity") or IDEAL)["setting"],
            "capacity": [round(float(r), 6) for r in fed.capacities],
            "width": [round(base * method.client_width(c), 6) for c in range(fed.num_clients)],
            "cost": [round(base * base * method.client_cost(c), 6) for c in range(fed.num_clients)],
            "rule": method.capacity_rule()}
