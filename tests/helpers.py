"""Small builders shared by the engine tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import methods
from bench.builder import build_experiment
from bench.core.engine import Federation, Method, hyperparameters
from bench.core.flat import FlatModel
from bench.core.records import RunDir
from bench.experiment.compose import compose_config, to_container

FAST = ["dataset=synthetic", "model=small_cnn", "partition=pathological", "num_clients=4", "rounds=3",
        "train.epochs=1", "train.batch_size=10", "train.lr=0.1", "quiet=true", "cache_dir=null",
        "logger.wandb.mode=disabled"]

#: four clients of width 1/16, 3/8, 11/16 and 1 (capacity methods train narrow models; others ignore it)
CAPACITY = ("capacity.setting=grid", "capacity.low=0.0625")
#: per method, only what makes its mechanism reachable in a 4-round run of 4 clients (one without an entry runs
#: with its defaults)
SETUP: dict[str, tuple[str, ...]] = {
    "flanc": CAPACITY,
    "tailorfl": (*CAPACITY, "method.tune_every=1"),
    "pfedgate": CAPACITY,
    "pfedhn": (*CAPACITY, "method.inner_steps=2"),
    "heterofl": (*CAPACITY, "model.options.norm=bn"),
    "fedrolex": (*CAPACITY, "model.options.norm=bn"),
    "fjord": (*CAPACITY, "model.options.norm=bn"),
    "pa3dfl": (*CAPACITY, "method.embed_dim=4", "method.hidden_dim=8", "method.encoder_depth=2",
               "partition.val_fraction=0.25", "train.grad_clip=10.0"),
    "fedselect": ("method.ltn_iters=2", "method.ltn_epochs=1", "method.alt_epochs=1"),
    "fedselect_cvpr": ("method.grow_every=1", "method.alt_epochs=1"),
    "lotteryfl": ("method.acc_threshold=0.0",),
    "fedbabu": ("method.finetune_epochs=1",),
}


def config(tmp_path: Path, *overrides: str) -> Any:
    """A tiny, fast run config writing under ``tmp_path``."""
    return compose_config([*FAST, f"out_dir={tmp_path / 'runs'}", *overrides])


def cli_args(tmp_path: Path, overrides: Sequence[str]) -> list[str]:
    return [*FAST, f"out_dir={tmp_path / 'runs'}", *overrides]


def wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of the one offline W&B run under ``run_dir``, read back with ``wandb leet inspect --json``."""
    files = list((Path(run_dir) / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    wandb_cli = Path(sys.executable).with_name("wandb")
    dump = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(files[0])], capture_output=True,
                          text=True, env={**os.environ, "WANDB_MODE": "offline"}, timeout=120, check=True).stdout
    return [json.loads(line) for line in dump.splitlines() if line.startswith("{")]


#: the train config of hand-checkable method tests
TRAIN = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "epochs": 1, "batch_size": 4}


def federation(module: nn.Module, num_clients: int, sizes: list[float] | None = None) -> Federation:
    """A federation of ``num_clients`` around ``module`` (no data: for hand-checkable update rules)."""
    sizes_t = torch.tensor(sizes or [1.0] * num_clients, dtype=torch.float64)
    return Federation(num_clients, sizes_t, FlatModel(module), TRAIN, torch.device("cpu"), 0)


def method(name: str, fed: Federation, **hp: Any) -> Method:
    """The registered method ``name`` on ``fed`` with hyperparameters ``hp``, set up from the worker."""
    cls = methods.load(name)
    m = cls(fed, hyperparameters(cls, hp))
    m.setup(fed.worker.read())
    return m


def drawn_figures(monkeypatch: Any, module: Any) -> dict[str, Any]:
    """Figures that ``module`` saves through its ``save`` (``bench.experiment.plots.save``), by file name, still
    written: a test reads what was drawn, not only that a file exists."""
    real, figures = module.save, {}

    def capture(fig: Any, path: Any) -> list[Path]:
        figures[Path(path).name] = fig
        return real(fig, path)

    monkeypatch.setattr(module, "save", capture)
    return figures


def plotted(ax: Any) -> dict[str, tuple[list[float], list[float]]]:
    """label -> (x, y) of each labelled line or error-bar series of a matplotlib axis."""
    out = {}
    for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
        line = handle.lines[0] if hasattr(handle, "lines") else handle  # an ErrorbarContainer, else a Line2D
        out[label] = ([float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()])
    return out


def central_difference(f: Callable[[], float], flat: torch.Tensor, i: int, eps: float) -> float:
    """(f(x + eps e_i) - f(x - eps e_i)) / (2 eps), moving entry ``i`` of ``flat`` in place and putting it back."""
    old = float(flat[i])
    flat[i] = old + eps
    up = f()
    flat[i] = old - eps
    down = f()
    flat[i] = old
    return (up - down) / (2 * eps)


def script(name: str) -> Any:
    """The module ``scripts/<name>.py`` (scripts are not a package), loaded afresh."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(path: Path) -> str:
    return (path / "rounds.jsonl").read_text()


class StopAfter:
    """A round callback that interrupts the run after ``round_`` (a kill between records and checkpoint)."""

    def __init__(self, round_: int) -> None:
        self.round = round_

    def on_round(self, round_, records) -> None:
        if round_ == self.round:
            raise KeyboardInterrupt

    def on_end(self, summary) -> None:
        pass


def interrupted_then_resumed(tmp_path: Path, *overrides: str) -> tuple[str, str]:
    """(records of an uninterrupted run, records of a run stopped after round 3 and resumed by a new process
    state), both built through the experiment builder."""
    cfg = to_container(config(tmp_path, *overrides, "rounds=4", "checkpoint.every_rounds=1"))
    whole = RunDir(tmp_path / "whole")
    build_experiment(cfg).engine(whole, "h").run()
    broken = RunDir(tmp_path / "broken")
    with pytest.raises(KeyboardInterrupt):
        build_experiment(cfg).engine(broken, "h", [StopAfter(3)]).run()
    assert '"round": 3' in records(broken.path)  # round 3's records were written, its checkpoint was not
    build_experiment(cfg).engine(broken, "h").run()
    return records(whole.path), records(broken.path)
