"""Tuning protocol (optional per table): grid search on the clients' validation split, then the final seeds.

A table spec may carry::

    tuning:
      seeds: [100]            # tuning seeds, kept apart from the table's final seeds
      val_fraction: 0.2       # share of each client's training data held out as its validation split
      grid:                   # row name -> {override: [values]}; the product of the lists is searched
        FedProx: {method.mu: [0.001, 0.01, 0.1]}

(``scales.mini.tuning`` replaces any of these keys at mini scale.) For every tuned row and every column,
each grid point runs on the tuning seeds with the validation split; its score is the mean over those
seeds of the best mean validation accuracy (the table protocol's stage and weighting). The best point
(ties: the first in grid order) is added to that row's overrides for that column, and the table then
runs on its final seeds. Choices and all scores are written next to the table as
``<table>.tuning.md`` and ``.json``.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import pandas as pd

from bench.cells import run_cells
from bench.core.records import RunDir, atomic_write_json, atomic_write_text
from bench.core.summary import pick
from bench.render import markdown_table
from bench.spec import expand, label, output_base, scale_block


def grid_points(grid: dict[str, list[Any]]) -> list[list[str]]:
    """The override lists of a grid, in order: ``{"a": [1, 2], "b": [3]}`` -> ``[["a=1", "b=3"], ["a=2", "b=3"]]``."""
    keys = list(grid)
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"tuning.grid value of {key!r} is {values!r}: it must be a non-empty list")
    return [[f"{k}={v}" for k, v in zip(keys, combo, strict=True)] for combo in itertools.product(*grid.values())]


def point_name(row: str, point: Sequence[str]) -> str:
    """The name of a grid point's row in the search, e.g. ``FedProx [method.mu=0.01]``."""
    return f"{row} [{', '.join(point)}]"


def settings(spec: dict[str, Any], scale: str) -> dict[str, Any]:
    tuning = {**spec["tuning"], **scale_block(spec, scale).get("tuning", {})}
    rows = {r["name"] for r in spec["rows"]}
    unknown = sorted(set(tuning.get("grid", {})) - rows)
    if unknown:
        raise ValueError(f"tuning.grid names rows {unknown} that the table does not have: rows are {sorted(rows)}")
    if not tuning.get("seeds") or not 0 < float(tuning.get("val_fraction", 0)) < 1:
        raise ValueError(f"tuning needs seeds (a non-empty list) and val_fraction in (0, 1); got {tuning}")
    return tuning


def tune(spec: dict[str, Any], scale: str, launcher: dict[str, Any], out_dir: str = "runs",
         extra: Sequence[str] = (), results_dir: str | os.PathLike = "results") -> dict[str, Any]:
    """Run the grid, write the choices, and return the spec with each tuned row's choice per column."""
    tuning = settings(spec, scale)
    proto = spec["protocol"]
    grid = {row["name"]: grid_points(tuning["grid"][row["name"]]) for row in spec["rows"]
            if row["name"] in tuning.get("grid", {}) and not row.get("unavailable")}
    if not grid:
        return spec
    search = copy.deepcopy(spec)
    search["rows"] = [{**row, "name": point_name(row["name"], point),
                       "tuned": {c["name"]: [*row.get("tuned", {}).get(c["name"], []), *point]
                                 for c in spec["columns"]}}
                      for row in spec["rows"] if row["name"] in grid for point in grid[row["name"]]]
    cells = expand(search, scale, tuning["seeds"], out_dir,
                   [*extra, f"partition.val_fraction={tuning['val_fraction']}", "eval.primary.selection=best_val"])
    print(f"tuning: {len(search['rows'])} grid points x {len(spec['columns'])} columns x {len(tuning['seeds'])} "
          "seeds", flush=True)
    scores: dict[tuple[str, str], list[float]] = {}
    for cell, path in run_cells(cells, launcher=launcher, spec=search, scale=scale).items():
        run = RunDir(path)
        value = math.nan
        if run.is_complete():
            summary = json.loads(run.summary.read_text())
            scored = summary["protocol"]  # the row's own stage and weighting (bench.spec.row_protocol)
            value = pick(summary["results"], scored["stage"], "best_val", scored["weighting"])["val_acc"]
        scores.setdefault((cell.row, cell.column), []).append(value)
    tuned = copy.deepcopy(spec)
    report: list[dict[str, Any]] = []
    for row in tuned["rows"]:
        for column in spec["columns"] if row["name"] in grid else []:
            means = []
            for point in grid[row["name"]]:
                vals = scores[(point_name(row["name"], point), column["name"])]
                means.append(sum(vals) / len(vals))  # NaN if a seed did not finish
                report.append({"row": row["name"], "column": column["name"], "point": point, "val_acc": means[-1]})
            finished = [i for i, m in enumerate(means) if not math.isnan(m)]
            if not finished:
                raise RuntimeError(f"tuning of {row['name']} | {column['name']}: no grid point finished")
            best = max(finished, key=lambda i: (means[i], -i))  # ties: the first grid point
            row.setdefault("tuned", {})[column["name"]] = grid[row["name"]][best]
            report.append({"row": row["name"], "column": column["name"], "chosen": grid[row["name"]][best],
                           "val_acc": means[best]})
    base = output_base(spec["paper"], f"{label(spec)}.tuning", scale, results_dir)
    atomic_write_json(base.with_name(base.name + ".json"), {"settings": tuning, "protocol": proto, "results": report})
    chosen = {(r["row"], r["column"]): r for r in report if "chosen" in r}

    frame = pd.DataFrame([{"row": r["row"], "column": r["column"], "grid point": ", ".join(r["point"]),
                           "mean best val acc": f"{r['val_acc']:.2f}",
                           "chosen": "✓" if chosen[(r["row"], r["column"])]["chosen"] == r["point"] else ""}
                          for r in report if "point" in r]).set_index("row")
    text = [f"# Tuning for {spec['paper']} {label(spec)} ({scale} scale)", "",
            f"Grid search on each client's validation split (val_fraction={tuning['val_fraction']}), seeds "
            f"{tuning['seeds']}; score = mean over seeds of the best mean validation accuracy "
            f"(stage={proto['stage']}, weighting={proto['weighting']}); ties go to the first grid point. "
            "The chosen values are used for the table's final seeds.", "", markdown_table(frame), ""]
    atomic_write_text(base.with_name(base.name + ".md"), "\n".join(text))
    return tuned
