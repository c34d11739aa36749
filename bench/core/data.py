"""The federated dataset as the engine sees it: one in-memory pool and per-client index tensors.

All images the clients use are gathered once into a pool tensor on the training device. A client's
batch is ``pool[indices[perm[i:i+B]]]``: no DataLoader, no disk reads and no copies per client per round.
Shuffles and augmentations draw from the ``torch.Generator`` passed in, so batches are a pure function of
(seed, round, client).
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

import datasets.feature_shift  # noqa: F401  (registers Digit-5, Office-Caltech-10 and the stand-in digits)
import datasets.partition_file  # noqa: F401  (registers the from_file partition scheme)
import datasets.synthetic  # noqa: F401  (registers the synthetic source)
from datasets.augment import Compose, build_transform
from datasets.partition import LabelInfo, Partition
from datasets.partition_cache import cached_partition
from datasets.sources import ImageData, load_source

T = TypeVar("T")

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ClientData:
    """One client's view of the pool."""

    cid: int
    pool: FederatedData
    train: torch.Tensor  # int64 positions in the pool (on the pool's device)
    val: torch.Tensor
    test: torch.Tensor

    def size(self, split: str) -> int:
        return int(getattr(self, split).numel())

    def batches(
        self,
        split: str,
        batch_size: int,
        generator: torch.Generator | None = None,
        *,
        shuffle: bool = True,
        augment: bool = True,
        drop_last: bool = False,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches of (images, labels); shuffled and augmented with ``generator`` when training."""
        index = getattr(self, split)
        if shuffle:
            if generator is None:
                raise ValueError("shuffle=True needs a generator (determinism)")
            perm = torch.randperm(index.numel(), generator=generator, device=generator.device)
            index = index[perm.to(index.device)]
        transform = self.pool.train_transform if augment else self.pool.test_transform
        n = index.numel()
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = index[start : start + batch_size]
            yield transform(self.pool.images[idx], generator), self.pool.labels[idx]


@dataclass(frozen=True)
class FederatedData:
    """Pool of images and labels on ``device`` plus each client's train/val/test positions."""

    images: torch.Tensor  # float32 [P, C, H, W], values in [0, 1]
    labels: torch.Tensor  # int64 [P]
    splits: tuple[dict[str, torch.Tensor], ...]  # per client: split -> pool positions
    classes: tuple[str, ...]
    train_transform: Compose
    test_transform: Compose
    partition: Partition
    pool_labels_full: torch.Tensor  # labels of the uncompacted pool (for partition reports)

    @property
    def num_clients(self) -> int:
        return len(self.splits)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def in_channels(self) -> int:
        return int(self.images.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.images.shape[-1])

    def client(self, cid: int) -> ClientData:
        s = self.splits[cid]
        return ClientData(cid, self, s["train"], s["val"], s["test"])

    def sizes(self, split: str) -> torch.Tensor:
        """Number of samples per client in ``split`` (float64, CPU)."""
        return torch.tensor([s[split].numel() for s in self.splits], dtype=torch.float64)


class SharedSources:
    """Loaded sources kept for the next runs of a process, keyed by everything :func:`load_sources` reads from
    the config; the ``capacity`` most recently used are kept. Only a process that serves many runs (a pool
    worker, :func:`sharing_sources`) keeps them: a source is decoded and resized once per worker instead of once
    per run (0.7 s of a 6 s mini run on Fashion-MNIST). The tensors are shared read-only: every consumer copies
    (``torch.cat``, indexing) before it changes anything. A data file replaced while the worker lives is not
    reread."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SharedSources capacity={capacity} is invalid: it must be >= 1")
        self.capacity = capacity
        self.loaded: OrderedDict[str, tuple[list[ImageData], list[ImageData]]] = OrderedDict()
        self.loads = 0  # sources actually read (a test and a benchmark can check that sharing took place)
        self.kept: OrderedDict[str, Any] = OrderedDict()  # see keep()

    def get(self, key: str, load: Callable[[], tuple[list[ImageData], list[ImageData]]]
            ) -> tuple[list[ImageData], list[ImageData]]:
        fresh = key not in self.loaded
        train, test = _most_recent(self.loaded, key, load, self.capacity)
        self.loads += fresh  # after a successful load only: a failed read is neither kept nor counted
        return list(train), list(test)

    #: how many derived results :meth:`keep` holds (a partition report is about 40 kB)
    KEPT = 64

    def keep(self, key: str, make: Callable[[], T]) -> T:
        """``make()``, computed once per ``key`` while this cache lives (the :attr:`KEPT` most recently used are
        held): results derived from the data that many runs of a process share, such as the files of a
        partition's report (0.14 s to draw, the same for every method on that partition). ``key`` must name
        everything ``make`` depends on, and the result must not be changed by its users."""
        return _most_recent(self.kept, key, make, self.KEPT)


def _most_recent(store: OrderedDict[str, Any], key: str, make: Callable[[], T], limit: int) -> T:
    """``store[key]``, made by ``make()`` when missing; ``store`` keeps the ``limit`` most recently used."""
    if key not in store:
        store[key] = make()
        while len(store) > limit:
            store.popitem(last=False)
    store.move_to_end(key)
    return store[key]


_active: ContextVar[SharedSources | None] = ContextVar("shared_sources", default=None)


def active_sharing() -> SharedSources | None:
    """The cache of the enclosing :func:`sharing_sources` block, or None outside any."""
    return _active.get()


@contextlib.contextmanager
def sharing_sources(capacity: int = 2) -> Iterator[SharedSources]:
    """Within this block :func:`load_sources` serves a source already loaded in this process from memory; a
    block inside another shares the outer one's cache."""
    outer = _active.get()
    if outer is not None:
        yield outer
        return
    shared = SharedSources(capacity)
    token = _active.set(shared)
    try:
        yield shared
    finally:
        _active.reset(token)
        # A thread started inside the block (W&B's) keeps a copy of this context, and with it this cache, until
        # it ends. Were the tensors freed with that copy, at interpreter exit, a daemon thread would free them
        # as the interpreter shuts down, and torch's deallocator, taking the GIL back, would abort the process
        # ("terminate called without an active exception"). They are freed here, by the block's own thread.
        shared.loaded.clear()
        shared.kept.clear()


def load_sources(cfg: Mapping[str, Any], data_root: str | None) -> tuple[list[ImageData], list[ImageData]]:
    """Train and test parts of every domain named by the dataset config (one domain unless ``domains``);
    raises DataSourceError when files are missing."""
    names: Sequence[str] = cfg.get("domains") or [cfg["source"]]
    opts = dict(cfg.get("options") or {})
    kwargs = dict(image_size=cfg.get("image_size"), channels=cfg.get("channels"), download=cfg.get("download", False))
    root = cfg.get("root") or data_root
    shared = _active.get()
    if shared is not None:
        key = json.dumps({"names": list(names), "options": opts, **kwargs, "root": root}, sort_keys=True, default=str)
        return shared.get(key, lambda: _load_sources(names, root, kwargs, opts))
    return _load_sources(names, root, kwargs, opts)


def _load_sources(names: Sequence[str], root: str | None, kwargs: Mapping[str, Any],
                  opts: Mapping[str, Any]) -> tuple[list[ImageData], list[ImageData]]:
    train = [load_source(n, "train", root, **kwargs, **opts) for n in names]
    test = [load_source(n, "test", root, **kwargs, **opts) for n in names]
    classes = train[0].classes
    for part in train + test:
        if part.classes != classes:
            raise ValueError(f"domain {part.domain!r} has classes {part.classes}, expected {classes}")
    return train, test


def source_labels(train: Sequence[ImageData], test: Sequence[ImageData]) -> LabelInfo:
    """What a partitioner sees of loaded sources: their labels (and domains, when several)."""
    multi = len(train) > 1
    return LabelInfo(
        train_labels=torch.cat([p.labels for p in train]),
        test_labels=torch.cat([p.labels for p in test]),
        num_classes=len(train[0].classes),
        train_domains=torch.cat([torch.full_like(p.labels, i) for i, p in enumerate(train)]) if multi else None,
        test_domains=torch.cat([torch.full_like(p.labels, i) for i, p in enumerate(test)]) if multi else None,
        domain_names=tuple(p.domain for p in train) if multi else (),
    )


def partition_labels(labels: LabelInfo, dataset_name: str, partition_cfg: Mapping[str, Any], *, num_clients: int,
                     data_seed: int, cache_dir: str | Path | None = None,
                     accept: Callable[[Partition], None] | None = None) -> Partition:
    """The partition of ``labels`` that ``partition_cfg`` describes (cached); raises PartitionError on bad
    parameters, and whatever ``accept(partition)`` raises for a partition the caller cannot use (before it is
    cached)."""
    params = {k: v for k, v in partition_cfg.items() if k not in ("scheme", "val_fraction")}
    return cached_partition(
        cache_dir,
        dataset_name,
        str(partition_cfg["scheme"]),
        labels,
        num_clients,
        data_seed,
        val_fraction=float(partition_cfg.get("val_fraction", 0.0)),
        accept=accept,
        **params,
    )


def partition_sources(
    train: Sequence[ImageData],
    test: Sequence[ImageData],
    dataset_name: str,
    partition_cfg: Mapping[str, Any],
    *,
    num_clients: int,
    data_seed: int,
    cache_dir: str | Path | None = None,
    accept: Callable[[Partition], None] | None = None,
) -> tuple[LabelInfo, Partition]:
    """The labels of loaded sources and their partition (cached); raises PartitionError on bad parameters, and
    whatever ``accept(partition)`` raises for a partition the caller cannot use (before it is cached)."""
    labels = source_labels(train, test)
    return labels, partition_labels(labels, dataset_name, partition_cfg, num_clients=num_clients,
                                    data_seed=data_seed, cache_dir=cache_dir, accept=accept)


def gather_rows(parts: Sequence[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """``torch.cat(parts)[rows]`` for ascending ``rows``, without concatenating the parts first (the sources of a
    small federation are mostly unused: Fashion-MNIST's 70,000 images as float32 are 220 MB)."""
    pieces, start = [], 0
    for part in parts:
        stop = start + part.shape[0]
        lo, hi = torch.searchsorted(rows, torch.tensor([start, stop])).tolist()
        pieces.append(part[rows[lo:hi] - start])
        start = stop
    if not pieces:
        return torch.cat(parts)[rows]
    return torch.cat(pieces)


def build_federated_data(
    dataset_cfg: Mapping[str, Any],
    partition_cfg: Mapping[str, Any],
    *,
    num_clients: int,
    data_seed: int,
    data_root: str | None = None,
    cache_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    sources: tuple[list[ImageData], list[ImageData]] | None = None,
    accept: Callable[[Partition], None] | None = None,
) -> FederatedData:
    """Load the sources (unless given, as from :func:`load_sources`), partition them (cached; ``accept`` as in
    :func:`partition_sources`) and gather the used samples into a pool on ``device``."""
    train, test = sources if sources is not None else load_sources(dataset_cfg, data_root)
    labels, partition = partition_sources(train, test, str(dataset_cfg["name"]), partition_cfg,
                                          num_clients=num_clients, data_seed=data_seed, cache_dir=cache_dir,
                                          accept=accept)
    classes = train[0].classes
    pool_labels = torch.cat([labels.train_labels, labels.test_labels])
    # Keep only the samples some client uses, so device memory follows the federation, not the source.
    used = torch.unique(torch.cat([torch.cat([c.train, c.val, c.test]) for c in partition.clients]))
    remap = torch.full((pool_labels.numel(),), -1, dtype=torch.long)
    remap[used] = torch.arange(used.numel())
    splits = tuple(
        {name: remap[getattr(c, name)].to(device) for name in SPLITS} for c in partition.clients
    )
    return FederatedData(
        images=gather_rows([p.images for p in train + test], used).to(device),
        labels=pool_labels[used].to(device),
        splits=splits,
        classes=classes,
        train_transform=build_transform(dataset_cfg.get("train_transform")),
        test_transform=build_transform(dataset_cfg.get("test_transform")),
        partition=partition,
        pool_labels_full=pool_labels,
    )
