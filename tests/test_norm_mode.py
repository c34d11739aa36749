"""``train.norm_mode``: BatchNorm layers in training or evaluation mode during local training.

``eval`` uses and never updates the running statistics (the official FedSelect code trains so after its first
evaluation: ``evaluate()`` calls ``model.eval()`` and nothing calls ``train()`` again, which ``eval_after_round_1``
reproduces); ``train``, the default, is ordinary training and leaves every existing run's identity alone.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from bench.core.engine import ClientRound, Federation, Method
from bench.core.flat import FlatModel
from bench.experiment.compose import to_container
from bench.experiment.run import config_hash, execute, run_dir_for, validate
from tests.helpers import TRAIN, config
from tests.test_fedselect import tiny_data

ROOT = Path(__file__).resolve().parent.parent


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 4))


def running_stats_after(norm_mode: str | None, round_: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(running stats before, after one epoch of local SGD in round ``round_``, parameters moved?)."""
    data = tiny_data()
    train = {**TRAIN, **({} if norm_mode is None else {"norm_mode": norm_mode})}
    worker = FlatModel(bn_model())
    fed = Federation(1, torch.ones(1, dtype=torch.float64), worker, train, torch.device("cpu"), 0, data)
    method = Method(fed, None)
    bn = worker.module[2]
    before, start = bn.running_mean.clone(), worker.read()
    task = ClientRound(0, round_, data.client(0), torch.Generator().manual_seed(0), start, 0.1)
    method.local_sgd(task, worker)
    moved = torch.tensor(not torch.equal(worker.read()[worker.param_mask], start[worker.param_mask]))
    return before, bn.running_mean.clone(), moved


def test_norm_mode_eval_trains_without_touching_the_running_statistics_the_default_updates_them():
    for default in (None, "train"):  # the key absent (a run from before it existed) or set to its default
        before, after, moved = running_stats_after(default, round_=1)
        assert moved and not torch.equal(before, after)
    before, after, moved = running_stats_after("eval", round_=1)
    assert moved and torch.equal(before, after)  # the weights learn, the statistics stay


def test_norm_mode_eval_after_round_1_is_the_official_codes_first_round_then_eval():
    before, after, _ = running_stats_after("eval_after_round_1", round_=1)
    assert not torch.equal(before, after)  # round 1: the fresh model is in training mode
    before, after, moved = running_stats_after("eval_after_round_1", round_=2)
    assert moved and torch.equal(before, after)  # after the first evaluate(): eval mode for good


def test_norm_mode_eval_normalises_with_the_running_statistics():
    """In eval mode the forward pass of a training batch uses the stored statistics, not the batch's."""
    from bench.core.engine import set_train_mode

    module = bn_model()
    bn = module[2]
    bn.running_mean.fill_(5.0)
    x = torch.randn(8, 1, 8, 8)
    set_train_mode(module, "eval", 1)
    assert module.training and not bn.training
    hidden = module[1](module[0](x))
    expected = (hidden - 5.0) / torch.sqrt(bn.running_var + bn.eps) * bn.weight + bn.bias
    assert torch.allclose(bn(hidden), expected, atol=1e-6)
    with pytest.raises(ValueError, match="train.norm_mode='batch' is invalid"):
        set_train_mode(module, "batch", 1)


def test_norm_mode_is_validated_and_eval_is_a_run_of_its_own(tmp_path):
    with pytest.raises(ValueError, match="train.norm_mode='bogus' is invalid"):
        validate(to_container(config(tmp_path, "train.norm_mode=bogus")))
    default = to_container(config(tmp_path, "rounds=1"))
    assert default["train"]["norm_mode"] == "train"
    without = json.loads(json.dumps(default))
    without["train"].pop("norm_mode")
    assert config_hash(default) == config_hash(without)  # the run as it was before the key existed
    frozen = to_container(config(tmp_path, "rounds=1", "train.norm_mode=eval"))
    assert run_dir_for(frozen) != run_dir_for(default)
    assert execute(frozen)["complete"] and execute(default)["complete"]


def committed_runs() -> list[Path]:
    """The run directories committed to git (runs of this tree's own tables are not)."""
    listed = subprocess.run(["git", "ls-files", "runs"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted({(ROOT / name).parent for name in listed.splitlines() if name.endswith("/summary.json")})


def test_every_committed_run_keeps_its_config_hash_with_norm_mode_train():
    """Committed runs from before ``train.norm_mode`` (their configs lack it) keep their hash, hence their directory,
    when composed today with ``norm_mode: train``; runs written since carry ``norm_mode: train`` and hash as without it.
    ``eval`` moves the hash either way."""
    runs = committed_runs()
    assert runs, "no committed runs found under runs/"
    older = 0
    for run in runs:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        recorded = json.loads((run / "summary.json").read_text())["config_hash"]
        assert config_hash(cfg) == recorded, run
        assert run.name.endswith(recorded[:10]), run
        if "norm_mode" in cfg["train"]:
            assert cfg["train"].pop("norm_mode") == "train", run
        else:
            older += 1
            cfg["train"]["norm_mode"] = "train"
        assert config_hash(cfg) == recorded, run
        cfg["train"]["norm_mode"] = "eval"
        assert config_hash(cfg) != recorded, run
    assert older, "no committed run predates train.norm_mode: this test no longer checks what it is for"
