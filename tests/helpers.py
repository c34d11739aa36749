"""Small builders shared by the engine tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.compose import compose_config

FAST = ["dataset=synthetic", "model=small_cnn", "partition=pathological", "num_clients=4", "rounds=3",
        "train.epochs=1", "train.batch_size=10", "train.lr=0.1", "quiet=true", "cache_dir=null",
        "logger.wandb.mode=disabled"]


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
