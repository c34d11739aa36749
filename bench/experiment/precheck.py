"""Pre-launch check and dry build: the data and partitions of a table's cells, before anything is launched.

:func:`check_inputs` (before a launch) loads every data set of the cells to run once and builds each distinct
partition (cached for the jobs), so that missing data or an impossible partition (one leaving a client without
data its method needs, ``bench.builder.partition_check``) fails before anything starts.

:func:`dry_build` (``python -m bench.experiment.table <spec> --dry-run``) builds every cell's partition for every seed
without needing the data: from the real labels where the data set loads here, else from the data set's official label
counts (:mod:`datasets.label_counts`), which is all a partitioner looks at. It writes nothing: no partition goes
to the cache (one from label counts is not the real data's partition, and a dry run should leave no files), so
each distinct partition is drawn once per dry run. Cells whose data is absent and has no published counts
(FedBN's Digit-5 and Office-Caltech-10 files) are listed as unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.builder import method_class, partition_check
from bench.core.data import (
    active_sharing,
    load_sources,
    partition_labels,
    partition_sources,
    sharing_sources,
    source_labels,
)
from bench.experiment.errors import ConfigError
from bench.experiment.spec import Cell
from datasets.label_counts import label_info_from_counts, missing_counts
from datasets.partition import LabelInfo
from datasets.sources import DataSourceError

#: where a dry build's labels came from
FROM_DATA, FROM_COUNTS = "data", "label counts"


class CellsError(ConfigError):
    """Cells that cannot run (or be built); the message names each (row | column | seed) and why."""


def _partition_key(cfg: dict[str, Any]) -> str:
    """What decides whether a cell's partition can be built and used: its data, partition and federation, and which
    splits its method accepts empty."""
    return json.dumps([cfg["dataset"], cfg.get("data_root"), cfg["partition"], cfg["num_clients"], cfg["data_seed"],
                       sorted(method_class(cfg)[0].empty_splits)], sort_keys=True, default=str)


def _data_problem(cfg: dict[str, Any]) -> str | None:
    """Why ``cfg``'s data set or partition cannot be built, or None (sources come from the caller's
    :func:`sharing_sources` block, so each is read once)."""
    try:
        sources = load_sources(cfg["dataset"], cfg.get("data_root"))
    except (OSError, ValueError) as err:  # DataSourceError and mismatched domains
        return str(err)
    try:
        partition_sources(*sources, str(cfg["dataset"]["name"]), cfg["partition"],
                          num_clients=cfg["num_clients"], data_seed=int(cfg["data_seed"]),
                          cache_dir=cfg.get("cache_dir"), accept=partition_check(cfg))
    except ValueError as err:  # PartitionError
        return str(err)
    return None


def _verdicts(cells: Sequence[Cell], configs: dict[Cell, dict[str, Any]],
              judge: Callable[[dict[str, Any]], str | None]) -> list[tuple[Cell, str]]:
    """(cell, why) for every cell that ``judge``, called once per distinct partition, faults."""
    verdicts: dict[str, str | None] = {}
    faults = []
    for cell in cells:
        key = _partition_key(configs[cell])
        if key not in verdicts:
            verdicts[key] = judge(configs[cell])
        if verdicts[key]:
            faults.append((cell, str(verdicts[key])))
    return faults


def _named(cell: Cell, why: str) -> str:
    return f"{cell.row} | {cell.column} | seed {cell.seed}: {why}"


def _listing(problems: Sequence[str], limit: int | None = 10) -> str:
    shown = problems if limit is None else problems[:limit]
    more = len(problems) - len(shown)
    return "\n".join(f"- {p}" for p in shown) + (f"\n- ... and {more} more" if more else "")


def check_inputs(cells: Sequence[Cell], configs: dict[Cell, dict[str, Any]]) -> None:
    """Load every data set of ``cells`` once and build each distinct partition (cached for the jobs); raise
    one error naming every cell whose data is missing or whose partition is impossible."""
    with sharing_sources():
        problems = [_named(cell, why) for cell, why in _verdicts(cells, configs, _data_problem)]
    if problems:
        raise CellsError(f"{len(problems)} cells cannot run (nothing was launched):\n{_listing(problems)}")


@dataclass
class DryBuild:
    """What :func:`dry_build` built: distinct partitions by where their labels came from, the cells that cannot be
    built and the cells left unchecked (data absent, no label counts), each as ``row | column | seed s: why``."""

    cells: int = 0
    built: dict[str, int] = field(default_factory=lambda: {FROM_DATA: 0, FROM_COUNTS: 0})
    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    #: per distinct partition (:func:`_partition_key`): each client's sample count per split (the cost estimate's)
    sizes: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def cell_sizes(self, cfg: dict[str, Any]) -> dict[str, list[int]] | None:
        """The client sizes of the partition of the cell config ``cfg`` (None where it was not built)."""
        return self.sizes.get(_partition_key(cfg))

    def summary(self) -> str:
        line = (f"dry build: {self.cells} cells, {sum(self.built.values())} distinct partitions built "
                f"({self.built[FROM_DATA]} from the data, {self.built[FROM_COUNTS]} from official label counts), "
                f"{len(self.problems)} cells cannot be built, {len(self.unchecked)} unchecked")
        if self.unchecked:
            line += f"\nunchecked (data absent here and no label counts):\n{_listing(self.unchecked, 5)}"
        return line


def dry_build(cells: Sequence[Cell], configs: dict[Cell, dict[str, Any]]) -> DryBuild:
    """Build the partition of every cell (every seed) from the real labels or the official label counts, writing
    nothing (see the module doc)."""
    report = DryBuild(cells=len(cells))
    labels: dict[str, tuple[LabelInfo | None, str]] = {}  # dataset key -> (labels, origin or why unchecked)
    unchecked: set[str] = set()

    def label_info(cfg: dict[str, Any]) -> tuple[LabelInfo | None, str]:
        key = json.dumps([cfg["dataset"], cfg.get("data_root")], sort_keys=True, default=str)
        if key not in labels:
            try:  # the labels of loaded data, kept by an enclosing sharing_sources block for later dry builds
                labels[key] = active_sharing().keep(  # type: ignore[union-attr]
                    f"labels:{key}", lambda: source_labels(*load_sources(cfg["dataset"], cfg.get("data_root")))
                ), FROM_DATA
            except DataSourceError as err:
                names = cfg["dataset"].get("domains") or [cfg["dataset"]["source"]]
                lacking = missing_counts(names)
                absent = str(err).splitlines()[0].removesuffix(" Looked in:")
                labels[key] = ((None, f"{absent.rstrip('.')}, and {lacking} have no label counts "
                                         "(datasets/label_counts.py)")
                               if lacking else (label_info_from_counts(names), FROM_COUNTS))
        return labels[key]

    def judge(cfg: dict[str, Any]) -> str | None:
        try:
            info, origin = label_info(cfg)
        except (OSError, ValueError) as err:  # a damaged file, mismatched domains
            return str(err)
        if info is None:
            unchecked.add(_partition_key(cfg))
            return origin
        try:
            partition = partition_labels(info, str(cfg["dataset"]["name"]), cfg["partition"],
                                         num_clients=cfg["num_clients"], data_seed=int(cfg["data_seed"]),
                                         cache_dir=None, accept=partition_check(cfg))
        except (OSError, ValueError) as err:  # PartitionError, a partition file that is missing or does not fit
            return f"{err} (labels from {origin})"
        report.built[origin] += 1
        report.sizes[_partition_key(cfg)] = {s: [len(getattr(c, s)) for c in partition.clients]
                                             for s in ("train", "val", "test")}
        return None

    with sharing_sources():
        faults = _verdicts(cells, configs, judge)
    for cell, why in faults:
        skipped = _partition_key(configs[cell]) in unchecked
        (report.unchecked if skipped else report.problems).append(_named(cell, why))
    return report
