"""Paper tables: expand a table spec into runs, run the missing ones, write ours beside the paper's.

Usage: ``python -m bench.experiment.table conf/paper/fedcac/table2.yaml --scale mini [--launcher local|slurm|inline]
[--seeds 0 1] [--dry-run] [--quiet] [-- device=cuda launcher.partition=gpu]`` (``make fedcac-table2`` wraps it).
``--dry-run`` runs nothing but builds every cell's partition for every seed, from the official label counts where
the data is absent (``bench.experiment.precheck.dry_build``), and exits 1 naming each cell that cannot be built; a
table with a ``tuning:`` search counts the search's cells first, then the final cells at the points a finished search
picks (``bench.experiment.tuning.dry_run_search``).
On a terminal a progress line shows runs done / total, failures and an ETA (``--quiet``: none).

A table spec (YAML)::

    include: _setup.yaml     # optional: shared files of the paper's folder merged underneath (or a list, in order)
    paper: fedcac            # key into conf/paper/<paper>/paper_tables.csv
    table: "2"
    title: ...
    protocol: {stage: post, selection: best, weighting: unweighted}
    seeds: [0, 1, 2, 3, 4]
    exp: fedcac/table2                           # optional: the runs' exp (default <paper>/<table label>): a figure
                                                 # naming a table's exp shares the cells whose configs are equal
    base: [num_clients=40, ...]                  # Hydra overrides for every cell
    compare: FedCAC                              # optional: this row minus the best other, paired over seeds
    notes: ["Code over text: ..."]               # optional: caption lines (e.g. where the official code decides)
    metrics: [personal_fraction]                 # optional: method metrics at the final round, shown per row/column
    columns:                                     # one per result column
      - {name: "CIFAR-10 a=0.1", dataset: cifar10, model: resnet8,
         overrides: [partition=dirichlet, partition.alpha=0.1], paper: {dataset: cifar10, setting: dir-0.1}}
      - {name: "Digit-5 Avg", ..., per_client: [{name: MNIST, setting: mnist}, ...]}  # + a column per client
    rows:                                        # one per method (variant)
      - {name: FedCAC, paper: FedCAC, overrides: [method=fedcac], by_dataset: {cifar100: [method.beta=170]},
         by_column: {"CIFAR-10 a=0.1": [method.tau=0.4]}}  # after by_dataset: per column (e.g. per setting)
    scales:
      mini:                                      # stand-in on embedded data
        seeds: [0, 1]
        base: [...]                              # appended to base
        datasets: {cifar10: digits, ...}         # stand-in dataset per paper dataset
        model: small_cnn
        dataset_overrides: {mnist5k: [dataset.image_size=14]}
        rows: {FedCAC: [method.beta=4]}          # appended to that row's overrides
        rows_by_dataset: {FedRep: {cifar100: [method.body_epochs=2]}}  # then per row and the column's paper data set
        rows_by_column: {FedRep: {"CIFAR-100 a=0.1": [method.body_epochs=2]}}  # then per row and column
        per_client: {"Digit-5 Avg": [...]}       # the stand-in's clients, replacing the column's per_client
        by_dataset: {cifar100: [partition.n_train=40]}  # appended after the column's overrides, by its paper data set
        column_overrides: {"CIFAR-10 a=0.1": [partition.num_users=10]}  # then by column name
        measures_paper: [cifar10]                # optional: the paper data sets whose stand-in measures the paper's
                                                 # question; the others' columns show our numbers only (no paper
                                                 # number, tau or sign marks), as the caption says. Absent: all
      paper:                                     # optional: at the paper scale only (no stand-ins: base, by_dataset,
        base: [+partition.test_pool=class]       # column_overrides, rows, rows_by_dataset, rows_by_column)

A row may carry its own ``protocol: {stage: post}`` (any of stage, selection, weighting) over the table's: its cells
run and are scored with it, and the caption names every row scored otherwise (``bench.experiment.spec.row_protocol``).
A run whose final accuracy is not above chance (``bench.core.summary.chance_verdict``) shows as "did not train",
is listed, and makes the command exit non-zero, like a failed or diverged run.

A row with ``unavailable: <reason>`` is not run; the table shows the reason in its cells. An optional
``tuning:`` block grid-searches rows on the clients' validation split first (``bench.experiment.tuning``).

Every key is checked when the spec loads: a key that is not in this schema (the dataclasses ``TableSpec``,
``Column``, ``Row``, ``ScaleBlock`` and ``Tuning`` of ``bench.experiment.spec_schema``) is refused, naming it and the
allowed keys (top-level keys starting with ``_`` only hold YAML anchors). A cell's overrides apply in one
order, defined by ``bench.experiment.spec.cell_overrides``; ``--explain 'ROW | COLUMN'`` prints them with the spec key
and file each comes from and which later one replaces it. Every cell's config is composed and validated
before the first run starts, so a typo in an override fails at once.

Finished runs are reused (the run directory is a function of the config); only missing or failed cells
train, through the launcher of ``conf/launcher/`` (``bench.experiment.launch``). Tables are written by
``bench.experiment.collect`` (Markdown, LaTeX, CSV), which can also be run on its own at any time. Every table
states the seeds and test images per client of its cells and Kendall's tau between our ordering of the
rows and the paper's; with ``compare``, the paired difference of that row against the best other row.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from bench.experiment.cells import run_cells
from bench.experiment.collect import collect
from bench.experiment.errors import config_phase, run_cli
from bench.experiment.launch import load_launcher
from bench.experiment.manifest import write_manifest
from bench.experiment.precheck import CellsError
from bench.experiment.render import write_table
from bench.experiment.spec import SCALES, TableSpec, cell_config, cell_overrides, expand, load_spec, origin, spec_files
from bench.experiment.tuning import dry_run_search, tune, with_tuned
from bench.experiment.wandb_tables import after_table


def main(argv: Sequence[str] | None = None) -> int:
    """The table command; returns the exit status (1 when any cell failed, diverged, did not train or is missing).
    Configuration errors (a bad spec, override or launcher setting, missing data) raise
    :class:`bench.experiment.errors.ConfigError` before any run starts; ``python -m bench.experiment.table`` prints them
    in a line or two and exits with status 2 (``PFL_DEBUG=1``: with the traceback)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec")
    parser.add_argument("--scale", default="mini", choices=SCALES)
    parser.add_argument("--launcher", default="local", help="conf/launcher/<name>.yaml: inline, local or slurm")
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--out-dir", default="runs", help="where run directories go")
    parser.add_argument("--results", default="results", help="where tables go")
    parser.add_argument("--dry-run", action="store_true",
                        help="compose and validate every cell and build its partition for every seed (from the "
                             "data, else from the data sets' official label counts), run nothing; exits 1 naming "
                             "each cell that cannot be built (with --no-precheck: compose and validate only)")
    parser.add_argument("--no-cost", dest="cost", action="store_false",
                        help="with --dry-run: skip the cost estimate (runs, device-hours and peak memory per run "
                             "from a short calibration of each distinct setup, cached under <cache_dir>/cost)")
    parser.add_argument("--rerun-stale", action="store_true",
                        help="rerun finished cells computed by other code than this tree's (they are reused and "
                             "marked by default; the old runs are moved under <out-dir>/.stale/)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress line (runs done, failures, ETA); batch mode (output not a terminal) "
                             "shows only the start and final lines anyway")
    parser.add_argument("--no-precheck", dest="precheck", action="store_false",
                        help="skip loading each data set and partition here before launching")
    parser.add_argument("--explain", metavar="'ROW | COLUMN'",
                        help="print each override of that cell (its first seed) with where it comes from, in the "
                             "order they apply (bench.experiment.spec.cell_overrides), and its run directory; "
                             "run nothing")
    parser.add_argument("overrides", nargs="*",
                        help="Hydra overrides for every cell (device=cuda) and launcher settings (launcher.mem_gb=8)")
    argv = list(sys.argv[1:] if argv is None else argv)
    after = argv[argv.index("--") + 1:] if "--" in argv else []  # everything after "--" is an override
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.overrides += after
    launcher_overrides = [o for o in args.overrides if o.startswith("launcher.")]
    overrides = [o for o in args.overrides if not o.startswith("launcher.")]
    with config_phase():
        launcher = load_launcher(args.launcher, launcher_overrides)
        spec = load_spec(args.spec)
    if args.explain:
        with config_phase():
            print(explain(args.spec, with_tuned(spec, args.scale, args.results), args.scale, args.explain,
                          args.seeds, args.out_dir, overrides))
        return 0
    try:
        if spec.get("tuning"):  # the search first; a dry run counts its cells and, once it has finished, its picks
            spec = (dry_run_search(spec, args.scale, launcher, args.out_dir, overrides, precheck=args.precheck,
                                   cost=args.cost) if args.dry_run
                    else tune(spec, args.scale, launcher, args.out_dir, overrides, args.results))
        with config_phase():
            cells = expand(spec, args.scale, args.seeds, args.out_dir, overrides)
        dirs = run_cells(cells, dry_run=args.dry_run, launcher=launcher, spec=spec, scale=args.scale,
                         precheck=args.precheck, rerun_stale=args.rerun_stale, quiet=args.quiet, cost=args.cost)
    except CellsError as err:  # every cell that cannot run or be built, each named: the whole list, not a summary
        print(err, file=sys.stderr, flush=True)
        return 1
    if args.dry_run:
        return 0
    write_manifest(spec, args.scale, dirs, args.results)
    frame, problems = collect(spec, args.scale, dirs)
    print(f"wrote {write_table(spec, args.scale, frame, problems, args.results)}")
    # the table as a W&B run too, with the runs' logger.wandb settings; a W&B failure only warns
    after_table(args.spec, spec, args.scale, cells[0].overrides if cells else overrides, args.results,
                sorted({c.seed for c in cells}))
    unfinished = [p for p in problems if not p.startswith("not run: ")]
    if unfinished:
        print(f"{len(unfinished)} of {len(dirs)} runs did not finish (failed, diverged, partial or missing) or did "
              "not train (final accuracy not above chance); the table lists them", file=sys.stderr, flush=True)
        return 1
    return 0


def explain(path: str, spec: dict[str, Any], scale: str, cell: str, seeds: Sequence[int] | None = None,
            out_dir: str = "runs", extra: Sequence[str] = ()) -> str:
    """Each override of the cell ``"ROW | COLUMN"`` (at its first seed) in the order Hydra applies them, with the
    spec keys and the file it comes from, and which later override replaces it; then the cell's run directory."""
    from bench.experiment.identity import run_dir_for

    row_name, _, column_name = (part.strip() for part in cell.partition("|"))
    matches = [c for c in expand(spec, scale, seeds, out_dir, extra) if (c.row, c.column) == (row_name, column_name)]
    if not matches:
        rows = [r["name"] for r in spec["rows"]]
        columns = [c["name"] for c in spec["columns"]]
        raise ValueError(f"--explain {cell!r} names no cell run at the {scale} scale: give 'ROW | COLUMN', rows "
                         f"{rows}, columns {columns}")
    typed = TableSpec.parse(spec)
    row = next(r for r in typed.rows if r.name == row_name)
    column = next(c for c in typed.columns if c.name == column_name)
    overrides = cell_overrides(typed, scale, row, column, matches[0].seed, out_dir, extra)
    files = spec_files(path)
    width = max(len(o.text) for o in overrides)
    lines = [f"{path}, {scale} scale: row {row_name!r}, column {column_name!r}, seed {matches[0].seed} (seeds "
             f"{[c.seed for c in matches]}); overrides in the order they apply, a later one winning on its key:"]
    for i, override in enumerate(overrides):
        found = origin(files, override.source)
        later = next((o for o in overrides[i + 1:] if o.key() == override.key()), None)
        lines.append(f"  {override.text:<{width}}  {override.where()}"
                     + (f"  [{found.name}]" if found else "")
                     + (f"  (replaced by {later.text}, {later.where()})" if later else ""))
    lines.append(f"run directory: {run_dir_for(cell_config(matches[0], spec, scale))}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_cli(main))
