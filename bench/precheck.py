"""Pre-launch check: load every data set of a table once and build each distinct partition (cached for
the jobs), so that missing data or an impossible partition (one leaving a client without data its method needs,
``bench.core.builder.partition_check``) fails before anything is launched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bench.core.builder import method_class, partition_check
from bench.core.data import load_sources, partition_sources, sharing_sources
from bench.spec import Cell


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


def check_inputs(cells: Sequence[Cell], configs: dict[Cell, dict[str, Any]]) -> None:
    """Load every data set of ``cells`` once and build each distinct partition (cached for the jobs); raise
    one error naming every cell whose data is missing or whose partition is impossible."""
    verdicts: dict[str, str | None] = {}
    problems = []
    with sharing_sources():
        for cell in cells:
            cfg = configs[cell]
            which = json.dumps([cfg["dataset"], cfg.get("data_root"), cfg["partition"], cfg["num_clients"],
                                cfg["data_seed"], sorted(method_class(cfg)[0].empty_splits)], sort_keys=True,
                               default=str)
            if which not in verdicts:
                verdicts[which] = _data_problem(cfg)
            if verdicts[which]:
                problems.append(f"{cell.row} | {cell.column} | seed {cell.seed}: {verdicts[which]}")
    if problems:
        shown = "\n".join(f"- {p}" for p in problems[:10]) + (f"\n- ... and {len(problems) - 10} more"
                                                            if len(problems) > 10 else "")
        raise ValueError(f"{len(problems)} cells cannot run (nothing was launched):\n{shown}")
