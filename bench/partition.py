"""Partitions out: write a run's partition as a partition file another library (or ``partition=from_file``) reads.

Usage: ``python -m bench.partition export <run_dir> [--out FILE] [--format npz|json]``

The partition is rebuilt from the run's ``config.yaml`` (data loaded as the run loaded it, partition through
the cache of the config's ``cache_dir``) and checked against the run's ``partition/class_counts.csv``. The
file holds per-client indices into the official train and test splits (``docs/partition_format.md``);
the default output is ``<run_dir>/partition/partition.npz``. Feed it back with
``python -m bench.run partition=from_file partition.path=<file> num_clients=<N> ...``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import OmegaConf

from bench.core.builder import import_plugins
from bench.core.data import load_sources, partition_sources
from bench.errors import config_phase, run_cli
from datasets.partition import Partition
from datasets.partition_file import partition_to_clients, write_partition_file
from datasets.partition_report import class_counts


def load_run_config(run_dir: str | Path) -> dict[str, Any]:
    """The resolved config a run directory was run with."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give a run directory (it holds config.yaml)")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


def rebuild_partition(conf: Mapping[str, Any]) -> tuple[Partition, torch.Tensor, int, int]:
    """(partition, pool labels, size of the official train split, number of classes) of a run config."""
    import_plugins(conf)
    train, test = load_sources(conf["dataset"], conf.get("data_root"))
    labels, partition = partition_sources(train, test, str(conf["dataset"]["name"]), conf["partition"],
                                          num_clients=int(conf["num_clients"]), data_seed=int(conf["data_seed"]),
                                          cache_dir=conf.get("cache_dir"))
    pool = torch.cat([labels.train_labels, labels.test_labels])
    return partition, pool, int(labels.train_labels.numel()), labels.num_classes


def check_against_report(run_dir: Path, partition: Partition, pool: torch.Tensor, num_classes: int) -> None:
    """Raise if the rebuilt partition's class counts differ from the run's ``partition/class_counts.csv``."""
    csv = run_dir / "partition" / "class_counts.csv"
    if not csv.is_file():
        return
    recorded = pd.read_csv(csv, index_col=["client", "part"])
    rebuilt = class_counts(partition, pool, num_classes)
    if recorded.shape != rebuilt.shape or not (recorded.to_numpy() == rebuilt.to_numpy()).all():
        raise ValueError(f"the partition rebuilt from {run_dir / 'config.yaml'} does not match {csv}: the data "
                         "or the partition code changed since the run; export from a checkout matching the run")


def export(run_dir: str | Path, out: str | Path | None = None, fmt: str | None = None) -> Path:
    """Write the partition of the run in ``run_dir`` as a partition file; returns its path."""
    run_dir = Path(run_dir)
    conf = load_run_config(run_dir)
    partition, pool, n_train, num_classes = rebuild_partition(conf)
    check_against_report(run_dir, partition, pool, num_classes)
    out = Path(out) if out is not None else run_dir / "partition" / f"partition.{fmt or 'npz'}"
    meta = {"exported_from": str(run_dir), "scheme": conf["partition"]["scheme"],
            "data_seed": int(conf["data_seed"]), "n_train": n_train, "n_test": int(pool.numel()) - n_train}
    return write_partition_file(out, partition_to_clients(partition, n_train), fmt=fmt,
                                dataset=str(conf["dataset"]["name"]), meta=meta)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write a run's partition as a .npz or .json partition file")
    exp.add_argument("run_dir", help="a run directory (holds config.yaml)")
    exp.add_argument("--out", help="output file (default: <run_dir>/partition/partition.<format>)")
    exp.add_argument("--format", choices=("npz", "json"), help="default: from --out's suffix, else npz")
    args = parser.parse_args(argv)
    with config_phase():  # a missing or unreadable run, data that changed: a short message and exit status 2
        path = export(args.run_dir, args.out, args.format)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
