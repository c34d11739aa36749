"""Every config value is checked for type and range before a run directory, a cache entry or a job exists.

``check_config`` refuses, with one message naming the key, the value and what is allowed:

- keys nothing reads (``+train.lrr=0.1``): the top level and the fixed sections (``train``, ``eval``,
  ``checkpoint``, ``client_state``, ``logger``, ``capacity``) accept only the keys of ``conf/config.yaml``; a method's
  hyperparameters are its ``Hyper`` fields, a partition's its scheme's parameters (``bench.experiment.run.validate``);
- values of the wrong type or out of range (the rules below), and a method's hyperparameters of the wrong
  type (from the annotations of its ``Hyper`` dataclass).

Impossible combinations that need the data (more clients than samples, a client left without training or test
samples, a model that does not fit the input) are refused when the experiment is built, which also happens before
anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import OmegaConf

from bench.core.engine import NORM_MODES
from bench.experiment.compose import CONF_DIR

#: the config groups: dataset and model keys are checked below, partition and method keys by their owners
GROUPS = ("dataset", "partition", "model", "method")
#: keys of the dataset and model groups (their ``options`` go to the data source or model, which check them)
GROUP_KEYS = {
    "dataset": {"name", "source", "domains", "image_size", "channels", "train_transform", "test_transform", "options",
                "root", "download", "n_train_per_client", "n_test_per_client"},
    "model": {"name", "width", "options", "pretrained"},
}


def _int(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f"an integer >= {low}"


def _real(test: Callable[[float], bool], text: str) -> tuple[Callable[[Any], bool], str]:
    def ok(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and test(float(v))

    return ok, text


def _one_of(*allowed: Any) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in allowed), f"one of {list(allowed)}"


def _optional(rule: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or rule[0](v)), f"null or {rule[1]}"


_BOOL = ((lambda v: isinstance(v, bool)), "true or false")
_TEXT = ((lambda v: isinstance(v, str) and v != ""), "a non-empty string")

RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": _int(0),
    "data_seed": _int(0),
    "num_clients": _int(1),
    "participation": _real(lambda v: 0 < v <= 1, "in (0, 1]"),
    "rounds": _int(1),
    "threads": _optional(_int(1)),
    "quiet": _BOOL,
    "compile": _BOOL,
    "exp": _TEXT,
    "out_dir": _TEXT,
    "cache_dir": _optional(_TEXT),
    "imports": ((lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)), "a list of module names"),
    "train.optimizer": _one_of("sgd", "adam"),
    "train.lr": _real(lambda v: v > 0, "a finite number > 0"),
    "train.lr_decay": _real(lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "train.momentum": _real(lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "train.nesterov": _BOOL,
    "train.weight_decay": _real(lambda v: v >= 0, "a finite number >= 0"),
    "train.epochs": _int(1),
    "train.batch_size": _int(1),
    "train.drop_last": _BOOL,
    "train.grad_clip": _optional(_real(lambda v: v > 0, "a finite number > 0")),
    "train.norm_mode": _one_of(*NORM_MODES),
    "train.batched_clients": _BOOL,
    "train.keep_optimizer_state": _BOOL,
    "eval.every": _int(1),
    "eval.batch_size": _int(1),
    "eval.chance_z": _optional(_real(lambda v: v >= 0, "a finite number >= 0 (null: no verdict)")),
    "checkpoint.every_rounds": _int(1),
    "checkpoint.every_seconds": _real(lambda v: v > 0, "a number of seconds > 0"),
    "client_state.memory_mb": _optional(_real(lambda v: v > 0, "a number of MB > 0 (null: in memory)")),
    "logger.wandb.mode": _one_of("offline", "online", "disabled"),
    "model.width": _real(lambda v: 0 < v <= 16, "a number in (0, 16]"),
    "dataset.image_size": _optional(_int(1)),
    "dataset.channels": _optional(_one_of(1, 3)),
    "partition.val_fraction": _real(lambda v: 0 <= v < 1, "a number in [0, 1)"),
}


def _get(cfg: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _keys(node: Mapping[str, Any], prefix: str = "") -> set[str]:
    out = set()
    for key, value in node.items():
        out.add(prefix + key)
        if isinstance(value, Mapping):
            out |= _keys(value, f"{prefix}{key}.")
    return out


@functools.cache
def base_keys() -> frozenset[str]:
    """Every key of conf/config.yaml outside the config groups (read as a file: composing here would clash with a
    running Hydra app)."""
    base = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False)
    return frozenset(k for k in _keys(base) if k.split(".")[0] not in (*GROUPS, "defaults"))


def check_config(cfg: Mapping[str, Any]) -> None:
    """Refuse unknown keys and bad values (see the module docstring); the message names the key."""
    known = base_keys()
    unknown = sorted(k for k in _keys(cfg) if k.split(".")[0] not in GROUPS and k not in known
                     and not k.startswith(("hydra", "logger.wandb.tags")))
    unknown += sorted(f"{group}.{key}" for group, keys in GROUP_KEYS.items() for key in cfg.get(group, {})
                      if key not in keys)
    if unknown:
        raise ValueError(f"config key(s) {unknown} are not read by anything: remove them (or fix their spelling); "
                         f"the settings are listed in conf/config.yaml and conf/<group>/*.yaml")
    for key, (ok, allowed) in RULES.items():
        present, value = _get(cfg, key)
        if present and not ok(value):
            raise ValueError(f"{key}={value!r} is invalid: it must be {allowed}")
    if cfg["train"].get("nesterov") and not cfg["train"].get("momentum"):
        raise ValueError("train.nesterov=true needs train.momentum > 0 (Nesterov momentum without momentum)")


def check_hyperparameter_types(hyper: type, values: Mapping[str, Any], method: str) -> None:
    """Each value of ``values`` matches the annotation of its field in the ``Hyper`` dataclass."""
    hints = typing.get_type_hints(hyper)
    for field in dataclasses.fields(hyper):
        if field.name in values and not _matches(values[field.name], hints.get(field.name, Any)):
            raise ValueError(f"method.{field.name}={values[field.name]!r} is invalid for method {method}: it must be "
                             f"{_describe(hints.get(field.name, Any))}")


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return isinstance(value, list | tuple) and all(_matches(v, args[0]) for v in value) if args else \
            isinstance(value, list | tuple)
    if origin is dict or hint is dict:
        return isinstance(value, Mapping)
    return True


def _describe(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")
