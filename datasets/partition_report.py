"""Partition report: per-client class counts (CSV) and a dot plot like FedCAC's Appendix B."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from bench.core.records import atomic_write_bytes  # noqa: E402
from datasets.partition import Partition  # noqa: E402


def class_counts(partition: Partition, pool_labels: torch.Tensor, num_classes: int) -> pd.DataFrame:
    """Rows (client, part) with part in train/val/test; columns class_0.. and total."""
    rows = []
    for cid, client in enumerate(partition.clients):
        for part in ("train", "val", "test"):
            idx = getattr(client, part)
            counts = torch.bincount(pool_labels[idx], minlength=num_classes).tolist()
            rows.append({"client": cid, "part": part, **{f"class_{c}": n for c, n in enumerate(counts)},
                         "total": int(idx.numel())})
    return pd.DataFrame(rows).set_index(["client", "part"])


#: the report's files, in the order they are written: class_counts.csv last, as it marks a complete report
REPORT_FILES = ("partition.png", "partition.pdf", "class_counts.csv")


def render_partition_report(partition: Partition, pool_labels: torch.Tensor, num_classes: int, *,
                            class_names: Sequence[str] | None = None, title: str | None = None) -> dict[str, bytes]:
    """The report's files as bytes: ``class_counts.csv`` and ``partition.png``/``.pdf`` (dot area ~ train
    samples)."""
    table = class_counts(partition, pool_labels, num_classes)
    train = table.xs("train", level="part")[[f"class_{c}" for c in range(num_classes)]].to_numpy()
    clients, classes = train.nonzero()
    sizes = train[clients, classes]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.18 * len(partition.clients)), max(3.0, 0.25 * num_classes)))
    ax.scatter(clients, classes, s=120 * sizes / max(int(sizes.max(initial=1)), 1), color="tab:red", alpha=0.7)
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.set_yticks(range(num_classes))
    if class_names is not None and num_classes <= 20:
        ax.set_yticklabels(list(class_names))
    ax.set_title(title or f"{partition.scheme} partition, {len(partition.clients)} clients")
    ax.grid(alpha=0.3)
    files = {"class_counts.csv": table.to_csv().encode()}
    for fmt, options in (("png", {"dpi": 120}), ("pdf", {})):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, bbox_inches="tight", **options)
        files[f"partition.{fmt}"] = buffer.getvalue()
    plt.close(fig)
    return files


def report_key(partition: Partition, pool_labels: torch.Tensor, num_classes: int, *,
               class_names: Sequence[str] | None = None, title: str | None = None) -> str:
    """A digest of everything :func:`render_partition_report` draws, so equal keys mean equal reports."""
    digest = hashlib.sha256(json.dumps([num_classes, list(class_names or []), title, partition.scheme,
                                        len(partition.clients)]).encode())
    for tensor in (pool_labels, *(getattr(c, part) for c in partition.clients for part in ("train", "val", "test"))):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().to(torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()


def write_report_files(files: Mapping[str, bytes], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write a rendered report to ``out_dir``, each file atomically and ``class_counts.csv`` last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        atomic_write_bytes(out / name, files[name])
    return {"csv": out / "class_counts.csv", "png": out / "partition.png", "pdf": out / "partition.pdf"}


def write_partition_report(partition: Partition, pool_labels: torch.Tensor, num_classes: int,
                           out_dir: str | os.PathLike, *, class_names: Sequence[str] | None = None,
                           title: str | None = None) -> dict[str, Path]:
    """Write ``class_counts.csv`` and ``partition.png``/``.pdf`` (dot area ~ train samples) to ``out_dir``."""
    return write_report_files(render_partition_report(partition, pool_labels, num_classes, class_names=class_names,
                                                      title=title), out_dir)


def partition_label(partition: dict) -> str:
    """A short human label of a partition config, e.g. ``dirichlet a=0.1`` or ``pathological k=2``."""
    scheme = partition["scheme"]
    if "alpha" in partition:
        return f"{scheme} a={partition['alpha']}"
    for key in ("classes_per_client", "shards_per_client", "k"):
        if key in partition:
            return f"{scheme} k={partition[key]}"
    return scheme
