"""Clients trained together (``train.batched_clients``): equal to training them in turn, refused where unsupported."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.builder import batched_methods, build_experiment
from bench.core.data import FederatedData
from bench.experiment.compose import to_container
from bench.experiment.errors import ConfigError, config_phase
from bench.experiment.run import config_hash, validate
from tests.helpers import config

#: every method that declares it trains its clients together (docs/design.md lists the same)
SUPPORTED = ["ditto", "fedamp", "fedavg", "fedbabu", "fedbn", "fedcac", "fedper", "fedprox", "fedrep", "lgfedavg",
             "local"]
#: training samples per client: different numbers of batches of 16 and different last batch sizes (one client
#: has a single, partial batch)
SIZES = [100, 73, 40, 9]
#: a federation where BatchNorm, momentum, weight decay and gradient clipping all matter
BASE = ["dataset=digits", "model.options.norm=bn_all", "num_clients=4", "train.batch_size=16", "train.epochs=1",
        "train.momentum=0.9", "train.weight_decay=0.001", "train.grad_clip=5.0", "eval.batch_size=64"]
HYPER = {"fedrep": ["method.head_epochs=2", "method.body_epochs=1"], "ditto": ["method.personal_epochs=1"],
         "fedbabu": ["method.finetune_epochs=1"], "fedamp": ["method.sigma=1.0"]}


def uneven(data: FederatedData) -> FederatedData:
    """``data`` with client c keeping the first ``SIZES[c]`` of its training samples."""
    splits = tuple({**s, "train": s["train"][:n]} for s, n in zip(data.splits, SIZES, strict=True))
    return dataclasses.replace(data, splits=splits)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> FederatedData:
    cfg = to_container(config(tmp_path_factory.mktemp("data"), *BASE))
    return uneven(build_experiment(cfg).data)


def two_rounds(tmp_path: Path, data: FederatedData, method: str, batched: bool, *extra: str,
               dtype: torch.dtype = torch.float64) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The method's state and records after two rounds. In float64 by default: the batched path sums in another
    order (grouped convolutions, batched matrix products), which in float32 moves BatchNorm's running means by up
    to 2e-5 after two rounds; in float64 any difference beyond rounding is a real one."""
    cfg = to_container(config(tmp_path, *BASE, f"method={method}", *HYPER.get(method, []),
                              f"train.batched_clients={str(batched).lower()}", *extra))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        experiment = build_experiment(cfg, data=dataclasses.replace(data, images=data.images.to(dtype)))
        engine = experiment.engine()
        experiment.method.setup(experiment.fed.worker.read())
        records = engine.round(1) + engine.round(2)
    finally:
        torch.set_default_dtype(default)
    return experiment.method.state_dict(), records


def tensors(node: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if torch.is_tensor(node):
        return {prefix: node}
    if isinstance(node, dict):
        return {k: v for key, value in node.items() for k, v in tensors(value, f"{prefix}/{key}").items()}
    return {}


def test_the_supported_methods_are_listed() -> None:
    assert batched_methods() == SUPPORTED


@pytest.mark.parametrize("method", SUPPORTED)
def test_batched_equals_sequential(tmp_path: Path, digits: FederatedData, method: str) -> None:
    state_seq, records_seq = two_rounds(tmp_path, digits, method, False)
    state_bat, records_bat = two_rounds(tmp_path, digits, method, True)
    seq, bat = tensors(state_seq), tensors(state_bat)
    assert seq.keys() == bat.keys() and seq
    for key in seq:
        if seq[key].is_floating_point():
            torch.testing.assert_close(bat[key], seq[key], atol=1e-10, rtol=0, msg=key)
        else:
            assert torch.equal(bat[key], seq[key]), key
    assert [r["kind"] for r in records_bat] == [r["kind"] for r in records_seq]
    for a, b in zip(records_seq, records_bat, strict=True):
        if a["kind"] == "train":
            assert b["loss"] == pytest.approx(a["loss"], abs=1e-10)
        elif a["kind"] == "eval":
            assert b["acc"] == a["acc"], (a["stage"], a["split"])


def test_norm_mode_and_nesterov_batched(tmp_path: Path, digits: FederatedData) -> None:
    extra = ["train.norm_mode=eval_after_round_1", "train.nesterov=true", "train.grad_clip=null"]
    seq = tensors(two_rounds(tmp_path, digits, "fedavg", False, *extra)[0])
    bat = tensors(two_rounds(tmp_path, digits, "fedavg", True, *extra)[0])
    for key in seq:
        torch.testing.assert_close(bat[key], seq[key], atol=1e-10, rtol=0, msg=key)


def test_batched_float32_within_tolerance(tmp_path: Path, digits: FederatedData) -> None:
    """In the runs' own float32: parameters within 1e-5, BatchNorm statistics within 1e-4."""
    state_seq, records_seq = two_rounds(tmp_path, digits, "fedavg", False, dtype=torch.float32)
    state_bat, records_bat = two_rounds(tmp_path, digits, "fedavg", True, dtype=torch.float32)
    worker = build_experiment(to_container(config(tmp_path, *BASE)), data=digits).fed.worker
    params = worker.param_mask
    seq, bat = state_seq["global"], state_bat["global"]
    torch.testing.assert_close(bat[params], seq[params], atol=1e-5, rtol=0)
    torch.testing.assert_close(bat[~params], seq[~params], atol=1e-4, rtol=0)
    evals = [(a["acc"], b["acc"]) for a, b in zip(records_seq, records_bat, strict=True) if a["kind"] == "eval"]
    assert evals and all(a == b for a, b in evals)


@pytest.mark.parametrize("method", ["fedrod", "fedselect", "heterofl", "pfedhn"])
def test_unsupported_methods_refuse(tmp_path: Path, method: str) -> None:
    cfg = to_container(config(tmp_path, f"method={method}", "train.batched_clients=true"))
    with pytest.raises(ConfigError, match=rf"batched_clients=true is not supported by method={method}"), \
            config_phase():
        validate(cfg)


def test_the_key_is_a_boolean(tmp_path: Path) -> None:
    cfg = to_container(config(tmp_path, "train.batched_clients=yes"))
    with pytest.raises(ConfigError, match="train.batched_clients='yes' is invalid: it must be true or false"), \
            config_phase():
        validate(cfg)


def test_adam_refuses(tmp_path: Path) -> None:
    cfg = to_container(config(tmp_path, "train.optimizer=adam", "train.batched_clients=true"))
    with pytest.raises(ConfigError, match="needs train.optimizer=sgd"), config_phase():
        validate(cfg)


def test_run_identity(tmp_path: Path) -> None:
    """Off, the key leaves a run's identity as it was before the key existed; on, it is a run of its own."""
    off = to_container(config(tmp_path, "train.batched_clients=false"))
    on = to_container(config(tmp_path, "train.batched_clients=true"))
    before = {**off, "train": {k: v for k, v in off["train"].items() if k != "batched_clients"}}
    assert config_hash(off) == config_hash(before)
    assert config_hash(on) != config_hash(off)


def test_stacked_sgd_of_scattered_parameters_equals_local_sgd(tmp_path: Path, digits: FederatedData) -> None:
    """Training a subset of parameters that is not one block of the flat layout (every weight, no bias)."""
    cfg = to_container(config(tmp_path, *BASE))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        experiment = build_experiment(cfg, data=dataclasses.replace(digits, images=digits.images.double()))
        method, worker, engine = experiment.method, experiment.fed.worker, experiment.engine()
        start = worker.read()
        weights = [p for n, p in worker.module.named_parameters() if n.endswith("weight")]
        sequential = []
        for cid in (0, 3):
            worker.load(start)
            method.local_sgd(engine.task(cid, 1, start, 0.05), worker, params=weights)
            sequential.append(worker.read())
        models = torch.stack([start, start])
        method.stacked_sgd([engine.task(cid, 1, models[k].clone(), 0.05) for k, cid in enumerate((0, 3))], models,
                           worker, params=weights)
    finally:
        torch.set_default_dtype(default)
    torch.testing.assert_close(models, torch.stack(sequential), atol=1e-10, rtol=0)
    biases = worker.mask(lambda e: e.kind == "param" and not e.name.endswith("weight"))
    assert torch.equal(models[:, biases], start[biases].expand(2, -1))
