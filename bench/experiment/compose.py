"""Compose configs from ``conf/`` in-process (scripts and tests), exactly as the CLI would.

Composing with Hydra costs about 0.1 s per config, nearly all of it in choosing and merging the config-group
files (``method=fedcac``, ``partition=dirichlet``). A table composes hundreds of configs that differ mostly in
plain values (``seed=2``, ``partition.alpha=0.1``) over a handful of group choices, so inside
:func:`sharing_compositions` each distinct list of group choices is composed once and the value overrides are
applied to a copy of it with Hydra's own override code: Hydra likewise composes the groups first and applies
value overrides afterwards (``ConfigLoaderImpl._load_configuration_impl``), so the configs are the same (tested
on every cell of every paper table).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


class _SharedGroups:
    """Configs composed from group choices only, by (config name, group overrides in order)."""

    def __init__(self) -> None:
        self.bases: dict[tuple[str, tuple[str, ...]], DictConfig] = {}
        self.parsed: dict[str, tuple[Override, bool]] = {}  # override -> (parsed, is a value override)
        self.parser = OverridesParser.create()

    def parse(self, override: str) -> tuple[Override, bool]:
        """The parsed override and whether it sets a value (else it chooses, adds or deletes group files), by
        Hydra's rule (``hydra._internal.defaults_list.Overrides``): a dict value or a key that is no group."""
        if override not in self.parsed:
            parsed = self.parser.parse_overrides(overrides=[override])[0]
            repository = GlobalHydra.instance().config_loader().repository  # type: ignore[attr-defined]
            is_value = isinstance(parsed.value(), dict) or not repository.group_exists(parsed.key_or_group)
            self.parsed[override] = parsed, is_value
        return self.parsed[override]

    def compose(self, config_name: str, overrides: list[str]) -> DictConfig:
        """Hydra's composition of ``overrides``, the group part of it shared (call inside Hydra's init)."""
        try:
            parsed = [self.parse(o) for o in overrides]
        except Exception:  # noqa: BLE001 - Hydra's compose raises its own message for a malformed override
            return compose(config_name=config_name, overrides=overrides)
        if any(o.is_sweep_override() or o.is_hydra_override() for o, _ in parsed):
            return compose(config_name=config_name, overrides=overrides)  # Hydra's own errors and nodes
        groups = tuple(o.input_line for o, is_value in parsed if not is_value)
        key = (config_name, groups)
        if key not in self.bases:
            self.bases[key] = compose(config_name=config_name, overrides=list(groups))
        cfg = copy.deepcopy(self.bases[key])
        # the Override objects are not changed by applying them (Override.value() converts into new containers)
        ConfigLoaderImpl._apply_overrides_to_config([o for o, is_value in parsed if is_value], cfg)
        return cfg


_SHARED: ContextVar[_SharedGroups | None] = ContextVar("shared_compositions", default=None)


@contextmanager
def sharing_compositions() -> Iterator[None]:
    """Within this block :func:`compose_config` composes each distinct list of config-group choices once (a
    table's cells); a nested block shares the enclosing one. Outside, every call composes from scratch, so a
    changed file under ``conf/`` is always seen by the next block."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set(_SharedGroups())
    try:
        yield
    finally:
        _SHARED.reset(token)


def compose_config(overrides: Sequence[str] = (), config_name: str = "config") -> DictConfig:
    """The config ``python -m bench.experiment.run <overrides>`` would run with."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        shared = _SHARED.get()
        if shared is None:
            return compose(config_name=config_name, overrides=list(overrides))
        return shared.compose(config_name, list(overrides))


def to_container(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """A resolved plain-dict copy of a config (a DictConfig or a mapping)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return json.loads(json.dumps(cfg))
