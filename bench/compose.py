"""Compose configs from ``conf/`` in-process (scripts and tests), exactly as the CLI would."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config ``python -m bench.run <overrides>`` would run with."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))
