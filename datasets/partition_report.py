"""Partition report: per-client class counts (CSV) and a dot plot like FedCAC's Appendix B (a summary figure above
:data:`MAX_DRAWN_CLIENTS` clients)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import torch

from common.verified_io import atomic_write_bytes, load_verified, save_verified
from datasets.partition import Partition

if TYPE_CHECKING:  # pandas and matplotlib are imported where a report is drawn (a cached report needs neither)
    import pandas as pd
    from matplotlib.figure import Figure

PARTS = ("train", "val", "test")


def class_counts(partition: Partition, pool_labels: torch.Tensor, num_classes: int) -> pd.DataFrame:
    """Rows (client, part) with part in train/val/test; columns class_0.. and total (one bincount per part, so
    it stays fast for any number of clients)."""
    import pandas as pd

    n = len(partition.clients)
    labels = pool_labels.cpu()
    counts = np.zeros((n, len(PARTS), num_classes + 1), dtype=np.int64)
    for j, part in enumerate(PARTS):
        indices = [getattr(client, part).cpu() for client in partition.clients]
        sizes = torch.tensor([idx.numel() for idx in indices], dtype=torch.int64)
        owner = torch.repeat_interleave(torch.arange(n), sizes)
        flat = torch.cat(indices).to(torch.int64) if indices else torch.zeros(0, dtype=torch.int64)
        counts[:, j, :num_classes] = torch.bincount(owner * num_classes + labels[flat],
                                                    minlength=n * num_classes).view(n, num_classes).numpy()
        counts[:, j, num_classes] = sizes.numpy()
    index = pd.MultiIndex.from_product([range(n), PARTS], names=["client", "part"])
    return pd.DataFrame(counts.reshape(n * len(PARTS), num_classes + 1), index=index,
                        columns=[*(f"class_{c}" for c in range(num_classes)), "total"])


#: the report's files, in the order they are written: class_counts.csv last, as it marks a complete report
REPORT_FILES = ("partition.png", "partition.pdf", "class_counts.csv")
#: the most clients drawn one by one (a dot per client and class); a larger federation's figure summarises it
#: (histogram of the clients' training samples, clients holding each class), so the report stays fast
MAX_DRAWN_CLIENTS = 200


def render_partition_report(partition: Partition, pool_labels: torch.Tensor, num_classes: int, *,
                            class_names: Sequence[str] | None = None, title: str | None = None) -> dict[str, bytes]:
    """The report's files as bytes: ``class_counts.csv`` and ``partition.png``/``.pdf`` (dot area ~ train
    samples; above :data:`MAX_DRAWN_CLIENTS` clients, a summary figure)."""
    plt = _pyplot()
    table = class_counts(partition, pool_labels, num_classes)
    train = table.xs("train", level="part")[[f"class_{c}" for c in range(num_classes)]].to_numpy()
    if len(partition.clients) <= MAX_DRAWN_CLIENTS:
        fig = _dot_plot(train, num_classes, class_names)
    else:
        fig = _summary_plot(train, num_classes, class_names)
    fig.axes[0].set_title(title or f"{partition.scheme} partition, {len(partition.clients)} clients")
    files = {"class_counts.csv": table.to_csv().encode()}
    for fmt, options in (("png", {"dpi": 120}), ("pdf", {})):
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, bbox_inches="tight", **options)
        files[f"partition.{fmt}"] = buffer.getvalue()
    plt.close(fig)
    return files


def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (imported on first use: ~0.5 CPU s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _dot_plot(train: np.ndarray, num_classes: int, class_names: Sequence[str] | None) -> Figure:
    """A dot per client and class it holds, its area ~ the client's training samples of the class."""
    plt = _pyplot()
    clients, classes = train.nonzero()
    sizes = train[clients, classes]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.18 * len(train)), max(3.0, 0.25 * num_classes)))
    ax.scatter(clients, classes, s=120 * sizes / max(int(sizes.max(initial=1)), 1), color="tab:red", alpha=0.7)
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.set_yticks(range(num_classes))
    if class_names is not None and num_classes <= 20:
        ax.set_yticklabels(list(class_names))
    ax.grid(alpha=0.3)
    return fig


def _summary_plot(train: np.ndarray, num_classes: int, class_names: Sequence[str] | None) -> Figure:
    """Too many clients to draw one by one: a histogram of the clients' training samples and, per class, how many
    clients hold it."""
    plt = _pyplot()
    fig, (sizes, holders) = plt.subplots(1, 2, figsize=(10.0, max(3.0, 0.25 * num_classes)))
    sizes.hist(train.sum(axis=1), bins=50, color="tab:red", alpha=0.7)
    sizes.set_xlabel("training samples per client")
    sizes.set_ylabel("clients")
    holders.barh(range(num_classes), (train > 0).sum(axis=0), color="tab:red", alpha=0.7)
    holders.set_xlabel("clients holding the class")
    holders.set_ylabel("class")
    holders.set_yticks(range(num_classes))
    if class_names is not None and num_classes <= 20:
        holders.set_yticklabels(list(class_names))
    for ax in (sizes, holders):
        ax.grid(alpha=0.3)
    return fig


def report_key(partition: Partition, pool_labels: torch.Tensor, num_classes: int, *,
               class_names: Sequence[str] | None = None, title: str | None = None) -> str:
    """A digest of everything :func:`render_partition_report` draws, so equal keys mean equal reports."""
    digest = hashlib.sha256(json.dumps([num_classes, list(class_names or []), title, partition.scheme,
                                        len(partition.clients)]).encode())
    for tensor in (pool_labels, *(getattr(c, part) for c in partition.clients for part in ("train", "val", "test"))):
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().to(torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()


def renderer_key() -> str:
    """What else decides a report's bytes: this module's code and the versions of the libraries that draw it."""
    versions = [metadata.version(name) for name in ("matplotlib", "pandas", "numpy")]
    return hashlib.sha256(Path(__file__).read_bytes() + json.dumps(versions).encode()).hexdigest()


def cached_partition_report(cache_dir: str | os.PathLike | None, partition: Partition, pool_labels: torch.Tensor,
                            num_classes: int, *, class_names: Sequence[str] | None = None,
                            title: str | None = None) -> dict[str, bytes]:
    """:func:`render_partition_report` through the content-addressed cache ``<cache_dir>/partition_reports/``
    (``cache_dir=None``: drawn every time). The key covers everything the report draws (:func:`report_key`) and
    what draws it (:func:`renderer_key`), so a cached report has the bytes a fresh one would have, except the PDF's
    creation date. A damaged cache file is redrawn and rewritten, with a warning naming it."""
    args, options = (partition, pool_labels, num_classes), {"class_names": class_names, "title": title}
    if cache_dir is None:
        return render_partition_report(*args, **options)
    key = hashlib.sha256(f"{report_key(*args, **options)} {renderer_key()}".encode()).hexdigest()
    path = Path(cache_dir) / "partition_reports" / key[:2] / f"{key}.pt"
    if path.exists():
        try:
            files = load_verified(path)
            if not (isinstance(files, dict) and all(isinstance(files.get(n), bytes) for n in REPORT_FILES)):
                raise ValueError("it does not hold the report's files")
            return {name: files[name] for name in REPORT_FILES}
        except Exception as err:  # noqa: BLE001 - a torn, altered or foreign file is redrawn below
            warnings.warn(f"partition report cache file {path} is unusable ({err}); redrawing it", RuntimeWarning,
                          stacklevel=2)
    files = render_partition_report(*args, **options)
    save_verified(path, files)
    return files


def write_report_files(files: Mapping[str, bytes], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write a rendered report to ``out_dir``, each file atomically and ``class_counts.csv`` last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        atomic_write_bytes(out / name, files[name])
    return {"csv": out / "class_counts.csv", "png": out / "partition.png", "pdf": out / "partition.pdf"}


def partition_label(partition: dict) -> str:
    """A short human label of a partition config, e.g. ``dirichlet a=0.1`` or ``pathological k=2``."""
    scheme = partition["scheme"]
    if "alpha" in partition:
        return f"{scheme} a={partition['alpha']}"
    for key in ("classes_per_client", "shards_per_client", "k"):
        if key in partition:
            return f"{scheme} k={partition[key]}"
    return scheme
