"""Clients trained together (``train.batched_clients=true``): the round's participants that share a worker run
their local SGD as one batched computation.

The K models are the rows of one ``[K, D]`` tensor in the worker's flat layout. Every step, each client draws
its next mini-batch from its own stream (the same draws, in the same order, as :meth:`Method.local_sgd` makes
from the client's generator); the clients whose batches have the same size form a group, and the group's
gradients come from ``torch.func.vmap`` over ``torch.func.grad_and_value`` of ``functional_call(worker.module)``,
each client with its own parameters, buffers and batch. The SGD step (weight decay, momentum, Nesterov,
gradient clipping) is written out on the stacked tensors, with a momentum buffer per client.

Uneven clients: a client whose stream has ended (fewer samples, hence fewer steps) is simply not in the group
of later steps, so its parameters and momentum stay as they are; a client's last, smaller batch is a group of
its own size. No sample is padded, so every client's gradient is its own batch's mean gradient, and BatchNorm in
training mode normalises with the client's own batch statistics and updates the client's own running
statistics. The results equal the sequential path's up to the order of floating-point sums (tests check
atol 1e-5).

A method declares in its own class body ``trains_batched = True`` when its local update is a plain SGD step on
the cross-entropy loss with optional gradient edits it also gives in batched form
(:meth:`Method.before_step_batched`), its ``train_client`` has a batched counterpart
(:meth:`Method.train_clients`), and ``client_model`` of one participant does not depend on another participant's
upload in the same round (the batched path asks every participant's start before any trains). A subclass does
not inherit the declaration: it changes the local update more often than not. :func:`batched_methods` lists them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from bench.core.data import ClientData
from bench.core.flat import FlatModel


class ClientTask(Protocol):
    """What the batched path reads of a participant's round (``bench.core.federation.ClientRound``)."""

    cid: int
    data: ClientData
    generator: torch.Generator
    start: torch.Tensor


class EditsGradients(Protocol):
    """The method's hook for gradient edits on a batched step (``Method.before_step_batched``)."""

    def before_step_batched(self, batch: StackedBatch) -> None: ...


def declares_batched(cls: type) -> bool:
    """Whether ``cls`` itself (not a base class) declares ``trains_batched = True``."""
    return bool(cls.__dict__.get("trains_batched", False))


@dataclass
class StackedBatch:
    """One batched step of a group of clients, as :meth:`Method.before_step_batched` sees it."""

    tasks: list[Any]  # the group's clients (``ClientRound``)
    params: torch.Tensor  # [k, T] current values of the trained entries (read only)
    grads: torch.Tensor  # [k, T] their gradients: edit in place
    starts: torch.Tensor  # [k, T] the trained entries of each client's ``task.start``
    where: slice | torch.Tensor  # positions of the T trained entries in the flat layout

    def pull_towards(self, anchors: torch.Tensor, coef: float) -> None:
        """Add ``coef * (params - anchors)`` to the gradients (a proximal term); ``anchors`` [k, T]."""
        self.grads.add_(self.params - anchors, alpha=coef)


def _client_stream(task: ClientTask, epochs: int, cfg: Mapping[str, Any]
                   ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for _ in range(epochs):
        yield from task.data.batches("train", cfg["batch_size"], task.generator, drop_last=cfg.get("drop_last", False))


def _positions(entries: Sequence[Any], device: torch.device) -> slice | torch.Tensor:
    """The flat positions of ``entries``: a slice when they are contiguous, else an index tensor on ``device``."""
    spans = sorted((e.offset, e.offset + e.numel) for e in entries)
    if all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)):
        return slice(spans[0][0], spans[-1][1])
    return torch.cat([torch.arange(a, b, device=device) for a, b in spans])


class StackedSGD:
    """Local SGD of K clients on one worker (see the module docstring)."""

    def __init__(self, method: EditsGradients, worker: FlatModel, trainable: Iterable[nn.Parameter] | None,
                 cfg: Mapping[str, Any], lr: float) -> None:
        self.method, self.worker, self.cfg, self.lr = method, worker, cfg, lr
        names = {id(p): n for n, p in worker.module.named_parameters()}
        chosen = None if trainable is None else {names[id(p)] for p in trainable}
        params = [e for e in worker.entries if e.kind == "param"]
        self.trained = [e for e in params if chosen is None or e.name in chosen]
        self.fixed = [e for e in params if chosen is not None and e.name not in chosen]
        self.buffers = [e for e in worker.entries if e.kind == "buffer"]
        self.counters = [(n, b) for n, b in worker.module.named_buffers() if not b.is_floating_point()]
        self.where = _positions(self.trained, worker.vector.device) if self.trained else slice(0, 0)
        module = worker.module

        def loss(trained: dict[str, torch.Tensor], rest: dict[str, torch.Tensor], x: torch.Tensor,
                 y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(module, {**trained, **rest}, (x,)), y)

        self.grad_fn = vmap(grad_and_value(loss))

    def _views(self, models: torch.Tensor, entries: Sequence[Any]) -> dict[str, torch.Tensor]:
        return {e.name: models[:, e.slice].view(models.shape[0], *e.shape) for e in entries}

    def step(self, models: torch.Tensor, momentum: torch.Tensor, tasks: list[ClientTask], starts: torch.Tensor,
             x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One SGD step of ``models`` [k, D] (in place) and ``momentum`` [k, T]; returns the k batch losses."""
        k = models.shape[0]
        trained = self._views(models, self.trained)
        rest = {name: view.detach() for name, view in self._views(models, self.fixed).items()}
        buffers = {name: view.clone() for name, view in self._views(models, self.buffers).items()}
        counters = {name: torch.zeros((k, *b.shape), dtype=b.dtype, device=b.device) for name, b in self.counters}
        grads, losses = self.grad_fn(trained, {**rest, **buffers, **counters}, x, y)
        for e in self.buffers:  # running statistics updated by normalisation layers in training mode
            models[:, e.slice] = buffers[e.name].reshape(k, -1)
        grad = torch.cat([grads[e.name].reshape(k, -1) for e in self.trained], dim=1)
        params = models[:, self.where]
        batch = StackedBatch(tasks, params, grad, starts, self.where)
        self.method.before_step_batched(batch)
        cfg = self.cfg
        if cfg.get("grad_clip"):
            norm = grad.norm(dim=1, keepdim=True)
            grad.mul_((float(cfg["grad_clip"]) / (norm + 1e-6)).clamp(max=1.0))
        if cfg.get("weight_decay", 0.0):
            grad = grad.add(params, alpha=float(cfg["weight_decay"]))
        mu = float(cfg.get("momentum", 0.0))
        if mu:
            momentum.mul_(mu).add_(grad)  # torch.optim.SGD: buf = grad at the first step, here from zeros
            grad = grad.add(momentum, alpha=mu) if cfg.get("nesterov", False) else momentum
        models[:, self.where] = params - self.lr * grad
        return losses.detach()

    def run(self, tasks: Sequence[ClientTask], models: torch.Tensor, epochs: int) -> list[float]:
        """Train the rows of ``models`` [K, D] (in place), row k on ``tasks[k]``; the mean batch loss per client."""
        device = models.device
        count = len(tasks)
        streams = [_client_stream(t, epochs, self.cfg) for t in tasks]
        starts = torch.stack([t.start for t in tasks])[:, self.where]
        momentum = torch.zeros_like(starts)
        totals = torch.zeros(count, device=device)
        batches = [0] * count
        live = list(range(count))
        while live:
            drawn: dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
            for row in live:
                batch = next(streams[row], None)
                if batch is not None:
                    drawn.setdefault(int(batch[1].shape[0]), []).append((row, *batch))
            live = sorted(row for group in drawn.values() for row, _, _ in group)
            for group in drawn.values():
                rows = [row for row, _, _ in group]
                x = torch.stack([b[1] for b in group])
                y = torch.stack([b[2] for b in group])
                whole = len(rows) == count
                index = torch.tensor(rows, device=device)
                sub = models if whole else models[index]
                buf = momentum if whole else momentum[index]
                losses = self.step(sub, buf, [tasks[r] for r in rows], starts if whole else starts[index], x, y)
                if not whole:
                    models[index] = sub
                    momentum[index] = buf
                totals[index] += losses
                for row in rows:
                    batches[row] += 1
        return [float(totals[k]) / max(batches[k], 1) for k in range(count)]


def stacked_sgd(method: EditsGradients, tasks: Sequence[ClientTask], models: torch.Tensor, worker: FlatModel,
                cfg: Mapping[str, Any], lr: float, epochs: int, params: Iterable[nn.Parameter] | None = None
                ) -> list[float]:
    """SGD of ``params`` (default: all) for ``epochs`` with the ``train`` config ``cfg``, row k of ``models`` [K, D]
    on ``tasks[k]``, in place, with ``worker.module`` in the mode training wants; each client's mean batch loss."""
    if cfg["optimizer"] != "sgd":
        raise ValueError(f"train.batched_clients=true needs train.optimizer=sgd, got {cfg['optimizer']!r}")
    trainer = StackedSGD(method, worker, params, cfg, lr)
    with torch.no_grad():  # the gradients come from torch.func; nothing else is recorded
        return trainer.run(tasks, models, epochs)
