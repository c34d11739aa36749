"""A run's identity: which config keys decide what a run computes, and the hash and directory made of them.

A run directory is ``<out_dir>/<exp>/<method>/<dataset>-<scheme>-s<seed>-<hash[:10]>`` with ``hash`` the sha256 of
the run's *semantic* config (sorted-key JSON). Every key of the config is classified here, explicitly:

- :data:`SEMANTIC` keys enter the hash;
- :data:`OPEN_SECTIONS` (``dataset``, ``partition``, ``model``, ``method``) enter whole: what the chosen config
  group declares (a method's hyperparameters, a partitioner's parameters, a model's arguments, a data set's
  settings), except the keys listed in :data:`NON_SEMANTIC` or :data:`ADDED`;
- :data:`NON_SEMANTIC` keys never do (where results go, logging, devices and threads, caches);
- :data:`ADDED` keys came after runs existed: each names the value at which it changes nothing, and is left out
  of the hash at that value, so that the runs from before the key keep their directories.

A key in none of these lists is refused (:class:`UnclassifiedKey`, a configuration error naming the key and the
fix) instead of silently entering or leaving the hash: a new key of ``conf/config.yaml`` moves no existing run
until someone decides which list it belongs to (``tests/test_identity.py`` checks that every key of
``conf/config.yaml`` is classified). A new key inside an open section (a new hyperparameter of a method) goes to
:data:`ADDED` with its neutral value, unless its default is meant to change that method's runs.

:data:`IDENTITY_VERSION` names this rule. Version 1 is the hash every committed run was named by (every key
except the non-semantic ones and the added ones at their neutral values); a change of which keys enter, or of
how they are written, is a new version and keeps the old one's function here so that old runs are still found.

This module imports neither torch nor the methods: readers of run directories use it without either.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: the rule a run's config hash is computed by (see the module's docstring)
IDENTITY_VERSION = 1

#: keys that decide what a run computes, dotted for a key inside a section
SEMANTIC = frozenset({
    "exp", "seed", "data_seed", "num_clients", "participation", "rounds",
    *(f"train.{key}" for key in ("optimizer", "lr", "lr_decay", "momentum", "nesterov", "weight_decay", "epochs",
                                 "batch_size", "drop_last", "grad_clip")),
    "eval.every", "eval.batch_size", "eval.primary",
    "capacity.setting", "capacity.low", "capacity.high",
})

#: sections that enter whole (what the chosen config group declares), less their NON_SEMANTIC and ADDED keys
OPEN_SECTIONS = frozenset({"dataset", "partition", "model", "method"})

#: keys that do not change what is computed (where results go, logging, devices, threads, caches, and the margin of
#: the "did not train" verdict, which changes no record)
NON_SEMANTIC = frozenset({
    "out_dir", "run_dir", "quiet", "logger", "device", "threads", "checkpoint", "client_state", "cache_dir",
    "imports", "data_root", "hydra", "dataset.root", "dataset.download", "partition.path", "eval.chance_z",
})


def _equals(neutral: Any) -> Callable[[Any], bool]:
    return lambda value: value == neutral and type(value) is type(neutral)


#: keys added after runs existed -> "this value changes nothing": left out of the hash at that value, so that the runs
#: from before the key keep their directories (``capacity`` as a whole: every client at full width)
ADDED: dict[str, Callable[[Any], bool]] = {
    "capacity": lambda value: isinstance(value, Mapping) and value.get("setting") == "ideal",
    "compile": _equals(False),
    "train.norm_mode": _equals("train"),
    "train.batched_clients": _equals(False),
    "eval.early_stop": lambda value: value is None,
    **{f"{where}.{key}": neutral for where in ("capacity", "method.federation.capacity")
       for key, neutral in (("width_rule", _equals("method")), ("width_step", lambda value: value is None))},
}


class UnclassifiedKey(ValueError):
    """A config key that :mod:`bench.identity` does not classify: it would enter or leave every run's hash silently."""


def _classify(key: str) -> str:
    """``"semantic"``, ``"non-semantic"``, ``"added"``, ``"section"`` (a closed section: look inside) or
    ``"unclassified"`` for a dotted key."""
    if key in NON_SEMANTIC:
        return "non-semantic"
    if key in ADDED:
        return "added"
    if key in SEMANTIC or key.split(".")[0] in OPEN_SECTIONS:
        return "semantic"
    return "section" if _has_keys_below(key) else "unclassified"


def _has_keys_below(key: str) -> bool:
    """Whether some key of this module's lists lies inside ``key`` (which is then classified key by key)."""
    return any(k.startswith(key + ".") for k in (*SEMANTIC, *NON_SEMANTIC, *ADDED))


def semantic_config(cfg: Mapping[str, Any], version: int = IDENTITY_VERSION) -> dict[str, Any]:
    """The part of a resolved config that a run's identity is made of (a new dict; ``cfg`` is left as it is).
    Raises :class:`UnclassifiedKey` for a key that is in none of this module's lists."""
    if version != 1:
        raise ValueError(f"identity version {version} is unknown: this tree knows version 1")

    def keep(node: Mapping[str, Any], prefix: str) -> dict[str, Any]:
        out = {}
        for name, value in node.items():
            key = f"{prefix}{name}"
            kind = _classify(key)
            if kind == "unclassified":
                raise UnclassifiedKey(
                    f"config key {key!r} is not classified in bench/identity.py: add it to SEMANTIC (it changes what a "
                    "run computes: every existing run with it moves), to ADDED with the value at which it changes "
                    "nothing (existing runs keep their directories) or to NON_SEMANTIC")
            if kind == "non-semantic" or (kind == "added" and ADDED[key](value)):
                continue
            inside = key.split(".")[0] in OPEN_SECTIONS or _has_keys_below(key)
            out[name] = keep(value, f"{key}.") if isinstance(value, Mapping) and inside else value
        return out

    return keep(json.loads(json.dumps(cfg)), "")


def config_hash(cfg: Mapping[str, Any], version: int = IDENTITY_VERSION) -> str:
    """sha256 over the semantic part of the resolved config (:func:`semantic_config`), as sorted-key JSON."""
    return hashlib.sha256(json.dumps(semantic_config(cfg, version), sort_keys=True).encode()).hexdigest()


def run_dir_for(cfg: Mapping[str, Any]) -> Path:
    """A run's directory: ``run_dir`` when set, else ``<out_dir>/<exp>/<method>/<dataset>-<scheme>-s<seed>-<hash>``
    with the first ten hex digits of :func:`config_hash`."""
    if cfg.get("run_dir"):
        return Path(cfg["run_dir"])
    name = f"{cfg['dataset']['name']}-{cfg['partition']['scheme']}-s{cfg['seed']}-{config_hash(cfg)[:10]}"
    return Path(cfg["out_dir"]) / cfg.get("exp", "default") / cfg["method"]["name"] / name
