"""Tuning protocol (optional per table): grid search on the clients' validation split, then the final seeds.

A table spec may carry::

    tuning:
      seeds: [100]            # tuning seeds, kept apart from the table's final seeds
      val_fraction: 0.2       # share of each client's training data held out as its validation split
      grid:                   # row name -> {override: [values]}; the product of the lists is searched
        FedProx: {method.mu: [0.001, 0.01, 0.1]}
        FedRep:               # or a list of points, for values that move together
          - {method.head_epochs: 4, method.body_epochs: 1}
          - {method.head_epochs: 1, method.body_epochs: 4}

(``scales.mini.tuning`` replaces any of these keys at mini scale.) For every tuned row and every column,
each grid point runs on the tuning seeds with the validation split; its score is the mean over those
seeds of the mean validation accuracy at the round the table's protocol reports (its last round for
``selection: final``, else the round of best mean validation accuracy; ``score_selection``), with the
protocol's stage and weighting; the scale blocks' per-row overrides of a tuned row reach its grid points
(``search_spec``), and a point's own overrides come last. The best point
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

from bench.core.records import RunDir
from bench.core.summary import pick
from bench.experiment.cells import run_cells
from bench.experiment.result import Result, frame_grid, to_markdown
from bench.experiment.spec import Cell, expand, label, output_base, scale_block, scale_columns
from common.verified_io import atomic_write_json, atomic_write_text


def grid_points(grid: dict[str, list[Any]] | list[dict[str, Any]]) -> list[list[str]]:
    """The override lists of a row's grid, in order: the product of a mapping's lists,
    ``{"a": [1, 2], "b": [3]}`` -> ``[["a=1", "b=3"], ["a=2", "b=3"]]``, or a list of points taken as they are,
    ``[{"a": 4, "b": 1}, {"a": 1, "b": 4}]`` -> ``[["a=4", "b=1"], ["a=1", "b=4"]]`` (values that move together)."""
    if isinstance(grid, list):
        if not grid or not all(isinstance(point, dict) and point for point in grid):
            raise ValueError(f"tuning.grid points {grid!r}: a list of points must be non-empty, each a non-empty "
                             "mapping {override: value}")
        return [[f"{k}={v}" for k, v in point.items()] for point in grid]
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"tuning.grid entry {grid!r}: give {{override: [values]}} (their product is searched) or a "
                         "list of points [{override: value}, ...]")
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
    for row, grid in tuning.get("grid", {}).items():
        try:
            grid_points(grid)
        except ValueError as error:
            raise ValueError(f"tuning.grid of row {row!r} ({scale} scale): {error}") from None
    return tuning


def search_spec(spec: dict[str, Any], grid: dict[str, list[list[str]]]) -> dict[str, Any]:
    """The spec of the search: one row per grid point (``point_name``), with its row's overrides, the scale blocks'
    entries of its row (``rows``, ``rows_by_dataset``, ``rows_by_column``) and the point's overrides last."""
    search = copy.deepcopy(spec)
    search["rows"] = [{**row, "name": point_name(row["name"], point),
                       "tuned": {c["name"]: [*row.get("tuned", {}).get(c["name"], []), *point]
                                 for c in spec["columns"]}}
                      for row in spec["rows"] if row["name"] in grid for point in grid[row["name"]]]
    for block in search.get("scales", {}).values():
        for key in ("rows", "rows_by_dataset", "rows_by_column"):
            entries = block.get(key, {})
            for row, points in grid.items():
                if row in entries:
                    entries.update({point_name(row, point): entries[row] for point in points})
    return search


def score_selection(protocol: dict[str, Any]) -> str:
    """The round a grid point is scored at: the final round for a table that reports the final round (its runs
    must evaluate the last round, as every run does), else the round of best mean validation accuracy."""
    return "final" if protocol["selection"] == "final" else "best_val"


def row_grids(spec: dict[str, Any], scale: str) -> dict[str, list[list[str]]]:
    """Each tuned row's grid points at ``scale`` (:func:`grid_points`), rows marked unavailable left out; empty
    without a ``tuning:`` block."""
    if not spec.get("tuning"):
        return {}
    tuning = settings(spec, scale)
    return {row["name"]: grid_points(tuning["grid"][row["name"]]) for row in spec["rows"]
            if row["name"] in tuning.get("grid", {}) and not row.get("unavailable")}


def search_cells(spec: dict[str, Any], scale: str, out_dir: str = "runs",
                 extra: Sequence[str] = ()) -> tuple[dict[str, Any], list[Cell]]:
    """The search's spec and its cells (every grid point on the tuning seeds with the validation split), as
    :func:`tune` runs them; no cells without a grid."""
    tuning, grid = settings(spec, scale), row_grids(spec, scale)
    if not grid:
        return spec, []
    search = search_spec(spec, grid)
    return search, expand(search, scale, tuning["seeds"], out_dir,
                          [*extra, f"partition.val_fraction={tuning['val_fraction']}",
                           "eval.primary.selection=best_val"])


def search_scores(dirs: dict[Cell, Any], proto: dict[str, Any]) -> dict[tuple[str, str], list[float]]:
    """Each (grid point's row, column): the search runs' validation scores, one per tuning seed (NaN for a run
    that did not finish)."""
    scores: dict[tuple[str, str], list[float]] = {}
    for cell, path in dirs.items():
        run = RunDir(path)
        value = math.nan
        if run.is_complete():
            summary = json.loads(run.summary.read_text())
            scored = summary["protocol"]  # the row's own stage and weighting (bench.experiment.spec.row_protocol)
            value = pick(summary["results"], scored["stage"], score_selection(proto), scored["weighting"])["val_acc"]
        scores.setdefault((cell.row, cell.column), []).append(value)
    return scores


def choose(spec: dict[str, Any], scale: str,
           scores: dict[tuple[str, str], list[float]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The spec with each tuned row's best grid point per column (ties: the first point), and the report: every
    point's mean score and each choice. Writes nothing."""
    grid = row_grids(spec, scale)
    tuned = copy.deepcopy(spec)
    report: list[dict[str, Any]] = []
    for row in tuned["rows"]:
        for column in scale_columns(spec, scale) if row["name"] in grid else []:
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
    return tuned, report


def announce(spec: dict[str, Any], scale: str) -> None:
    tuning, columns = settings(spec, scale), scale_columns(spec, scale)
    points = sum(len(points) for points in row_grids(spec, scale).values())
    print(f"tuning: {points} grid points x {len(columns)} columns x {len(tuning['seeds'])} seeds", flush=True)


def tune(spec: dict[str, Any], scale: str, launcher: dict[str, Any], out_dir: str = "runs",
         extra: Sequence[str] = (), results_dir: str | os.PathLike = "results") -> dict[str, Any]:
    """Run the grid, write the choices, and return the spec with each tuned row's choice per column."""
    tuning = settings(spec, scale)
    proto = spec["protocol"]
    if not row_grids(spec, scale):
        return spec
    search, cells = search_cells(spec, scale, out_dir, extra)
    announce(spec, scale)
    tuned, report = choose(spec, scale, search_scores(run_cells(cells, launcher=launcher, spec=search, scale=scale),
                                                      proto))
    base = output_base(spec["paper"], f"{label(spec)}.tuning", scale, results_dir)
    atomic_write_json(base.with_name(base.name + ".json"), {"settings": tuning, "protocol": proto, "results": report})
    chosen = {(r["row"], r["column"]): r for r in report if "chosen" in r}

    frame = pd.DataFrame([{"row": r["row"], "column": r["column"], "grid point": ", ".join(r["point"]),
                           "mean val acc": f"{r['val_acc']:.2f}",
                           "chosen": "✓" if chosen[(r["row"], r["column"])]["chosen"] == r["point"] else ""}
                          for r in report if "point" in r]).set_index("row")
    searched = Result(f"Tuning for {spec['paper']} {label(spec)} ({scale} scale)", [
        f"Grid search on each client's validation split (val_fraction={tuning['val_fraction']}), seeds "
        f"{tuning['seeds']}; score = mean over seeds of the mean validation accuracy at the "
        f"{'final round' if score_selection(proto) == 'final' else 'round of best mean validation accuracy'} "
        f"(stage={proto['stage']}, weighting={proto['weighting']}); ties go to the first grid point. "
        "The chosen values are used for the table's final seeds."], [frame_grid(frame)])
    atomic_write_text(base.with_name(base.name + ".md"), to_markdown(searched))
    return tuned


def dry_run_search(spec: dict[str, Any], scale: str, launcher: dict[str, Any], out_dir: str = "runs",
                   extra: Sequence[str] = (), **dry: Any) -> dict[str, Any]:
    """``--dry-run`` of the search: its cells counted, built and priced as the table's are (``dry``: ``run_cells``'
    ``precheck`` and ``cost``), nothing run or written. Returns the spec with the points a finished search picks,
    so that the table's dry run counts the final cells the table would run; while any search run is missing, the
    spec unchanged (the tuned rows' cells at their own values: the points are not known yet)."""
    if not row_grids(spec, scale):
        return spec
    search, cells = search_cells(spec, scale, out_dir, extra)
    announce(spec, scale)
    dirs = run_cells(cells, dry_run=True, launcher=launcher, spec=search, scale=scale, **dry)
    if not all(RunDir(path).is_complete() for path in dirs.values()):
        print("the search has not finished: the tuned rows' final cells below are counted at their own values",
              flush=True)
        return spec
    tuned, report = choose(spec, scale, search_scores(dirs, spec["protocol"]))
    picks = "; ".join(f"{r['row']} | {r['column']}: {', '.join(r['chosen'])}" for r in report if "chosen" in r)
    print(f"the search has finished; the final cells below at the points it picks ({picks})", flush=True)
    return tuned


def with_tuned(spec: dict[str, Any], scale: str, results_dir: str | os.PathLike = "results") -> dict[str, Any]:
    """``spec`` with the choices its last search wrote (``<table>.tuning.json``) as each tuned row's per-column
    overrides, as :func:`tune` returns it, without running anything: for readers of a table's runs
    (``bench.experiment.collect``, plots). A spec without a ``tuning:`` block, or not searched yet at ``scale``, comes
    back unchanged."""
    path = output_base(spec["paper"], f"{label(spec)}.tuning.json", scale, results_dir)
    if not spec.get("tuning") or not path.exists():
        return spec
    tuned = copy.deepcopy(spec)
    rows = {row["name"]: row for row in tuned["rows"]}
    for entry in json.loads(path.read_text())["results"]:
        if "chosen" in entry and entry["row"] in rows:
            rows[entry["row"]].setdefault("tuned", {})[entry["column"]] = list(entry["chosen"])
    return tuned
