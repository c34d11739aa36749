"""The federated training engine: the round loop, client sampling, evaluation schedule, records, checkpoints and
early stopping of one method on one federated dataset.

The method owns the server state and answers the hooks of :class:`bench.core.method.Method`; what it knows of the
federation is :class:`bench.core.federation.Federation`. The names a method module imports (``METHODS``,
``Method``, ``ClientRound``, ``Federation``, ``evaluate``, ``make_optimizer``, ...) are importable from here too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from bench.core.data import FederatedData
from bench.core.evaluation import Diverged, check_finite, evaluate
from bench.core.federation import ClientRound, Federation, WorkerFactory
from bench.core.flat import FlatModel
from bench.core.method import (
    METHODS,
    NORM_MODES,
    Method,
    NoHyperparameters,
    evaluated_stages,
    hyperparameters,
    make_optimizer,
    scored_stage,
    set_train_mode,
)
from bench.core.records import RunDir
from bench.core.summary import STAGES, early_stop, eval_record, summarize
from common.seeding import generator

__all__ = ["METHODS", "NORM_MODES", "ClientCallback", "ClientRound", "Diverged", "Engine", "EngineConfig",
           "Federation", "Method", "NoHyperparameters", "RoundCallback", "WorkerFactory", "check_finite", "evaluate",
           "hyperparameters", "make_optimizer", "set_train_mode"]


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
    #: the stages evaluated (``eval.stages``): None = the method's ``eval_stages``, else those of them named here
    eval_stages: tuple[str, ...] | None = None

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
        if self.eval_stages is not None:
            known = bool(self.eval_stages) and all(s in STAGES for s in self.eval_stages)
            rules.append(("eval.stages", list(self.eval_stages), known, f"null or a non-empty list of {list(STAGES)}"))
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
        #: the stages each evaluation round evaluates (the method's, or those ``eval.stages`` keeps of them)
        self.stages = evaluated_stages(method, cfg.eval_stages)

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
        return scored_stage(self.method, self.cfg.stop_stage)

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
            if evaluating and "pre" in self.stages:
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
            if "post" in self.stages:
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

