"""Table specs: loading, expansion into (row, column, seed) cells, names, and the published numbers.

A table spec (YAML) is documented in :mod:`bench.table`. This module turns one into cells, each with
its full Hydra override list, and reads the paper's numbers from ``conf/paper/paper_tables.csv``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from bench.compose import compose_config, to_container

PAPER_TABLES = Path(__file__).resolve().parent.parent / "conf" / "paper" / "paper_tables.csv"
SCALES = ("mini", "medium", "paper")
#: where each scale's tables go under results/<paper>/ ("" = the paper's folder itself)
SCALE_FOLDERS = {"mini": "", "medium": "medium", "paper": "paper-scale"}


#: what a ``scales.paper`` block may set: overrides on the paper's own setup, never stand-in data or models
PAPER_BLOCK_KEYS = ("base", "by_dataset", "column_overrides", "rows", "rows_by_dataset", "rows_by_column")


def scale_block(spec: dict[str, Any], scale: str) -> dict[str, Any]:
    """The spec's ``scales.<scale>`` block (mini: embedded stand-ins; medium: real data, fewer rounds; paper,
    optional: overrides that apply at the paper scale only, :data:`PAPER_BLOCK_KEYS`)."""
    return spec.get("scales", {}).get(scale, {})


def scale_columns(spec: dict[str, Any], scale: str) -> list[dict[str, Any]]:
    """The spec's columns run at ``scale``: all, or the block's ``columns: [names]`` (e.g. the one column whose
    data installs here, at medium scale)."""
    names = scale_block(spec, scale).get("columns")
    if names is None:
        return list(spec["columns"])
    known = [c["name"] for c in spec["columns"]]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"table {spec['paper']}/{spec['table']}: scales.{scale}.columns names no column {unknown}; "
                         f"columns: {known}")
    return [c for c in spec["columns"] if c["name"] in names]


#: what a protocol names: the model evaluated (stage), the round reported (selection), the mean over clients
PROTOCOL_KEYS = ("stage", "selection", "weighting")


def row_protocol(spec: dict[str, Any], row: str) -> dict[str, str]:
    """The evaluation protocol of a row: the table's ``protocol``, with the row's own ``protocol:`` keys over it
    (e.g. FedSelect's FedAvg row scores the global model, ``protocol: {stage: post}``, as its paper does)."""
    found = next((r for r in spec["rows"] if r["name"] == row), None)
    if found is None:
        raise ValueError(f"table {spec['paper']}/{spec['table']} has no row {row!r}")
    return {**spec["protocol"], **(found.get("protocol") or {})}


def differing_protocols(spec: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Rows whose protocol differs from the table's, with their protocol (in row order)."""
    protocols = {row["name"]: row_protocol(spec, row["name"]) for row in spec["rows"]}
    return {name: proto for name, proto in protocols.items() if proto != spec["protocol"]}


@dataclass(frozen=True)
class Cell:
    row: str
    column: str
    seed: int
    overrides: tuple[str, ...]


def load_spec(path: str | os.PathLike) -> dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"table spec {path} does not exist: give a file conf/paper/<paper>/<table>.yaml "
                                "(make help lists the tables)")
    raw = OmegaConf.load(path)
    if "include" in raw:  # shared files of a paper's folder (base overrides, scales, rows), merged in order
        included = raw.pop("include")  # one file or a list; later files and the spec itself override earlier
        names = [included] if isinstance(included, str) else list(included)
        for name in names:
            if not (Path(path).parent / name).is_file():
                raise ValueError(f"table spec {path}: include names {name!r}, which is not a file in "
                                 f"{Path(path).parent}; list files of the spec's own folder")
        raw = OmegaConf.merge(*(OmegaConf.load(Path(path).parent / name) for name in names), raw)
    spec = OmegaConf.to_container(raw, resolve=True)
    for key in ("paper", "table", "columns", "rows", "seeds", "protocol"):
        if key not in spec:
            raise ValueError(f"table spec {path} lacks the key {key!r}")
    shown = spec.get("metrics", [])
    if not isinstance(shown, list) or not all(isinstance(n, str) for n in shown):
        raise ValueError(f"table spec {path}: metrics is {shown!r}: give a list of names the methods record "
                         "(e.g. [personal_fraction])")
    notes = spec.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ValueError(f"table spec {path}: notes is {notes!r}: give a list of sentences (caption lines)")
    rows = [row.get("name") for row in spec["rows"]]
    for where, proto in [("protocol", spec["protocol"]),
                         *((f"row {row.get('name')!r}: protocol", row["protocol"]) for row in spec["rows"]
                           if row.get("protocol") is not None)]:
        check_protocol(proto, f"table spec {path}, {where}", full=where == "protocol")
    if spec.get("compare") is not None and spec["compare"] not in rows:
        raise ValueError(f"table spec {path}: compare={spec['compare']!r} is not a row; use one of {rows}")
    for scale in SCALES:
        output_columns(spec, scale)  # per_client entries well-formed, column names unique
    odd = sorted(set(scale_block(spec, "paper")) - set(PAPER_BLOCK_KEYS))
    if odd:
        raise ValueError(f"table spec {path}: scales.paper sets {odd}; the paper scale runs the paper's data, model "
                         f"and seeds, so its block may set only {list(PAPER_BLOCK_KEYS)}")
    names = {column["name"] for column in spec["columns"]}
    for row in spec["rows"]:
        unknown_columns = set(row.get("by_column", {})) - names
        if unknown_columns:
            raise ValueError(f"table spec {path}: row {row.get('name')!r} has by_column entries for no column "
                             f"{sorted(unknown_columns)}; columns: {sorted(names)}")
    for scale in SCALES:
        for key in ("column_overrides", "per_client"):
            unknown = set(scale_block(spec, scale).get(key, {})) - names
            if unknown:
                raise ValueError(f"table spec {path}: scales.{scale}.{key} names no column {sorted(unknown)}; "
                                 f"columns: {sorted(names)}")
        for row_name, per_column in scale_block(spec, scale).get("rows_by_column", {}).items():
            if row_name not in rows:
                raise ValueError(f"table spec {path}: scales.{scale}.rows_by_column names no row {row_name!r}; "
                                 f"rows: {rows}")
            unknown = set(per_column) - names
            if unknown:
                raise ValueError(f"table spec {path}: scales.{scale}.rows_by_column.{row_name} names no column "
                                 f"{sorted(unknown)}; columns: {sorted(names)}")
    return spec  # type: ignore[return-value]


def check_protocol(proto: Any, where: str, full: bool) -> None:
    """A protocol block names only stage / selection / weighting with allowed values (``full``: all three)."""
    from bench.core.summary import SELECTIONS, STAGES, WEIGHTINGS

    allowed = dict(zip(PROTOCOL_KEYS, (STAGES, SELECTIONS, WEIGHTINGS), strict=True))
    if not isinstance(proto, dict):
        raise ValueError(f"{where} is {proto!r}: give a mapping, e.g. {{stage: post}}")
    unknown = sorted(set(proto) - set(allowed))
    missing = sorted(set(allowed) - set(proto)) if full else []
    if unknown or missing:
        raise ValueError(f"{where} has key(s) {unknown or missing} that a protocol "
                         f"{'does not have' if unknown else 'needs'}; a protocol names {list(PROTOCOL_KEYS)}")
    for key, value in proto.items():
        if value not in allowed[key]:
            raise ValueError(f"{where}: {key}={value!r} is invalid: use one of {list(allowed[key])}")


def label(spec: dict[str, Any]) -> str:
    """``table2`` for a numbered table ("2"), the name itself otherwise (``fig3``, ``demo``)."""
    name = str(spec["table"])
    return f"table{name}" if name[:1].isdigit() else name


def experiment(spec: dict[str, Any]) -> str:
    """The runs' ``exp`` (before the scale): the spec's ``exp`` if given, e.g. ``fedselect/table1`` for a figure
    whose rows include cells of Table 1 (the same config then means the same run), else ``<paper>/<label>``."""
    return str(spec.get("exp") or f"{spec['paper']}/{label(spec)}")


def expand(spec: dict[str, Any], scale: str, seeds: Sequence[int] | None = None,
           out_dir: str = "runs", extra: Sequence[str] = ()) -> list[Cell]:
    """Every (row, column, seed) cell with its full Hydra override list."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is invalid: use one of {list(SCALES)}")
    mini = scale_block(spec, scale)  # the mini or medium block (stand-in data, fewer rounds ...)
    if scale != "paper" and not mini:
        raise ValueError(f"table {spec['paper']}/{spec['table']} has no {scale} scale: add scales.{scale} to its spec "
                         "or use another --scale")
    seeds = list(seeds if seeds is not None else mini.get("seeds", spec["seeds"]))
    common = [*spec.get("base", []), *mini.get("base", [])]
    placed = [f"exp={experiment(spec)}/{scale}", f"out_dir={out_dir}"]
    cells = []
    for column in scale_columns(spec, scale):
        dataset = mini.get("datasets", {}).get(column["dataset"], column["dataset"]) if mini else column["dataset"]
        model = mini.get("model", column["model"]) if mini else column["model"]
        data_extra = mini.get("dataset_overrides", {}).get(dataset, []) if mini else []
        column_extra = [*mini.get("by_dataset", {}).get(column["dataset"], []),  # keyed by the paper's data set
                        *mini.get("column_overrides", {}).get(column["name"], [])] if mini else []
        for row in spec["rows"]:
            if row.get("unavailable"):
                continue
            row_extra = [*row.get("by_dataset", {}).get(column["dataset"], []),
                         *row.get("by_column", {}).get(column["name"], []),
                         *mini.get("rows", {}).get(row["name"], []),
                         *mini.get("rows_by_dataset", {}).get(row["name"], {}).get(column["dataset"], []),
                         *mini.get("rows_by_column", {}).get(row["name"], {}).get(column["name"], []),
                         *row.get("tuned", {}).get(column["name"], [])]  # values chosen by bench.tuning
            proto = row_protocol(spec, row["name"])
            scored = [f"eval.primary.{key}={proto[key]}" for key in PROTOCOL_KEYS]
            for seed in seeds:
                overrides = (*common, *scored, *placed, f"dataset={dataset}", *data_extra, f"model={model}",
                             *column.get("overrides", []), *column_extra, *row["overrides"], *row_extra, *extra,
                             f"seed={seed}")
                cells.append(Cell(row["name"], column["name"], seed, overrides))
    return cells


@dataclass(frozen=True)
class OutputColumn:
    """A column of the written table: a spec column (``client is None``: the protocol's mean over clients),
    or one client's accuracy in it (``per_client``: one client per domain, e.g. FedC2I's per-domain columns)."""

    name: str
    column: str  # the spec column whose runs it reads
    client: int | None
    paper: dict[str, Any]


def output_columns(spec: dict[str, Any], scale: str = "paper") -> list[OutputColumn]:
    """The table's columns in order: each spec column's per-client columns, then the column itself.

    A column's ``per_client: [{name: MNIST, setting: mnist}, ...]`` lists its clients in client-id order (the
    paper's ``setting`` of each, under the column's paper data set); at mini scale
    ``scales.mini.per_client: {<column name>: [...]}`` replaces it (the stand-in has other domains)."""
    mini = scale_block(spec, scale)
    out = []
    for column in scale_columns(spec, scale):
        ref = column.get("paper") or {}
        clients = mini.get("per_client", {}).get(column["name"], column.get("per_client", []))
        for i, client in enumerate(clients):
            if not isinstance(client, dict) or "name" not in client:
                raise ValueError(f"table {spec['paper']}/{spec['table']}, column {column['name']!r}: per_client "
                                 f"entry {client!r} needs a name, e.g. {{name: MNIST, setting: mnist}}")
            paper = {"dataset": ref.get("dataset"), "setting": client["setting"]} if client.get("setting") else {}
            out.append(OutputColumn(client["name"], column["name"], i, paper))
        out.append(OutputColumn(column["name"], column["name"], None, ref))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise ValueError(f"table {spec['paper']}/{spec['table']}: column names repeat in {names}; give every "
                         "per_client entry a name no other column has")
    return out


def paper_numbers(spec: dict[str, Any], scale: str = "paper") -> dict[tuple[str, str], tuple[float, float | None, str]]:
    """(row name, output column name) -> (mean, std, source) from the project's copy of the published tables."""
    frame = pd.read_csv(PAPER_TABLES)
    frame = frame[(frame["paper"] == spec["paper"]) & (frame["table"].astype(str) == str(spec["table"]))]
    out = {}
    for column in output_columns(spec, scale):
        ref = column.paper
        for row in spec["rows"]:
            hit = frame[(frame["dataset"] == ref.get("dataset")) & (frame["setting"] == ref.get("setting"))
                        & (frame["method"] == row.get("paper", row["name"]))]
            if len(hit):
                std = hit.iloc[0]["std"]
                out[(row["name"], column.name)] = (float(hit.iloc[0]["mean"]),
                                                      None if pd.isna(std) else float(std), str(hit.iloc[0]["source"]))
    return out


def slug(*parts: str) -> str:
    """A file- and W&B-safe name, e.g. ``slug("CIFAR-10 a=0.1", "FedCAC") == "CIFAR-10_a_0.1--FedCAC"``."""
    return "--".join(re.sub(r"[^A-Za-z0-9.+-]+", "_", part).strip("_") for part in parts)


def cell_slug(cell: Cell) -> str:
    """The name of a table cell (column, then row) in W&B groups and file names."""
    return slug(cell.column, cell.row)


def cell_config(cell: Cell, spec: dict[str, Any] | None = None, scale: str = "paper") -> dict[str, Any]:
    """The composed config of a cell; its W&B group is ``<paper>/<table>/<cell>``, job type the row (method)."""
    cfg = to_container(compose_config(list(cell.overrides)))
    if spec is not None:
        wandb = cfg["logger"]["wandb"]
        wandb["group"] = f"{spec['paper']}/{label(spec)}/{cell_slug(cell)}"
        wandb["job_type"] = cell.row
        wandb["tags"] = [*wandb.get("tags", []), f"scale:{scale}", f"table:{spec['paper']}/{label(spec)}",
                         f"cell:{cell_slug(cell)}"]
    return cfg


def output_base(paper: str, name: str, scale: str, results_dir: str | os.PathLike = "results") -> Path:
    """``results/<paper>/<name>`` at mini scale (what this repository can run), ``.../medium/<name>``,
    ``.../paper-scale/<name>``."""
    return Path(results_dir) / paper / SCALE_FOLDERS[scale] / name
