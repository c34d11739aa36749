"""Content-addressed on-disk cache of partitions.

The key is a sha256 over (dataset, scheme, the source of its draw function, parameters, clients, data seed,
val fraction, label fingerprint). Files are written to a unique temp file and moved into place with
``os.replace``, so any number of concurrent runs may compute the same partition: they write identical bytes
and a reader never sees a torn file. Every file carries the sha256 of its content, checked on load: an
unreadable or altered file is recomputed and rewritten, with a warning naming it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from common.verified_io import load_verified, save_verified
from datasets.partition import PARTITIONERS, LabelInfo, Partition, make_partition


def label_fingerprint(labels: LabelInfo) -> str:
    h = hashlib.sha256()
    for t in (labels.train_labels, labels.test_labels, labels.train_domains, labels.test_domains):
        h.update(b"-" if t is None else t.to(torch.int64).cpu().numpy().tobytes())
    h.update(json.dumps([labels.num_classes, list(labels.domain_names)]).encode())
    return h.hexdigest()


def scheme_code(scheme: str) -> str:
    """sha256 of the source of the scheme's draw function (a user's scheme edited in place gets new keys)."""
    draw = PARTITIONERS.get(scheme).draw
    try:
        source = inspect.getsource(draw)
    except (OSError, TypeError):  # defined where no source is available (an interactive session)
        source = f"{draw.__module__}.{draw.__qualname__}"
    return hashlib.sha256(source.encode()).hexdigest()


def partition_key(dataset: str, scheme: str, params: Mapping[str, Any], num_clients: int, seed: int,
                  val_fraction: float, fingerprint: str) -> str:
    blob = json.dumps({"dataset": dataset, "scheme": scheme, "params": dict(params), "clients": num_clients,
                       "seed": seed, "val_fraction": float(val_fraction), "labels": fingerprint,
                       "code": scheme_code(scheme)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def cached_partition(cache_dir: str | os.PathLike | None, dataset: str, scheme: str, labels: LabelInfo,
                     num_clients: int, seed: int, *, val_fraction: float = 0.0,
                     accept: Callable[[Partition], None] | None = None, **params: Any) -> Partition:
    """``make_partition`` through the cache (``cache_dir=None``: no cache). ``accept(partition)`` raises for a
    partition the caller cannot use; such a partition is not written to the cache."""
    path = None
    if cache_dir is not None:
        key = partition_key(dataset, scheme, params, num_clients, seed, val_fraction, label_fingerprint(labels))
        path = Path(cache_dir) / "partitions" / key[:2] / f"{key}.pt"
    partition = None
    if path is not None and path.exists():
        try:
            partition = Partition.from_state(load_verified(path))
        except Exception as err:  # noqa: BLE001 - a torn, altered or foreign file is recomputed below
            warnings.warn(f"partition cache file {path} is unusable ({err}); recomputing it", RuntimeWarning,
                          stacklevel=2)
    fresh = partition is None
    if partition is None:
        partition = make_partition(scheme, labels, num_clients, seed, val_fraction=val_fraction, **params)
    if accept is not None:
        accept(partition)
    if fresh and path is not None:
        save_verified(path, partition.to_state())
    return partition
    key = partition_key(dataset, scheme, params, num_clients, seed, val_fraction, label_fingerprint(labels))
    path = Path(cache_dir) / "partitions" / key[:2] / f"{key}.pt"
    if path.exists():
        try:
            cached = Partition.from_state(load_verified(path))
        except Exception as err:  # noqa: BLE001 - a torn, altered or foreign file is recomputed below
            warnings.warn(f"partition cache file {path} is unusable ({err}); recomputing it", RuntimeWarning,
                          stacklevel=2)
        else:
            accept(cached)
            return cached
    partition = make_partition(scheme, labels, num_clients, seed, val_fraction=val_fraction, **params)
    accept(partition)
    save_verified(path, partition.to_state())
    return partition
