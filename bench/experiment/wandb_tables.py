"""Paper tables as W&B runs: one run per written table, so a W&B project shows the reproduction at a glance.

Each table (``results/<paper>/<table>.csv`` at mini scale, ``results/<paper>/paper-scale/<table>.csv`` at paper
scale, with its ``.stats.json`` when there is one) becomes one run: job type ``table``, group ``<paper>``, name
``<paper>/<table>/<scale>``, tags ``paper:<paper>``, ``scale:<scale>``, ``table:<paper>/<table>``, and the table's
provenance as config (spec, scale, seeds, runs averaged, commit). It logs

- ``table``: a ``wandb.Table`` with one line per (row, column) of the CSV: ``row``, ``column``, ``ours_mean``,
  ``ours_std``, ``n_seeds``, ``paper``, ``paper_std``, ``difference`` (ours − paper) and, where the stats have
  them, ``paired_diff`` (the spec's ``compare`` row minus this row, paired over seeds), ``paired_ci_low``,
  ``paired_ci_high``, ``paper_paired_diff`` and ``sign`` (✓ same sign as the paper, ✗ opposite, ✗! opposite
  beyond noise);
- ``ordering``: a ``wandb.Table`` of Kendall's tau per column, also in the summary as ``kendall_tau/<column>``;
- every PNG under the paper's ``figures/`` as ``figures/<path>`` (``wandb.Image``).

``bench.experiment.table`` calls :func:`after_table` once the table is written, with the runs' ``logger.wandb.*``
settings (mode, project, entity, dir); a failure there warns and leaves the table alone. On its own (default: every
table found under ``--results``)::

    python -m bench.experiment.wandb_tables [--results results] [--scale mini] [--dir runs/wandb-tables] [fedc2i/table1
    ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench.experiment.claims import mark
from bench.experiment.spec import SCALES, label, output_base, scale_block
from bench.experiment.wandb_logger import wandb_safe

ROOT = Path(__file__).resolve().parents[2]
#: the columns of a table CSV written by ``bench.experiment.render.write_table``
CSV_COLUMNS = ("method", "column", "mean", "std", "seeds", "paper_mean", "paper_std", "diff")
#: the columns of the logged ``wandb.Table``
TABLE_COLUMNS = ["row", "column", "ours_mean", "ours_std", "n_seeds", "paper", "paper_std", "difference",
                 "paired_diff", "paired_ci_low", "paired_ci_high", "paper_paired_diff", "sign"]
#: where table runs go when ``logger.wandb.dir`` is not set (W&B adds ``wandb/offline-run-*`` below it)
DEFAULT_DIR = "runs/wandb-tables"


def _value(value: Any) -> Any:
    """A CSV or JSON value for W&B: NaN/None as None, numpy scalars as Python ones."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def sign(paired: Mapping[str, Any]) -> str:
    """The paper-sign flag of a paired difference, as ``bench.experiment.render`` prints it ("" without a paper
    difference)."""
    return mark(paired).strip()


def table_rows(frame: pd.DataFrame, stats: Mapping[str, Any]) -> list[list[Any]]:
    """The lines of the W&B table (``TABLE_COLUMNS``) from a table's CSV frame and its stats."""
    paired = {(p["other"], p["column"]): p for p in stats.get("paired", [])}
    rows = []
    for r in frame.to_dict("records"):
        p = paired.get((r["method"], r["column"]), {})
        rows.append([_value(v) for v in (
            r["method"], r["column"], r["mean"], r["std"], int(r["seeds"]), r["paper_mean"], r["paper_std"], r["diff"],
            p.get("mean_diff"), p.get("ci_low"), p.get("ci_high"), p.get("paper_diff"))] + [sign(p)])
    return rows


def table_files(results_dir: str | os.PathLike, paper: str, table: str, scale: str) -> tuple[Path, Path]:
    """(CSV, stats JSON) of one written table."""
    base = output_base(paper, table, scale, results_dir)
    return base.with_suffix(".csv"), base.with_suffix(".stats.json")


def find_tables(results_dir: str | os.PathLike = "results",
                scales: Sequence[str] = SCALES) -> list[tuple[str, str, str]]:
    """Every (paper, table, scale) whose CSV under ``results_dir`` is a paper table (``bench.experiment.render``
    columns)."""
    found = []
    for scale in scales:
        for paper_dir in sorted(p for p in Path(results_dir).iterdir() if p.is_dir()):
            folder = output_base(paper_dir.name, "", scale, results_dir)  # results/<paper>[/paper-scale]/
            for csv in sorted(folder.glob("*.csv")):
                with csv.open() as f:
                    header = f.readline().strip().split(",")
                if set(CSV_COLUMNS) <= set(header):
                    found.append((paper_dir.name, csv.stem, scale))
    return found


def provenance(paper: str, table: str, scale: str, frame: pd.DataFrame, stats: Mapping[str, Any],
               spec_path: str | os.PathLike | None = None, seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """The run config: where the table comes from (spec, scale, seeds, runs averaged, commit)."""
    from bench.experiment.provenance import code_identity
    from bench.experiment.spec import load_spec

    path = Path(spec_path or ROOT / "conf" / "paper" / paper / f"{table}.yaml").resolve()
    spec = load_spec(path) if path.exists() else {}
    runs = None
    if spec:
        if seeds is None:
            seeds = scale_block(spec, scale).get("seeds", spec["seeds"])
        spec_columns = {c["name"] for c in spec["columns"]}  # per-client columns repeat their column's runs
        runs = int(frame[frame["column"].isin(spec_columns)]["seeds"].sum())
    code = code_identity()
    return {"paper": paper, "table": table, "scale": scale,
            "spec": (str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)) if spec else None,
            "title": spec.get("title"),
            "compare": spec.get("compare") or next((p["row"] for p in stats.get("paired", [])), None),
            "seeds": list(seeds) if seeds is not None else None, "seeds_per_cell": stats.get("seeds", []),
            "test_images_per_client": stats.get("test_images", []), "runs": runs,
            "commit": code["commit"], "dirty": code["dirty"]}


def log_table(results_dir: str | os.PathLike, paper: str, table: str, scale: str = "mini", *,
              project: str = "pflrepro", entity: str | None = None, mode: str = "offline",
              dir: str | os.PathLike | None = None, spec_path: str | os.PathLike | None = None,
              seeds: Sequence[int] | None = None) -> Path | None:
    """Log one written table as a W&B run (see the module docstring); returns the run's local directory."""
    import wandb

    csv, stats_path = table_files(results_dir, paper, table, scale)
    if not csv.exists():
        raise FileNotFoundError(f"no table {csv}: write it first (python -m bench.experiment.table or "
            "bench.experiment.collect)")
    frame = pd.read_csv(csv)
    missing = sorted(set(CSV_COLUMNS) - set(frame.columns))
    if missing:
        raise ValueError(f"{csv} is not a paper table: it lacks the column(s) {missing}")
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    where = Path(dir or DEFAULT_DIR)
    where.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("WANDB_SILENT", "true")
    tags = [wandb_safe(t, "tag") for t in (f"paper:{paper}", f"scale:{scale}", f"table:{paper}/{table}")]
    run = wandb.init(project=project, entity=entity, mode=mode, dir=str(where), job_type="table",
                     group=wandb_safe(paper, "group"), name=f"{paper}/{table}/{scale}", tags=tags,
                     config=provenance(paper, table, scale, frame, stats, spec_path, seeds))
    try:
        ordering = stats.get("ordering", [])
        logged: dict[str, Any] = {
            "table": wandb.Table(columns=TABLE_COLUMNS, data=table_rows(frame, stats)),
            "ordering": wandb.Table(columns=["column", "kendall_tau", "rows", "ours_best", "paper_best"],
                                    data=[[o["column"], None if o.get("untestable") else _value(o["tau"]), o["rows"],
                                           o["ours_best"], o["paper_best"]] for o in ordering])}
        figures = output_base(paper, "figures", scale, results_dir)
        for png in sorted(figures.rglob("*.png")):
            logged[f"figures/{png.relative_to(figures).with_suffix('').as_posix()}"] = wandb.Image(str(png))
        run.log(logged)
        flags = [sign(p) for p in stats.get("paired", [])]
        run.summary.update({"cells": len(frame), "paired/agrees": flags.count("✓"),
                            "paired/disagrees": flags.count("✗"), "paired/contradicts": flags.count("✗!"),
                            **{f"kendall_tau/{o['column']}": o["tau"] for o in ordering
                               if o["tau"] is not None and not o.get("untestable")}})
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    return Path(run.dir).parent if run.dir else None


def after_table(spec_path: str | os.PathLike, spec: Mapping[str, Any], scale: str, overrides: Sequence[str],
                results_dir: str | os.PathLike, seeds: Sequence[int] | None = None) -> Path | None:
    """``bench.experiment.table``'s hook: log the table just written, with the W&B settings of its runs (``overrides``:
    a cell's Hydra overrides); nothing when their ``logger.wandb.mode`` is disabled. W&B writes under
    ``logger.wandb.dir`` or else ``<out_dir>/wandb-tables``. A failure warns and returns
    None: the table on disk is what counts, and ``python -m bench.experiment.wandb_tables`` can log it later."""
    name = f"{spec['paper']}/{label(spec)}"
    try:
        from bench.experiment.compose import compose_config, to_container

        cfg = to_container(compose_config([o for o in overrides if o.lstrip("+").startswith(("logger.", "out_dir="))]))
        opts = cfg["logger"]["wandb"]
        if opts["mode"] == "disabled":
            return None
        return log_table(results_dir, spec["paper"], label(spec), scale, project=opts.get("project") or "pflrepro",
                         entity=opts.get("entity"), mode=opts["mode"],
                         dir=opts.get("dir") or Path(cfg["out_dir"]) / "wandb-tables", spec_path=spec_path,
                         seeds=seeds)
    except Exception as err:  # W&B must never cost the table
        warnings.warn(f"W&B logging of table {name} ({scale}) failed, the table itself is written: "
                      f"{type(err).__name__}: {err}. Log it later with: python -m bench.experiment.wandb_tables "
                          "--results "
                      f"{results_dir} --scale {scale} {name}", RuntimeWarning, stacklevel=2)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Log the tables (all found under ``--results`` by default); returns 1 when any failed."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", help="<paper>/<table>, e.g. fedc2i/table1 (default: every table)")
    parser.add_argument("--results", default="results", help="where the tables are")
    parser.add_argument("--scale", choices=SCALES, help="only this scale (default: every scale found)")
    parser.add_argument("--project", default="pflrepro")
    parser.add_argument("--entity")
    parser.add_argument("--mode", default="offline", choices=["offline", "online"])
    parser.add_argument("--dir", default=DEFAULT_DIR, help="where W&B writes (wandb/offline-run-* below it)")
    args = parser.parse_args(argv)
    scales = [args.scale] if args.scale else list(SCALES)
    found = find_tables(args.results, scales)
    if args.tables:
        wanted = set(args.tables)
        unknown = wanted - {f"{p}/{t}" for p, t, _ in found}
        if unknown:
            parser.error(f"no table {sorted(unknown)} under {args.results} at scale(s) {scales}; found: "
                         f"{sorted({f'{p}/{t}' for p, t, _ in found})}")
        found = [(p, t, s) for p, t, s in found if f"{p}/{t}" in wanted]
    failed = 0
    for paper, table, scale in found:
        try:
            where = log_table(args.results, paper, table, scale, project=args.project, entity=args.entity,
                              mode=args.mode, dir=args.dir)
            print(f"logged {paper}/{table}/{scale}" + (f" to {where}" if where else ""), flush=True)
        except Exception as err:  # one bad table should not stop the others
            failed += 1
            print(f"error: {paper}/{table}/{scale}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    if args.mode == "offline" and found:
        print(f"upload with: wandb sync {args.dir}/wandb/offline-run-*")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
