"""Partitions out: write a run's partition as a partition file another library (or ``partition=from_file``) reads.

Usage: ``python -m bench.experiment.partition export <run_dir> [--out FILE] [--format npz|json|pfllib]``

The partition is rebuilt from the run's ``config.yaml`` (data loaded as the run loaded it, partition through
the cache of the config's ``cache_dir``) and checked against the run's ``partition/class_counts.csv``. The
file holds per-client indices into the official train and test splits (``docs/partition_format.md``);
the default output is ``<run_dir>/partition/partition.npz``. Feed it back with
``python -m bench.experiment.run partition=from_file partition.path=<file> num_clients=<N> ...``.

``--format pfllib`` writes the clients' data itself in PFLlib's layout instead of indices: a folder with
``train/<i>.npz`` and ``test/<i>.npz`` per client, each holding ``data = {"x": float32 [n, C, H, W], "y": int64
[n]}`` (the images exactly as the harness feeds them to a model: the dataset's test transform, here none), and a
``config.json`` of the class counts; PFLlib reads it as ``-data <folder name>`` from its ``dataset/`` folder.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from bench.builder import import_plugins
from bench.core.data import load_sources, partition_labels, partition_sources, source_labels
from bench.experiment.errors import config_phase, run_cli
from datasets.label_counts import label_info_from_counts
from datasets.partition import Partition
from datasets.partition_file import partition_to_clients, write_partition_file
from datasets.partition_report import class_counts
from datasets.sources import DataSourceError


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


def partition_of(cfg: Mapping[str, Any]) -> tuple[Partition, torch.Tensor, str]:
    """(partition, pool labels: train then test, where the labels came from) of a cell config: from the data when it
    is present, else from the official label counts (as ``bench.experiment.precheck.dry_build``)."""
    import_plugins(cfg)
    try:
        labels, origin = source_labels(*load_sources(cfg["dataset"], cfg.get("data_root"))), "data"
    except DataSourceError:
        labels = label_info_from_counts(cfg["dataset"].get("domains") or [cfg["dataset"]["source"]])
        origin = "official label counts"
    partition = partition_labels(labels, str(cfg["dataset"]["name"]), cfg["partition"],
                                 num_clients=int(cfg["num_clients"]), data_seed=int(cfg["data_seed"]))
    return partition, torch.cat([labels.train_labels, labels.test_labels]), origin


def train_counts(partition: Partition, pool: torch.Tensor) -> np.ndarray:
    """clients x classes: each client's training samples per class (its train and validation parts)."""
    num_classes = int(pool.max()) + 1
    table = class_counts(partition, pool, num_classes)[[f"class_{c}" for c in range(num_classes)]]
    return (table.xs("train", level="part") + table.xs("val", level="part")).to_numpy()


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


def export_pfllib(conf: Mapping[str, Any], out: str | Path) -> Path:
    """Write the clients of the config's partition as a PFLlib data folder ``out`` (see the module docstring).

    A client's training part is its ``train`` indices (validation samples, if any, are left out); its test part
    is its ``test`` samples, taken from the test split or held out of the train split. Images go through the
    dataset's ``test_transform`` (the deterministic one every evaluation uses)."""
    import json

    import numpy as np

    from datasets.augment import build_transform

    if conf["dataset"].get("domains"):
        raise ValueError("--format pfllib supports single-domain data sets only")
    partition, pool_labels, n_train, num_classes = rebuild_partition(conf)
    train, test = load_sources(conf["dataset"], conf.get("data_root"))
    images = torch.cat([train[0].images, test[0].images])
    transform = build_transform(conf["dataset"].get("test_transform"))
    out = Path(out)
    counts = []
    for part in ("train", "test"):
        (out / part).mkdir(parents=True, exist_ok=True)
    for cid, client in enumerate(partition.clients):
        row = {}
        for part, idx in (("train", client.train), ("test", client.test)):
            idx = idx.cpu().long().sort().values
            x = transform(images[idx], torch.Generator().manual_seed(0)).contiguous()
            y = pool_labels[idx]
            with open(out / part / f"{cid}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": x.numpy().astype(np.float32), "y": y.numpy().astype(np.int64)})
            row[part] = np.bincount(y.numpy(), minlength=num_classes).tolist()
        counts.append(row)
    info = {"num_clients": len(partition.clients), "num_classes": num_classes, "dataset": conf["dataset"]["name"],
            "scheme": conf["partition"]["scheme"], "data_seed": int(conf["data_seed"]), "class_counts": counts}
    (out / "config.json").write_text(json.dumps(info, indent=1) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write a run's partition as a .npz or .json partition file")
    exp.add_argument("run_dir", help="a run directory (holds config.yaml)")
    exp.add_argument("--out", help="output file (default: <run_dir>/partition/partition.<format>)")
    exp.add_argument("--format", choices=("npz", "json", "pfllib"),
                     help="default: from --out's suffix, else npz; pfllib: a PFLlib data folder (--out required)")
    args = parser.parse_args(argv)
    with config_phase():  # a missing or unreadable run, data that changed: a short message and exit status 2
        if args.format == "pfllib":
            if not args.out:
                raise ValueError("--format pfllib needs --out <folder> (PFLlib's dataset/<name>)")
            conf = load_run_config(args.run_dir)
            partition, pool, _, num_classes = rebuild_partition(conf)
            check_against_report(Path(args.run_dir), partition, pool, num_classes)
            path = export_pfllib(conf, args.out)
        else:
            path = export(args.run_dir, args.out, args.format)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(run_cli(main))
