"""A table's manifest: which run directory holds each cell, by which config and code, as the table ran.

``bench.experiment.table`` writes ``<results>/<paper>/[<scale folder>/]<table>.manifest.json`` beside the table: per
cell (row, column, seed) its run directory relative to the runs' ``out_dir``, the run's config hash and the code hash
its summary records, and a digest of the cell's Hydra overrides. Readers of finished runs (``bench.experiment.collect``,
``bench.experiment.plots``, the figure scripts) take a cell's directory from it, without composing the cell's config
(Hydra, torch and every method imported), whenever the cell's overrides are the ones the table ran; any other cell is
composed as before. A manifest therefore names the runs a table was computed from: a change of ``conf/`` defaults is
seen by the next table run, which composes every cell and writes the manifest again.

``python -m bench.experiment.manifest <spec> --scale medium`` writes the manifest of a table from its cells' composed
configs (for tables computed before manifests existed)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.experiment.identity import IDENTITY_VERSION
from bench.experiment.spec import Cell, label, output_base

#: the layout of a manifest file
MANIFEST_VERSION = 1


def manifest_path(spec: Mapping[str, Any], scale: str, results_dir: str | os.PathLike = "results") -> Path:
    """Where a table's manifest lies: beside its Markdown, ``<table>.manifest.json``."""
    return output_base(spec["paper"], label(dict(spec)), scale, results_dir).with_suffix(".manifest.json")


def overrides_digest(cell: Cell) -> str:
    """The digest of a cell's Hydra overrides, less ``out_dir=`` (where the runs are is the reader's choice)."""
    kept = [o for o in cell.overrides if not o.startswith("out_dir=")]
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]


def _out_dir(cell: Cell) -> Path:
    given = [o.partition("=")[2] for o in cell.overrides if o.startswith("out_dir=")]
    return Path(given[-1] if given else "runs")


def _entry(cell: Cell, run: Path) -> dict[str, Any]:
    out_dir = _out_dir(cell)
    summary = run / "summary.json"
    recorded = json.loads(summary.read_text()) if summary.exists() else {}
    return {"row": cell.row, "column": cell.column, "seed": cell.seed, "overrides": overrides_digest(cell),
            "run_dir": str(run.relative_to(out_dir) if run.is_relative_to(out_dir) else run),
            "config_hash": recorded.get("config_hash"), "code_hash": (recorded.get("code") or {}).get("hash")}


def write_manifest(spec: Mapping[str, Any], scale: str, dirs: Mapping[Cell, Path],
                   results_dir: str | os.PathLike = "results") -> Path:
    """Write (or update) a table's manifest with the run directories ``dirs`` of its cells; cells of an earlier
    manifest that ``dirs`` does not name (other seeds) are kept. Config and code hashes come from each finished
    run's summary (null for a run that has none)."""
    from common.verified_io import atomic_write_text

    path = manifest_path(spec, scale, results_dir)
    entries = {(e["row"], e["column"], e["seed"]): e for e in _read(path)}
    entries.update({(cell.row, cell.column, cell.seed): _entry(cell, Path(run)) for cell, run in dirs.items()})
    order = {name: i for i, name in enumerate(r["name"] for r in spec["rows"])}
    columns = {name: i for i, name in enumerate(c["name"] for c in spec["columns"])}
    cells = sorted(entries.values(), key=lambda e: (columns.get(e["column"], len(columns)),
                                                     order.get(e["row"], len(order)), e["row"], e["seed"]))
    manifest = {"manifest_version": MANIFEST_VERSION, "identity_version": IDENTITY_VERSION, "paper": spec["paper"],
                "table": str(spec["table"]), "scale": scale, "cells": cells}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(manifest, indent=1) + "\n")
    return path


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    manifest = json.loads(path.read_text())
    if manifest.get("manifest_version") != MANIFEST_VERSION or manifest.get("identity_version") != IDENTITY_VERSION:
        return []  # written under another rule: its directories are not this tree's
    return manifest["cells"]


def cell_dirs(spec: Mapping[str, Any], scale: str, cells: Sequence[Cell],
              results_dir: str | os.PathLike = "results") -> dict[Cell, Path]:
    """The run directory of every cell: from the table's manifest where it lists the cell with the same overrides,
    else from the cell's composed config (:func:`bench.experiment.identity.run_dir_for`)."""
    listed = {(e["row"], e["column"], e["seed"], e["overrides"]): e["run_dir"]
              for e in _read(manifest_path(spec, scale, results_dir))}
    from bench.experiment.compose import sharing_compositions

    out = {}
    with sharing_compositions():  # the cells not listed: each distinct list of group choices composed once
        for cell in cells:
            found = listed.get((cell.row, cell.column, cell.seed, overrides_digest(cell)))
            out[cell] = _out_dir(cell) / found if found is not None else composed_dir(cell)
    return out


def composed_dir(cell: Cell) -> Path:
    """A cell's run directory from its composed config (Hydra)."""
    from bench.experiment.identity import run_dir_for
    from bench.experiment.spec import cell_config

    return run_dir_for(cell_config(cell))


def main(argv: Sequence[str] | None = None) -> None:
    from bench.experiment.compose import sharing_compositions
    from bench.experiment.spec import SCALES, expand, load_spec
    from bench.experiment.tuning import with_tuned

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="+", help="table specs, e.g. conf/paper/fedcac/table2.yaml")
    parser.add_argument("--scale", default="mini", choices=SCALES)
    parser.add_argument("--out-dir", default="runs", help="where the run directories are")
    parser.add_argument("--results", default="results", help="where tables (and their manifests) are")
    args = parser.parse_args(argv)
    for path in args.spec:
        spec = with_tuned(load_spec(path), args.scale, args.results)  # the rows' searched values, as the table ran
        cells = expand(spec, args.scale, out_dir=args.out_dir)
        with sharing_compositions():
            dirs = {cell: composed_dir(cell) for cell in cells}
        finished = sum((run / "summary.json").exists() for run in dirs.values())
        print(f"wrote {write_manifest(spec, args.scale, dirs, args.results)} ({len(cells)} cells, {finished} with a "
              "summary)")


if __name__ == "__main__":
    main()
