"""The schema of a table spec: the spec, its columns, rows, scale blocks and tuning block as dataclasses.

A key that is not one of their fields is refused, naming it and the allowed keys (a misspelt ``colums:`` fails
``bench.experiment.table --dry-run`` with exit status 2), and so is a missing required key or a value of the wrong kind.
A new spec key is one field line here, with a default so that the specs without it still load. The keys' meaning
is documented in :mod:`bench.experiment.table`; :func:`bench.experiment.spec.cell_overrides` orders the overrides they
give a cell.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

SCALES = ("mini", "medium", "paper")

_TYPES: dict[str, tuple[Any, str]] = {  # a field's annotation -> (check of its value, what it must be)
    "str": (lambda v: isinstance(v, str), "a string"),
    "list[str]": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "list[int]": (lambda v: isinstance(v, list) and all(isinstance(x, int) for x in v), "a list of integers"),
    "dict[str, list[str]]": (lambda v: isinstance(v, dict) and all(
        isinstance(x, list) and all(isinstance(y, str) for y in x) for x in v.values()),
        "a mapping {name: [overrides]}"),
}


def from_mapping(cls: type, data: Any, where: str, nested: dict[str, Any] | None = None) -> Any:
    """``cls(**data)``, refusing a key that is not a field of ``cls`` (naming it and the allowed keys), a missing
    required field, and a value of the wrong kind (for the annotations of :data:`_TYPES`); ``nested``: values
    already parsed into their own types, by field name."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} is {data!r}: give a mapping")
    allowed = [f.name for f in fields(cls)]
    unknown = [key for key in data if key not in allowed]
    if unknown:
        kind = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()  # TableSpec -> "table spec"
        raise ValueError(f"{where} has the key {unknown[0]!r}, which a {kind} does not have: "
                         f"the allowed keys are {allowed}")
    missing = [f.name for f in fields(cls) if f.name not in data
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{where} lacks the key {missing[0]!r}")
    for f in fields(cls):
        check, kind = _TYPES.get(str(f.type).removesuffix(" | None"), (None, ""))
        value = data.get(f.name)
        if check is not None and value is not None and not check(value):
            raise ValueError(f"{where}: {f.name} is {value!r}: give {kind}")
    return cls(**{**data, **(nested or {})})


@dataclass(frozen=True)
class Column:
    """A result column: a data set and model with its overrides (documented in :mod:`bench.experiment.table`)."""

    name: str
    dataset: str
    model: str
    overrides: list[str] = field(default_factory=list)
    paper: dict[str, Any] | None = None  # {dataset, setting}: where its numbers are in paper_tables.csv
    per_client: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """A row: one method (variant) with its overrides."""

    name: str
    overrides: list[str] = field(default_factory=list)
    paper: str | None = None  # the method's name in paper_tables.csv (default: the row's name)
    protocol: dict[str, str] | None = None  # over the table's protocol
    by_dataset: dict[str, list[str]] = field(default_factory=dict)
    by_column: dict[str, list[str]] = field(default_factory=dict)
    unavailable: str | None = None  # not run: the reason, shown in its cells
    tuned: dict[str, list[str]] = field(default_factory=dict)  # per column: the values bench.experiment.tuning chose
    searched: int | None = None  # the points its search ran (bench.experiment.tuning.with_tuned); None: not searched


@dataclass(frozen=True)
class Tuning:
    """A ``tuning:`` block (``bench.experiment.tuning``); a scale's block replaces the keys it gives."""

    grid: dict[str, Any] = field(default_factory=dict)  # every row: its key hyperparameter's values, or None
    seeds: list[int] | None = None
    val_fraction: float | None = None
    lr_factors: list[float] | None = None  # the row's own step times these, with its key values
    lr_factors_alone: list[float] | None = None  # the same for a row with no key hyperparameter


@dataclass(frozen=True)
class ScaleBlock:
    """A ``scales.<scale>`` block: stand-ins and overrides at that scale."""

    seeds: list[int] | None = None
    base: list[str] = field(default_factory=list)
    datasets: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    dataset_overrides: dict[str, list[str]] = field(default_factory=dict)
    by_dataset: dict[str, list[str]] = field(default_factory=dict)
    column_overrides: dict[str, list[str]] = field(default_factory=dict)
    rows: dict[str, list[str]] = field(default_factory=dict)
    rows_by_dataset: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    rows_by_column: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    per_client: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    columns: list[str] | None = None
    tuning: Tuning | None = None
    measures_paper: list[str] | None = None  # paper data sets whose stand-in measures the paper's question


@dataclass(frozen=True)
class TableSpec:
    """A table spec (schema: :mod:`bench.experiment.table`). Top-level keys starting with ``_`` hold YAML anchors
    only."""

    paper: str
    table: str | int
    protocol: dict[str, str]
    seeds: list[int]
    columns: list[Column]
    rows: list[Row]
    title: str | None = None
    exp: str | None = None
    base: list[str] = field(default_factory=list)
    compare: str | None = None
    notes: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    scales: dict[str, ScaleBlock] = field(default_factory=dict)
    tuning: Tuning | None = None

    @classmethod
    def parse(cls, spec: dict[str, Any], where: str = "table spec") -> TableSpec:
        """The typed form of a spec's dict (as :func:`load_spec` returns it, or as ``bench.experiment.tuning``
        extends it)."""
        if not isinstance(spec, dict):
            raise ValueError(f"{where} is {spec!r}: give a mapping")
        data = {key: value for key, value in spec.items() if not key.startswith("_")}
        for key in ("columns", "rows"):
            if not isinstance(data.get(key, []), list):
                raise ValueError(f"{where}: {key} is {data[key]!r}: give a list of mappings")
        scales = data.get("scales") or {}
        if not isinstance(scales, dict):
            raise ValueError(f"{where}: scales is {scales!r}: give a mapping {{mini: {{...}}, medium: {{...}}}}")
        odd = sorted(set(scales) - set(SCALES))
        if odd:
            raise ValueError(f"{where}: scales has the key {odd[0]!r}, which is no scale: the allowed keys are "
                             f"{list(SCALES)}")

        def tuning(block: dict[str, Any], at: str) -> Tuning | None:
            return None if block.get("tuning") is None else from_mapping(Tuning, block["tuning"], f"{at}.tuning")

        blocks = {}
        for scale, block in scales.items():
            at = f"{where}, scales.{scale}"
            blocks[scale] = from_mapping(ScaleBlock, block or {}, at, {"tuning": tuning(block or {}, at)})
        columns = [from_mapping(Column, c, f"{where}, column {c.get('name') if isinstance(c, dict) else c!r}")
                   for c in data.get("columns", [])]
        rows = [from_mapping(Row, r, f"{where}, row {r.get('name') if isinstance(r, dict) else r!r}")
                for r in data.get("rows", [])]
        return from_mapping(cls, data, where, {"columns": columns, "rows": rows, "scales": blocks,
                                               "tuning": tuning(data, where)})

    def block(self, scale: str) -> ScaleBlock:
        """The ``scales.<scale>`` block (empty if the spec has none)."""
        return self.scales.get(scale) or ScaleBlock()
