"""Tuning protocol (optional per table): one search budget for every row, on the clients' validation split.

A table spec may carry::

    tuning:
      seeds: [100]            # tuning seeds, kept apart from the table's final seeds
      val_fraction: 0.2       # share of each client's training data held out as its validation split
      lr_factors: [1.0, 0.5, 2.0]   # each row's own client step (train.lr at that cell) times these
      lr_factors_alone: [1.0, 0.7, 1.4, 0.5, 2.0, 0.35]   # the same, for a row with no key hyperparameter
      grid:                   # every row: its one key hyperparameter's values, or null for none
        FedAvg: null
        FedProx: {method.mu: [0.01, 0.1]}   # the product of the lists is searched
        FedRep:               # or a list of points, for values that move together
          - {method.head_epochs: 4, method.body_epochs: 1}
          - {method.head_epochs: 1, method.body_epochs: 4}

(``scales.<scale>.tuning`` replaces any of these keys at that scale.) Every row, the paper's method included, gets
the same number of points: ``lr_factors`` x its key values, or ``lr_factors_alone`` for a row with none, and a
block that gives rows different counts, or leaves a row out, is refused (:func:`settings`). The step of a point
is relative (``train.lr=×0.5``), as any value written ``×f`` is: it is resolved per column against the row's own
value there (:func:`own_values`), so the grid sits around each row's published value. Without ``lr_factors``
only the key values are searched.

For every row and column, each point runs on the tuning seeds with the validation split; its score is the mean
over those seeds of the mean validation accuracy at the round the table's protocol reports (its last round for
``selection: final``, else the round of best mean validation accuracy; ``score_selection``), with the row's
stage and weighting; the scale blocks' per-row overrides of a row reach its points (``search_spec``), and a
point's own overrides come last. The best point (ties: the first in grid order) is added to that row's
overrides for that column, and the table then runs on its final seeds. Choices and all scores are written next
to the table as ``<table>.tuning.md`` and ``.json``; the table's caption states each row's budget and choice.
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


OwnValues = dict[tuple[str, str], dict[str, float]]  # (row, column) -> the cell's own value of each relative key
RELATIVE = "×"  # a relative value: "train.lr=×0.5" is half the row's own step at that cell


def point_name(row: str, point: Sequence[str]) -> str:
    """The name of a grid point's row in the search, e.g. ``FedProx [train.lr=×0.5, method.mu=0.01]``."""
    return f"{row} [{', '.join(point)}]"


def relative_keys(point: Sequence[str]) -> list[str]:
    """The config keys a point sets relative to the cell's own value (``key=×f``)."""
    return [key for key, _, value in (o.partition("=") for o in point) if value.startswith(RELATIVE)]


def resolve(point: Sequence[str], own: dict[str, float]) -> list[str]:
    """A point's overrides at a cell whose own values are ``own`` (key -> value): ``train.lr=×0.5`` becomes
    ``train.lr=<half the cell's step>``; absolute values stay as they are."""
    out = []
    for o in point:
        key, _, value = o.partition("=")
        if value.startswith(RELATIVE):
            try:
                factor = float(value[len(RELATIVE):])
            except ValueError:
                raise ValueError(f"tuning point {o!r}: a relative value is {RELATIVE}<number>") from None
            o = f"{key}={own.get(key, math.nan) * factor:.6g}"
        out.append(o)
    return out


def _factors(tuning: dict[str, Any], key: str) -> list[float] | None:
    factors = tuning.get(key)
    if factors is None:
        return None
    if (not isinstance(factors, list) or not factors
            or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors)):
        raise ValueError(f"tuning.{key} is {factors!r}: give a non-empty list of numbers > 0 (the row's own step "
                         "times each)")
    return [float(f) for f in factors]


def _row_factors(tuning: dict[str, Any], grid: Any) -> list[float] | None:
    """A row's step factors: ``lr_factors`` beside a key hyperparameter, ``lr_factors_alone`` without one."""
    return _factors(tuning, "lr_factors" if grid is not None else "lr_factors_alone")


def _points(tuning: dict[str, Any], grid: Any) -> list[list[str]]:
    """A row's points before resolution: its step factors (if any) times its key values."""
    keys = [[]] if grid is None else grid_points(grid)
    factors = _row_factors(tuning, grid)
    if factors is None:
        return keys
    return [[f"train.lr={RELATIVE}{f:g}", *k] for f in factors for k in keys]


def settings(spec: dict[str, Any], scale: str) -> dict[str, Any]:
    """The tuning block at ``scale``, checked: every row named (null: no key hyperparameter) and every row's
    budget (its number of points) the same."""
    tuning = {**spec["tuning"], **scale_block(spec, scale).get("tuning", {})}
    rows = [r["name"] for r in spec["rows"] if not r.get("unavailable")]
    grid = tuning.get("grid") or {}
    unknown = sorted(set(grid) - {r["name"] for r in spec["rows"]})
    if unknown:
        raise ValueError(f"tuning.grid names rows {unknown} that the table does not have: rows are {sorted(rows)}")
    if not tuning.get("seeds") or not 0 < float(tuning.get("val_fraction", 0)) < 1:
        raise ValueError(f"tuning needs seeds (a non-empty list) and val_fraction in (0, 1); got {tuning}")
    missing = [r for r in rows if r not in grid]
    if missing:
        raise ValueError(f"tuning.grid ({scale} scale) leaves out rows {missing}: every row gets the same search, "
                         "the paper's method included; give each its key hyperparameter's values, or null for none")
    for key in ("lr_factors", "lr_factors_alone"):
        _factors(tuning, key)
    budgets: dict[int, list[str]] = {}
    for row in rows:
        try:
            budgets.setdefault(len(_points(tuning, grid[row])), []).append(row)
        except ValueError as error:
            raise ValueError(f"tuning.grid of row {row!r} ({scale} scale): {error}") from None
    if len(budgets) > 1:
        counts = "; ".join(f"{n} point{'s' * (n != 1)}: {', '.join(names)}" for n, names in sorted(budgets.items()))
        raise ValueError(f"tuning ({scale} scale) gives rows different budgets ({counts}): every row gets the same "
                         "number of points (lr_factors x its key values; lr_factors_alone for a row with none)")
    return tuning


def search_spec(spec: dict[str, Any], grid: dict[str, list[list[str]]],
                own: OwnValues) -> dict[str, Any]:
    """The spec of the search: one row per grid point (``point_name``), with its row's overrides, the scale blocks'
    entries of its row (``rows``, ``rows_by_dataset``, ``rows_by_column``) and the point's overrides, resolved per
    column against the cells' own values (:func:`own_values`), last."""
    search = copy.deepcopy(spec)
    search["rows"] = [{**row, "name": point_name(row["name"], point),
                       "tuned": {c["name"]: [*row.get("tuned", {}).get(c["name"], []),
                                             *resolve(point, own.get((row["name"], c["name"]), {}))]
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
    """Each row's points at ``scale`` (relative values as ``key=×f``: :func:`resolve`), rows marked unavailable
    left out; empty without a ``tuning:`` block, or when no row has more than one point."""
    if not spec.get("tuning"):
        return {}
    tuning = settings(spec, scale)
    grids = {row["name"]: _points(tuning, tuning["grid"][row["name"]]) for row in spec["rows"]
             if not row.get("unavailable")}
    return grids if any(len(points) > 1 or points != [[]] for points in grids.values()) else {}


def own_values(spec: dict[str, Any], scale: str, extra: Sequence[str] = ()) -> OwnValues:
    """Each (row, column)'s own values (its composed cell's) of the keys its points set relatively (``key=×f``)."""
    from omegaconf import OmegaConf

    from bench.experiment.compose import compose_config, sharing_compositions

    keys = {row: sorted({k for point in points for k in relative_keys(point)})
            for row, points in row_grids(spec, scale).items()}
    out: OwnValues = {}
    with sharing_compositions():
        for c in expand(spec, scale, settings(spec, scale)["seeds"][:1], extra=extra):
            if keys.get(c.row):
                cfg = compose_config(list(c.overrides))
                out[(c.row, c.column)] = {k: float(OmegaConf.select(cfg, k, default=math.nan)) for k in keys[c.row]}
    return out


def search_cells(spec: dict[str, Any], scale: str, out_dir: str = "runs",
                 extra: Sequence[str] = ()) -> tuple[dict[str, Any], list[Cell], OwnValues]:
    """The search's spec, its cells (every grid point on the tuning seeds with the validation split), as
    :func:`tune` runs them, and the cells' own values of the relative keys; no cells without a grid."""
    tuning, grid = settings(spec, scale), row_grids(spec, scale)
    if not grid:
        return spec, [], {}
    own = own_values(spec, scale, extra)
    search = search_spec(spec, grid, own)
    return search, expand(search, scale, tuning["seeds"], out_dir,
                          [*extra, f"partition.val_fraction={tuning['val_fraction']}",
                           "eval.primary.selection=best_val"]), own


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


def choose(spec: dict[str, Any], scale: str, scores: dict[tuple[str, str], list[float]],
           own: OwnValues) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The spec with each row's best grid point per column (ties: the first point), resolved against the cells' own
    values (:func:`own_values`), and the report: every point's mean score and each choice. Writes nothing."""
    grid = row_grids(spec, scale)
    tuned = copy.deepcopy(spec)
    report: list[dict[str, Any]] = []
    for row in tuned["rows"]:
        for column in scale_columns(spec, scale) if row["name"] in grid else []:
            means = []
            values = own.get((row["name"], column["name"]), {})
            for point in grid[row["name"]]:
                vals = scores[(point_name(row["name"], point), column["name"])]
                means.append(sum(vals) / len(vals))  # NaN if a seed did not finish
                report.append({"row": row["name"], "column": column["name"], "point": point,
                               "overrides": resolve(point, values), "val_acc": means[-1]})
            finished = [i for i, m in enumerate(means) if not math.isnan(m)]
            if not finished:
                raise RuntimeError(f"tuning of {row['name']} | {column['name']}: no grid point finished")
            best = max(finished, key=lambda i: (means[i], -i))  # ties: the first grid point
            chosen = resolve(grid[row["name"]][best], values)
            row["searched"] = len(means)
            if chosen:
                row.setdefault("tuned", {})[column["name"]] = chosen
            report.append({"row": row["name"], "column": column["name"], "chosen": chosen,
                           "chosen_point": grid[row["name"]][best], "val_acc": means[best],
                           "points": len(means)})
    return tuned, report


def announce(spec: dict[str, Any], scale: str) -> None:
    tuning, columns = settings(spec, scale), scale_columns(spec, scale)
    grids = row_grids(spec, scale)
    points = sum(len(points) for points in grids.values())
    budget = len(next(iter(grids.values()))) if grids else 0
    print(f"tuning: {points} grid points ({len(grids)} rows x {budget} each) x {len(columns)} columns x "
          f"{len(tuning['seeds'])} seeds", flush=True)


def budget_lines(spec: dict[str, Any], scale: str) -> list[str]:
    """The caption's statement of the search: the budget every row gets and each row's key hyperparameter."""
    grids = row_grids(spec, scale) if spec.get("tuning") else {}
    if not grids:
        return []
    tuning = settings(spec, scale)
    steps = {key: ", ".join(f"{f:g}" for f in tuning[key]) for key in ("lr_factors", "lr_factors_alone")
             if tuning.get(key)}
    lines = [f"Search budget: {len(next(iter(grids.values())))} points for every row on the tuning seeds "
             f"{tuning['seeds']} (validation split {tuning['val_fraction']})"
             + (f"; the step times {{{steps['lr_factors']}}} of the row's own" if "lr_factors" in steps else "")
             + (f", times {{{steps['lr_factors_alone']}}} for a row with no key hyperparameter"
                if "lr_factors_alone" in steps else "")]
    for row, grid in tuning["grid"].items():
        if row in grids and grid is not None:
            lines.append(f"{row}: key " + "; ".join(", ".join(p) for p in grid_points(grid)))
    return lines


def edge_note(report: Sequence[dict[str, Any]], tuning: dict[str, Any]) -> list[str]:
    """The search report's line on choices at the edge of the step grid (none when no choice is)."""
    edges, chosen = edge_choices(report, tuning), sum("chosen" in r for r in report)
    return [f"{len(edges)} of {chosen} choices take the smallest or largest step of the grid, so their best step may "
            f"lie outside it: {'; '.join(edges)}."] if edges else []


def edge_choices(report: Sequence[dict[str, Any]], tuning: dict[str, Any]) -> list[str]:
    """The choices whose step is the smallest or largest of its row's step factors (``row | column: train.lr=×f``):
    the best point may lie outside the grid."""
    out = []
    for entry in report:
        factor = next((o.split("=", 1)[1][len(RELATIVE):] for o in entry.get("chosen_point", ())
                       if o.startswith(f"train.lr={RELATIVE}")), None)
        if factor is None:
            continue
        factors = _row_factors(tuning, tuning["grid"].get(entry["row"])) or []
        if float(factor) in (min(factors), max(factors)):
            out.append(f"{entry['row']} | {entry['column']}: train.lr={RELATIVE}{factor}")
    return out


def tune(spec: dict[str, Any], scale: str, launcher: dict[str, Any], out_dir: str = "runs",
         extra: Sequence[str] = (), results_dir: str | os.PathLike = "results") -> dict[str, Any]:
    """Run the grid, write the choices, and return the spec with each row's choice per column."""
    tuning = settings(spec, scale)
    proto = spec["protocol"]
    if not row_grids(spec, scale):
        return spec
    search, cells, own = search_cells(spec, scale, out_dir, extra)
    announce(spec, scale)
    tuned, report = choose(spec, scale, search_scores(run_cells(cells, launcher=launcher, spec=search, scale=scale),
                                                      proto), own)
    base = output_base(spec["paper"], f"{label(spec)}.tuning", scale, results_dir)
    atomic_write_json(base.with_name(base.name + ".json"), {"settings": tuning, "protocol": proto, "results": report})
    chosen = {(r["row"], r["column"]): r for r in report if "chosen" in r}

    frame = pd.DataFrame([{"row": r["row"], "column": r["column"], "grid point": ", ".join(r["point"]),
                           "overrides": ", ".join(r["overrides"]), "mean val acc": f"{r['val_acc']:.2f}",
                           "chosen": "✓" if chosen[(r["row"], r["column"])]["chosen_point"] == r["point"] else ""}
                          for r in report if "point" in r]).set_index("row")
    searched = Result(f"Tuning for {spec['paper']} {label(spec)} ({scale} scale)", [
        f"Grid search on each client's validation split (val_fraction={tuning['val_fraction']}), seeds "
        f"{tuning['seeds']}; score = mean over seeds of the mean validation accuracy at the "
        f"{'final round' if score_selection(proto) == 'final' else 'round of best mean validation accuracy'} "
        f"(each row's own stage and weighting); ties go to the first grid point. `key=×f` is f times the row's "
        "own value in that column (the overrides column: the values run). The chosen values are used for the "
        "table's final seeds.",
        *budget_lines(spec, scale), *edge_note(report, tuning)], [frame_grid(frame)])
    atomic_write_text(base.with_name(base.name + ".md"), to_markdown(searched))
    return tuned


def dry_run_search(spec: dict[str, Any], scale: str, launcher: dict[str, Any], out_dir: str = "runs",
                   extra: Sequence[str] = (), **dry: Any) -> dict[str, Any]:
    """``--dry-run`` of the search: its cells counted, built and priced as the table's are (``dry``: ``run_cells``'
    ``precheck`` and ``cost``), nothing run or written. Returns the spec with the points a finished search picks,
    so that the table's dry run counts the final cells the table would run; while any search run is missing, the
    spec unchanged (the rows' cells at their own values: the points are not known yet)."""
    if not row_grids(spec, scale):
        return spec
    search, cells, own = search_cells(spec, scale, out_dir, extra)
    announce(spec, scale)
    dirs = run_cells(cells, dry_run=True, launcher=launcher, spec=search, scale=scale, **dry)
    if not all(RunDir(path).is_complete() for path in dirs.values()):
        print("the search has not finished: the rows' final cells below are counted at their own values",
              flush=True)
        return spec
    tuned, report = choose(spec, scale, search_scores(dirs, spec["protocol"]), own)
    picks = "; ".join(f"{r['row']} | {r['column']}: {', '.join(r['chosen'])}" for r in report if "chosen" in r)
    print(f"the search has finished; the final cells below at the points it picks ({picks})", flush=True)
    return tuned


def searched_points(spec: dict[str, Any]) -> dict[str, int]:
    """How many points each available row was searched over (``searched``, set by :func:`choose` and
    :func:`with_tuned`); 1 for a row not searched."""
    return {row["name"]: row.get("searched") or 1 for row in spec["rows"] if not row.get("unavailable")}


def with_tuned(spec: dict[str, Any], scale: str, results_dir: str | os.PathLike = "results") -> dict[str, Any]:
    """``spec`` with the choices its last search wrote (``<table>.tuning.json``) as each tuned row's per-column
    overrides, as :func:`tune` returns it, and the number of points each row was searched over (``searched``),
    without running anything: for readers of a table's runs (``bench.experiment.collect``, plots, the claims' tuning
    budget). A spec without a ``tuning:`` block, or not searched yet at ``scale``, comes back unchanged."""
    path = output_base(spec["paper"], f"{label(spec)}.tuning.json", scale, results_dir)
    if not spec.get("tuning") or not path.exists():
        return spec
    tuned = copy.deepcopy(spec)
    rows = {row["name"]: row for row in tuned["rows"]}
    points: dict[str, set[str]] = {}
    for entry in json.loads(path.read_text())["results"]:
        if entry["row"] not in rows:
            continue
        if "chosen" in entry:
            rows[entry["row"]].setdefault("tuned", {})[entry["column"]] = list(entry["chosen"])
        if "point" in entry:
            points.setdefault(entry["row"], set()).add(json.dumps(entry["point"]))
    for name, row in rows.items():
        row["searched"] = len(points.get(name, ())) or None
    return tuned
