"""``train.keep_optimizer_state``: each client's SGD momentum carried from one of its local trainings to the next (the
model's and pFedGate's gate's), checkpointed and resumed bit for bit, in memory or in client-state files; off by
default, where it changes neither records nor run identity; refused where it cannot keep what it says."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bench.builder import build_experiment
from bench.core.federation import ClientRound
from bench.core.method import KEPT_OPTIMIZERS
from bench.experiment.compose import to_container
from bench.experiment.run import execute, run_dir_for, validate
from common.seeding import generator
from common.verified_io import load_verified
from tests.helpers import config, interrupted_then_resumed

MOMENTUM = ("train.momentum=0.9", "train.weight_decay=0.0")
KEEP = ("train.keep_optimizer_state=true",)
GATE = ("method=pfedgate", "method.gate_momentum=0.9", "method.gate_weight_decay=0.0005")


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


@pytest.mark.parametrize("keep", [True, False])
def test_a_clients_second_training_starts_from_the_momentum_its_first_left(tmp_path: Path, keep: bool) -> None:
    cfg = to_container(config(tmp_path, "method=fedavg", "num_clients=2", *MOMENTUM,
                              f"train.keep_optimizer_state={str(keep).lower()}"))
    exp = build_experiment(cfg)
    method, worker = exp.method, exp.fed.worker
    start = worker.read()
    method.setup(start)
    lr = float(cfg["train"]["lr"])
    size = sum(p.numel() for p in worker.parameters())
    assert size == start.numel()  # no buffers: the parameters are the whole vector

    def train(round_: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Client 0 trains from ``start`` in ``round_``: (parameters, gradient) at each step, before it."""
        seen = []
        method.before_step = lambda task, model: seen.append(
            (flat(model.parameters()), flat(p.grad for p in model.parameters())))
        worker.load(start)
        task = ClientRound(0, round_, exp.data.client(0), generator(0, "test", round_), start, lr)
        method.local_sgd(task, worker)
        return seen

    first = train(1)
    assert len(first) >= 2
    buffer = torch.zeros_like(start)  # what the first training leaves: torch SGD's b = 0.9 b + g over its steps
    for _, grad in first:
        buffer = buffer * 0.9 + grad
    kept = method.state.get(KEPT_OPTIMIZERS, {})
    if keep:
        assert list(kept) == [f"model:all/{size}"]
        state = kept[f"model:all/{size}"]
        assert bool(state["started"][0].all()) and not bool(state["started"][1].any())
        torch.testing.assert_close(state["momentum"][0], buffer, rtol=1e-5, atol=1e-7)
        assert float(buffer.abs().sum()) > 0
    else:
        assert kept == {}
    left = buffer if keep else torch.zeros_like(start)
    second = train(2)
    (before, grad), (after, _) = second[0], second[1]
    # the first step of the second training: p - lr (0.9 b + g), b the buffer the first left (none: p - lr g)
    torch.testing.assert_close(after, before - lr * (0.9 * left + grad), rtol=0, atol=1e-6)
    if keep:
        assert not torch.allclose(after, before - lr * grad, rtol=0, atol=1e-6)


def test_pfedgate_keeps_the_gates_momentum_apart_from_the_models(tmp_path: Path) -> None:
    cfg = to_container(config(tmp_path, *GATE, *MOMENTUM, *KEEP, "num_clients=2", "rounds=1"))
    execute(cfg)
    exp = build_experiment(cfg)
    exp.method.setup(exp.fed.worker.read())
    gate = list(exp.fed.worker.module.gate.parameters())
    names = [n for n, _ in exp.fed.worker.module.named_parameters()]
    gate_at = [names.index(f"gate.{n}") for n, _ in exp.fed.worker.module.gate.named_parameters()]
    state = load_verified(run_dir_for(cfg) / "checkpoint.pt")["method"][KEPT_OPTIMIZERS]
    gate_key = f"gate:{','.join(map(str, gate_at))}/{sum(p.numel() for p in gate)}"
    model_key = f"model:all/{sum(p.numel() for p in exp.fed.worker.parameters())}"
    assert sorted(state) == sorted([gate_key, model_key])
    assert bool(state[gate_key]["started"].all())  # every gate parameter of both clients took gate steps
    model_started = state[model_key]["started"]
    assert not bool(model_started[:, gate_at].any())  # the model's optimizer never steps the gate
    assert bool(model_started[:, [i for i in range(len(names)) if i not in gate_at]].all())


@pytest.mark.parametrize("method", [("method=fedavg",), GATE])
def test_kept_momentum_resumes_to_identical_records(tmp_path: Path, method: tuple[str, ...]) -> None:
    whole, resumed = interrupted_then_resumed(tmp_path / "keep", *method, *MOMENTUM, *KEEP)
    assert whole == resumed and '"round": 4' in whole
    fresh, _ = interrupted_then_resumed(tmp_path / "fresh", *method, *MOMENTUM)
    assert fresh != whole  # the option changes training


def test_kept_momentum_in_client_state_files_gives_the_same_records_and_resumes(tmp_path: Path) -> None:
    small = ["num_clients=6", "participation=0.5", "rounds=3", "checkpoint.every_rounds=1", "eval.chance_z=null",
             *GATE, *MOMENTUM, *KEEP]
    memory = to_container(config(tmp_path / "memory", *small))
    disk = to_container(config(tmp_path / "disk", *small, "client_state.memory_mb=0.001"))
    execute(memory)
    execute(disk)
    ref, run = run_dir_for(memory), run_dir_for(disk)
    assert (run / "rounds.jsonl").read_bytes() == (ref / "rounds.jsonl").read_bytes()
    assert list((run / "client_state" / "snapshots").glob("*.bin"))  # the kept momentum went to files
    (run / "summary.json").unlink()
    os.replace(run / "checkpoint.prev.pt", run / "checkpoint.pt")  # killed after round 2
    execute(disk)
    assert (run / "rounds.jsonl").read_bytes() == (ref / "rounds.jsonl").read_bytes()


def test_off_by_default_and_outside_the_run_identity_when_off(tmp_path: Path) -> None:
    default = to_container(config(tmp_path, "method=pfedgate"))
    assert default["train"]["keep_optimizer_state"] is False
    assert default["method"]["gate_momentum"] == 0.0 and default["method"]["gate_weight_decay"] == 0.0
    explicit = to_container(config(tmp_path, "method=pfedgate", "train.keep_optimizer_state=false",
                                   "method.gate_momentum=0.0", "method.gate_weight_decay=0.0"))
    assert run_dir_for(explicit) == run_dir_for(default)
    assert run_dir_for(to_container(config(tmp_path, "method=pfedgate", *KEEP))) != run_dir_for(default)


@pytest.mark.parametrize("overrides, match", [
    (("train.optimizer=adam",), "keeps SGD's momentum only.*train.optimizer='adam'"),
    (("method=fedavg", "train.batched_clients=true"), "cannot be combined with train.batched_clients=true"),
    (("train.keep_optimizer_state=yes",), "train.keep_optimizer_state"),
])
def test_settings_it_cannot_keep_are_refused_before_the_run(tmp_path: Path, overrides, match) -> None:
    cfg = to_container(config(tmp_path, *KEEP, *overrides))
    with pytest.raises(ValueError, match=match):
        validate(cfg, check_device=False)
