"""Table specs: loading, the typed schema, expansion into (row, column, seed) cells, names, and the published numbers.

A table spec (YAML) is documented in :mod:`bench.experiment.table`. This module checks one against its schema
(:class:`TableSpec`), turns it into cells, each with its full Hydra override list in the one order
:func:`cell_overrides` defines, and reads the paper's numbers from ``conf/paper/<paper>/paper_tables.csv``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from bench.experiment.compose import compose_config, to_container
from bench.experiment.spec_schema import SCALES, Column, Row, TableSpec

#: one folder per paper: its table specs, README and the published numbers (``<paper>/paper_tables.csv``)
PAPER_DIR = Path(__file__).resolve().parents[2] / "conf" / "paper"
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
class Override:
    """One Hydra override of a cell and where it comes from: the spec keys that give it, e.g.
    ``("rows", "FedCAC", "by_column", "CIFAR-10 a=0.1")`` (``rows`` and ``columns`` by name), or, for overrides
    not written in the spec, a description in parentheses, e.g. ``("(command line)",)``."""

    text: str
    source: tuple[str, ...]

    def where(self) -> str:
        """The source as a path, e.g. ``rows.FedCAC.by_column."CIFAR-10 a=0.1"``."""
        return ".".join(part if re.fullmatch(r"[\w()-]+", part) or part.startswith("(") else json.dumps(part)
                        for part in self.source)

    def key(self) -> str:
        """The config key it sets (``+``/``++``/``~`` dropped): a later override of the same key wins."""
        return self.text.split("=", 1)[0].lstrip("+~")


def cell_overrides(spec: TableSpec, scale: str, row: Row, column: Column, seed: int, out_dir: str = "runs",
                   extra: Sequence[str] = ()) -> list[Override]:
    """The overrides of one cell in precedence order (Hydra applies them in turn: a later one wins on the same
    key). This function is the only place that defines the order:

    the spec's ``base``, the scale's ``base``; the protocol (the table's, each key of the row's ``protocol`` over
    it); the run's ``exp`` and ``out_dir``; the data set (the column's, or the scale's stand-in for it) and the
    scale's ``dataset_overrides`` of it; the model (the column's, or the scale's); the column's ``overrides``,
    the scale's ``by_dataset`` (by the column's paper data set) and ``column_overrides``; the row's
    ``overrides``, ``by_dataset``, ``by_column``; the scale's ``rows``, ``rows_by_dataset``, ``rows_by_column``
    of the row; the values tuning chose for the row and column; the command line's overrides; the seed."""
    block, s, r, c = spec.block(scale), ("scales", scale), ("rows", row.name), ("columns", column.name)
    out: list[Override] = []

    def add(source: tuple[str, ...], texts: Sequence[str]) -> None:
        out.extend(Override(text, source) for text in texts)

    add(("base",), spec.base)
    add((*s, "base"), block.base)
    for key in PROTOCOL_KEYS:
        own = key in (row.protocol or {})
        add((*r, "protocol", key) if own else ("protocol", key),
            [f"eval.primary.{key}={(row.protocol if own else spec.protocol)[key]}"])  # type: ignore[index]
    experiment = spec.exp or f"{spec.paper}/{table_label(spec.table)}"
    add(("(bench.experiment.table: the experiment and --out-dir)",), [f"exp={experiment}/{scale}",
                                                                      f"out_dir={out_dir}"])
    dataset = block.datasets.get(column.dataset, column.dataset)
    stand_in = column.dataset in block.datasets
    add((*s, "datasets", column.dataset) if stand_in else (*c, "dataset"), [f"dataset={dataset}"])
    add((*s, "dataset_overrides", dataset), block.dataset_overrides.get(dataset, []))
    add((*s, "model") if block.model is not None else (*c, "model"), [f"model={block.model or column.model}"])
    add((*c, "overrides"), column.overrides)
    add((*s, "by_dataset", column.dataset), block.by_dataset.get(column.dataset, []))
    add((*s, "column_overrides", column.name), block.column_overrides.get(column.name, []))
    add((*r, "overrides"), row.overrides)
    add((*r, "by_dataset", column.dataset), row.by_dataset.get(column.dataset, []))
    add((*r, "by_column", column.name), row.by_column.get(column.name, []))
    add((*s, "rows", row.name), block.rows.get(row.name, []))
    add((*s, "rows_by_dataset", row.name, column.dataset),
        block.rows_by_dataset.get(row.name, {}).get(column.dataset, []))
    add((*s, "rows_by_column", row.name, column.name), block.rows_by_column.get(row.name, {}).get(column.name, []))
    add(("(tuning: the grid point chosen on validation data)",), row.tuned.get(column.name, []))
    add(("(command line)",), extra)
    add(("(seed)",), [f"seed={seed}"])
    return out


@dataclass(frozen=True)
class Cell:
    row: str
    column: str
    seed: int
    overrides: tuple[str, ...]


def spec_files(path: str | os.PathLike) -> list[Path]:
    """The files a spec is merged from, in order: its ``include:`` files (shared files of its folder), then itself."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"table spec {path} does not exist: give a file conf/paper/<paper>/<table>.yaml "
                                "(make help lists the tables)")
    included = OmegaConf.load(path).get("include") or []  # one file or a list; later ones override earlier
    names = [included] if isinstance(included, str) else list(included)
    for name in names:
        if not (Path(path).parent / name).is_file():
            raise ValueError(f"table spec {path}: include names {name!r}, which is not a file in "
                             f"{Path(path).parent}; list files of the spec's own folder")
    return [*(Path(path).parent / name for name in names), Path(path)]


def origin(files: Sequence[Path], source: tuple[str, ...]) -> Path | None:
    """The file of ``files`` (merged in order) that gives the spec keys ``source`` of an :class:`Override`: the
    last that sets them (lists, such as ``rows``, are replaced whole by a later file); None: not a spec key."""
    found = None
    for path in files:
        node: Any = OmegaConf.to_container(OmegaConf.load(path))
        for part in source:
            if not isinstance(node, dict) or part not in node:
                node = None
                break
            node = node[part]
            if isinstance(node, list):  # rows / columns: the whole list comes from this file
                break
        found = path if node is not None else found
    return found


def load_spec(path: str | os.PathLike) -> dict[str, Any]:
    """The spec at ``path``, its ``include:`` files merged underneath; checked (:class:`TableSpec` and more)."""
    files = spec_files(path)
    raw = OmegaConf.merge(*(OmegaConf.load(file) for file in files))
    raw.pop("include", None)
    spec = OmegaConf.to_container(raw, resolve=True)
    TableSpec.parse(spec, f"table spec {path}")  # every key known, every required one there, lists of strings
    rows = [row.get("name") for row in spec["rows"]]
    for where, proto in [("protocol", spec["protocol"]),
                         *((f"row {row.get('name')!r}: protocol", row["protocol"]) for row in spec["rows"]
                           if row.get("protocol") is not None)]:
        check_protocol(proto, f"table spec {path}, {where}", full=where == "protocol")
    if spec.get("compare") is not None and spec["compare"] not in rows:
        raise ValueError(f"table spec {path}: compare={spec['compare']!r} is not a row; use one of {rows}")
    for scale in SCALES:
        output_columns(spec, scale)  # per_client entries well-formed, column names unique
        measured_datasets(spec, scale)  # measures_paper names the spec's data sets
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
    return table_label(spec["table"])


def table_label(table: str | int) -> str:
    name = str(table)
    return f"table{name}" if name[:1].isdigit() else name


def experiment(spec: dict[str, Any]) -> str:
    """The runs' ``exp`` (before the scale): the spec's ``exp`` if given, e.g. ``fedselect/table1`` for a figure
    whose rows include cells of Table 1 (the same config then means the same run), else ``<paper>/<label>``."""
    return str(spec.get("exp") or f"{spec['paper']}/{label(spec)}")


def expand(spec: dict[str, Any], scale: str, seeds: Sequence[int] | None = None,
           out_dir: str = "runs", extra: Sequence[str] = ()) -> list[Cell]:
    """Every (row, column, seed) cell with its full Hydra override list (:func:`cell_overrides`)."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is invalid: use one of {list(SCALES)}")
    if scale != "paper" and not scale_block(spec, scale):
        raise ValueError(f"table {spec['paper']}/{spec['table']} has no {scale} scale: add scales.{scale} to its spec "
                         "or use another --scale")
    typed = TableSpec.parse(spec, f"table {spec['paper']}/{spec['table']}")
    block = typed.block(scale)
    seeds = list(seeds if seeds is not None else block.seeds if block.seeds is not None else typed.seeds)
    run = {column["name"] for column in scale_columns(spec, scale)}
    return [Cell(row.name, column.name, seed,
                 tuple(o.text for o in cell_overrides(typed, scale, row, column, seed, out_dir, extra)))
            for column in typed.columns if column.name in run
            for row in typed.rows if not row.unavailable
            for seed in seeds]


@dataclass(frozen=True)
class OutputColumn:
    """A column of the written table: a spec column (``client is None``: the protocol's mean over clients),
    or one client's accuracy in it (``per_client``: one client per domain, e.g. FedC2I's per-domain columns)."""

    name: str
    column: str  # the spec column whose runs it reads
    client: int | None
    paper: dict[str, Any]


def measured_datasets(spec: dict[str, Any], scale: str) -> set[str] | None:
    """The paper data sets (column ``dataset`` keys) whose data at ``scale`` is declared to measure the paper's
    question, so that their columns are compared with the paper's numbers (Kendall's tau, sign marks): every one
    at the paper scale; at another scale the block's ``measures_paper: [data set, ...]``, None (every one) where
    the block does not declare it. A stand-in not listed shows our numbers only."""
    declared = scale_block(spec, scale).get("measures_paper") if scale != "paper" else None
    if declared is None:
        return None
    # a paper's shared setup may declare data sets that only some of its tables have
    datasets = {column["dataset"] for column in spec["columns"]} | set(scale_block(spec, scale).get("datasets", {}))
    if not isinstance(declared, list) or not set(declared) <= datasets:
        raise ValueError(f"table {spec['paper']}/{spec['table']}: scales.{scale}.measures_paper is {declared!r}: "
                         f"give a list of the paper data sets whose stand-in measures the paper's question, "
                         f"from {sorted(datasets)} (or [] for none)")
    return set(declared)


def unmeasured_columns(spec: dict[str, Any], scale: str) -> list[str]:
    """The output columns (per-client ones included) whose stand-in is not declared to measure the paper's
    question at ``scale`` (:func:`measured_datasets`): shown without the paper's numbers, tau or sign marks."""
    measured = measured_datasets(spec, scale)
    if measured is None:
        return []
    dataset = {column["name"]: column["dataset"] for column in spec["columns"]}
    return [c.name for c in output_columns(spec, scale) if dataset[c.column] not in measured]


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


def paper_tables(paper: str) -> Path:
    """The project's copy of paper ``paper``'s published numbers: ``conf/paper/<paper>/paper_tables.csv``."""
    return PAPER_DIR / paper / "paper_tables.csv"


def paper_numbers(spec: dict[str, Any], scale: str = "paper") -> dict[tuple[str, str], tuple[float, float | None, str]]:
    """(row name, output column name) -> (mean, std, source) from the project's copy of the published tables;
    none for a column whose stand-in does not measure the paper's question (:func:`unmeasured_columns`)."""
    path = paper_tables(spec["paper"])
    if not path.is_file():
        return {}
    frame = pd.read_csv(path, dtype={key: str for key in ("paper", "table", "dataset", "setting", "method", "source")})
    frame = frame[(frame["paper"] == spec["paper"]) & (frame["table"].astype(str) == str(spec["table"]))]
    out = {}
    unmeasured = set(unmeasured_columns(spec, scale))
    for column in output_columns(spec, scale):
        if column.name in unmeasured:
            continue
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
