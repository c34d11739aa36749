"""Small builders shared by the engine tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.compose import compose_config

FAST = ["dataset=synthetic", "model=small_cnn", "partition=pathological", "num_clients=4", "rounds=3",
        "train.epochs=1", "train.batch_size=10", "train.lr=0.1", "quiet=true", "cache_dir=null"]


def config(tmp_path: Path, *overrides: str) -> Any:
    """A tiny, fast run config writing under ``tmp_path``."""
    return compose_config([*FAST, f"out_dir={tmp_path / 'runs'}", *overrides])


def cli_args(tmp_path: Path, overrides: Sequence[str]) -> list[str]:
    return [*FAST, f"out_dir={tmp_path / 'runs'}", *overrides]
