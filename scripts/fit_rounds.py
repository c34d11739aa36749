"""Run a table's cells with as many rounds as fit in a fixed time on this machine (a lent GPU, say), measured
first, and pack the finished runs' records to take home.

    python scripts/fit_rounds.py conf/paper/pa3dfl/table1.yaml --scale medium --budget-s 540 --workers 16 \\
        --pack $OUT/runs.tar -- device=cuda logger.wandb.mode=disabled

1. **Probe**: one run per row of the first column and seed (a search's grid points cost as their row),
   ``--probe-rounds`` rounds, all at once in ``--workers`` worker processes; each run's seconds per round are read
   from when its rounds' records appear (start-up and data loading left out). A row whose probe fails is left out.
2. **Choose R**: the most rounds, a multiple of ``--round-multiple`` (the spec's ``eval.every``) and at most
   ``--max-rounds``, such that the runs of step 3, longest first on ``--workers`` workers, end within the budget
   left, each run's time = its probe's seconds per round x R x ``--slowdown`` + its start-up.
3. **Run** every cell of the table at R rounds (``rounds=R`` after the cell's overrides; R is the same for every
   cell), the cells of each grid point of a tuned row too and the tuning search's cells, so that ``bench.experiment.
   table`` afterwards finds every run it needs finished, whichever point the search picks. Each finished run's
   records (not its checkpoints) are appended to ``--pack`` as it finishes; at the deadline the runs still going
   are stopped and left out.

On CPUs, where a table takes several sessions, ``--rounds R --search-first --drop-checkpoints`` runs it in parts:
a call runs the tuning search's cells and the untuned rows' cells; once the search has finished (this call or an
earlier one), the tuned rows' final cells at the point it picked, instead of at every point. Runs already finished
are not started again, so the same command, called again, goes on where the last one stopped (a run stopped at the
deadline starts over: its checkpoints stay on the machine that ran it).

Afterwards, where the records are wanted: unpack into the repository (``tar -xf runs.tar``), set the scale's
``rounds=R`` in the spec (the chosen R is in ``<pack>.json``), and run ``bench.experiment.table`` as usual: it
reuses every run (same configs, same run directories). ``device`` is not part of a run's identity
(``bench.experiment.identity.NON_SEMANTIC``), so the records say where they ran in their ``config.yaml``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.core.records import RunDir  # noqa: E402
from bench.experiment.compose import sharing_compositions  # noqa: E402
from bench.experiment.identity import run_dir_for  # noqa: E402
from bench.experiment.launch import Outcome, launch, load_launcher  # noqa: E402
from bench.experiment.spec import Cell, cell_config, expand, load_spec, scale_columns  # noqa: E402
from bench.experiment.tuning import own_values, resolve, row_grids, search_cells, tune  # noqa: E402

#: the files of a run directory that are its records (what the repository commits); checkpoints stay behind
RECORDS = ("config.yaml", "rounds.jsonl", "summary.json", "timing.json", "partition")


def point_specs(spec: dict[str, Any], scale: str, extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One spec per grid point of the tuned rows (a tuned row's every column set to that point, its relative values
    resolved against the cell's own), or the spec alone; rows with fewer points repeat their last."""
    grids = row_grids(spec, scale)
    if not grids:
        return [spec]
    own = own_values(spec, scale, extra)
    columns = [c["name"] for c in scale_columns(spec, scale)]
    specs = []
    for i in range(max(len(points) for points in grids.values())):
        point = copy.deepcopy(spec)
        for row in point["rows"]:
            if row["name"] in grids:
                chosen = grids[row["name"]][min(i, len(grids[row["name"]]) - 1)]
                row["tuned"] = {column: resolve(chosen, own.get((row["name"], column), {})) for column in columns}
        specs.append(point)
    return specs


def all_cells(spec: dict[str, Any], scale: str, out_dir: str, extra: Sequence[str]) -> list[tuple[Cell, dict]]:
    """Every (cell, its spec) that the table command may need at ``scale``: the search's and each point's."""
    search, tuning = search_cells(spec, scale, out_dir, extra)[:2] if spec.get("tuning") else (spec, [])
    pairs = [(cell, search) for cell in tuning]
    for point in point_specs(spec, scale, extra):
        pairs += [(cell, point) for cell in expand(point, scale, None, out_dir, extra)]
    return pairs


def search_first_cells(spec: dict[str, Any], scale: str, out_dir: str,
                       extra: Sequence[str]) -> list[tuple[Cell, dict]]:
    """The (cell, its spec) pairs to run now when the search goes first: while the search is unfinished, its cells
    and the untuned rows' cells; once every search run has finished, the table's cells with the point the search
    picked (``tune`` reads the finished runs; its report goes to a temporary folder, not over the table's)."""
    search, tuning = search_cells(spec, scale, out_dir, extra)[:2] if spec.get("tuning") else (spec, [])
    searched = [run_dir_for(cfg) for _, _, cfg in compose([(cell, search) for cell in tuning], scale)]
    if all(RunDir(path).is_complete() for path in searched):
        with tempfile.TemporaryDirectory() as results:
            tuned = tune(spec, scale, {"name": "inline"}, out_dir, extra, results_dir=results)
        return [(cell, tuned) for cell in expand(tuned, scale, None, out_dir, extra)]
    grids = row_grids(spec, scale)
    return [(cell, search) for cell in tuning] + [
        (cell, spec) for cell in expand(spec, scale, None, out_dir, extra) if cell.row not in grids]


def compose(pairs: Sequence[tuple[Cell, dict]], scale: str, *last: str) -> list[tuple[Cell, dict, dict[str, Any]]]:
    """(cell, its spec, its config with the overrides ``last`` after its own), one per run directory (cells that
    several points share run once)."""
    seen: dict[Path, tuple[Cell, dict, dict[str, Any]]] = {}
    with sharing_compositions():
        for cell, spec in pairs:
            cell = Cell(cell.row, cell.column, cell.seed, (*cell.overrides, *last))
            cfg = cell_config(cell, spec, scale)
            seen.setdefault(run_dir_for(cfg), (cell, spec, cfg))
    return list(seen.values())


def base_row(row: str) -> str:
    """The table row of a search's grid point (``Pa3dFL [method.hn_momentum=0.9]`` -> ``Pa3dFL``)."""
    return row.split(" [")[0]


def rounds_seen(path: Path) -> set[int]:
    """The rounds whose training record a run directory holds so far (a torn last line, still being written, is
    not read: ``RunDir.records``)."""
    return {r["round"] for r in RunDir(path).records() if r.get("kind") == "train"}


def probe(cells: Sequence[tuple[Cell, dict, dict[str, Any]]], launcher: dict[str, Any], rounds: int,
          log_dir: Path) -> dict[str, dict[str, float]]:
    """Seconds per round and start-up seconds of each probe run (key: the cell's row), from the times its rounds'
    records appear; a failed probe has no entry."""
    configs = [cfg for _, _, cfg in cells]
    dirs = [run_dir_for(cfg) for cfg in configs]
    seen: list[dict[int, float]] = [{} for _ in configs]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            now = time.time()
            for i, path in enumerate(dirs):
                for r in rounds_seen(path):
                    seen[i].setdefault(r, now)
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    outcomes = launch(configs, launcher, log_dir)
    done.set()
    watcher.join()
    timing = {}
    for (cell, _, _), outcome, times in zip(cells, outcomes, seen, strict=True):
        last = max(times, default=0)  # a probe stopped at its time limit is timed by the rounds it finished
        if 1 not in times or last < 2:
            print(f"probe of {cell.row} failed or finished < 2 rounds: {outcome.error.strip()[-300:]}", flush=True)
            continue
        per_round = (times[last] - times[1]) / (last - 1)
        timing[cell.row] = {"s_per_round": per_round, "startup_s": max(0.0, times[1] - outcome.started - per_round)}
    return timing


def makespan(durations: Sequence[float], workers: int) -> float:
    """Longest-first list scheduling of ``durations`` on ``workers``: when the last one ends."""
    ends = [0.0] * workers
    for d in sorted(durations, reverse=True):
        ends[ends.index(min(ends))] += d
    return max(ends)


def choose_rounds(costs: Sequence[tuple[float, float]], workers: int, left_s: float, multiple: int,
                  max_rounds: int, slowdown: float) -> int:
    """The most rounds (a multiple of ``multiple``, at most ``max_rounds``) whose runs fit in ``left_s``;
    ``costs`` = (seconds per round, start-up seconds) per run; 0 when not even ``multiple`` rounds fit."""
    best = 0
    for r in range(multiple, max_rounds + 1, multiple):
        if makespan([s + slowdown * r * p for p, s in costs], workers) <= left_s:
            best = r
    return best


def pack(tar_path: Path, run_dir: Path, root: Path) -> None:
    with tarfile.open(tar_path, "a") as tar:
        for name in RECORDS:
            if (run_dir / name).exists():
                tar.add(run_dir / name, arcname=str((run_dir / name).relative_to(root)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec")
    parser.add_argument("--scale", default="medium")
    parser.add_argument("--budget-s", type=float, required=True, help="seconds from start to the last record packed")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--probe-rounds", type=int, default=3)
    parser.add_argument("--probe-limit-s", type=float, default=120.0,
                        help="a probe run still going after this long is stopped (timed by the rounds it finished)")
    parser.add_argument("--round-multiple", type=int, default=2)
    parser.add_argument("--max-rounds", type=int, default=200)
    parser.add_argument("--slowdown", type=float, default=1.25,
                        help="margin on the probe's seconds per round (more runs at once than in the probe)")
    parser.add_argument("--rounds", type=int, help="run at this many rounds, no probe (e.g. to finish a table "
                                                    "that an earlier call fitted)")
    parser.add_argument("--rows", nargs="+", help="only these rows (and their search's grid points)")
    parser.add_argument("--search-first", action="store_true",
                        help="with --rounds: the tuned rows' final cells only at the point a finished search picked "
                             "(until the search has finished: its cells and the untuned rows')")
    parser.add_argument("--drop-checkpoints", action="store_true",
                        help="delete each finished run's checkpoints (a CPU's disk; the records stay)")
    parser.add_argument("--out-dir", default="runs")
    parser.add_argument("--pack", type=Path, required=True, help="tar file the finished runs' records go to")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run (device=cuda)")
    argv = list(sys.argv[1:] if argv is None else argv)
    after = argv[argv.index("--") + 1:] if "--" in argv else []  # everything after "--" is an override
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.overrides += after
    if args.search_first and not args.rounds:
        parser.error("--search-first needs --rounds (the search's runs are found by their rounds)")
    started = time.time()
    spec = load_spec(args.spec)
    if args.search_first:
        args.overrides.append(f"rounds={args.rounds}")
        pairs = search_first_cells(spec, args.scale, args.out_dir, args.overrides)
    else:
        pairs = all_cells(spec, args.scale, args.out_dir, args.overrides)
    if args.rows:
        pairs = [(cell, s) for cell, s in pairs if base_row(cell.row) in args.rows]
    cells = compose(pairs, args.scale)
    if args.rounds:
        return run_fitted(args, [(cell, s) for cell, s, _ in cells], args.rounds, {}, started)
    first_column = scale_columns(spec, args.scale)[0]["name"]
    chosen: dict[str, tuple[Cell, dict]] = {}
    for cell, cell_spec, _ in cells:  # one run per row: the table's first column, first seed (a search's grid
        if cell.column == first_column and cell.row == base_row(cell.row):  # points cost as their row does)
            chosen.setdefault(cell.row, (cell, cell_spec))
    probes = compose(list(chosen.values()), args.scale, f"rounds={args.probe_rounds}",
                     f"out_dir={Path(args.out_dir) / '.probe'}")
    print(f"{len(cells)} runs; probing {len(probes)} rows for {args.probe_rounds} rounds", flush=True)
    limited = load_launcher("local", [f"launcher.max_concurrent={args.workers}",
                                      f"launcher.timeout_min={args.probe_limit_s / 60}"])
    timing = probe(probes, limited, args.probe_rounds, Path(args.out_dir) / ".launch" / "probe")
    costs: dict[tuple[str, str, int], tuple[float, float]] = {}
    kept = []
    for cell, cell_spec, _ in cells:
        t = timing.get(base_row(cell.row))
        if t is not None:
            kept.append((cell, cell_spec))
            costs[(cell.row, cell.column, cell.seed)] = (t["s_per_round"], t["startup_s"])
    left = args.budget_s - (time.time() - started) - 15  # packing and the last record's margin
    rounds = choose_rounds(list(costs.values()), args.workers, left, args.round_multiple, args.max_rounds,
                           args.slowdown)
    print(f"probe: {json.dumps(timing)}\nchosen rounds={rounds} for {len(kept)} runs in {left:.0f} s", flush=True)
    if not rounds:
        return 1
    kept.sort(key=lambda pair: -costs[(pair[0].row, pair[0].column, pair[0].seed)][0])  # longest first
    return run_fitted(args, kept, rounds, timing, started, left)


def run_fitted(args: argparse.Namespace, kept: Sequence[tuple[Cell, dict]], rounds: int,
               timing: dict[str, Any], started: float, left: float | None = None) -> int:
    """Run ``kept`` at ``rounds`` rounds, in that order, packing each finished run; stop at the deadline."""
    report: dict[str, Any] = {"spec": args.spec, "scale": args.scale, "workers": args.workers, "rounds": rounds,
                              "probe": timing, "left_s": left, "runs": [], "overrides": args.overrides}
    report_path = args.pack.with_suffix(".json")
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    launcher = load_launcher("local", [f"launcher.max_concurrent={args.workers}"])
    final = [run for run in compose(kept, args.scale, f"rounds={rounds}")
             if not RunDir(run_dir_for(run[2])).is_complete()]  # finished ones stay as they are
    print(f"{len(final)} runs to go at {rounds} rounds", flush=True)
    configs = [cfg for _, _, cfg in final]
    root = Path(args.out_dir).resolve().parent

    def finished(outcome: Outcome) -> None:
        cell, cfg = final[outcome.index][0], configs[outcome.index]
        run_dir = run_dir_for(cfg)
        report["runs"].append({"row": cell.row, "column": cell.column, "seed": cell.seed, "ok": outcome.ok,
                               "seconds": outcome.ended - outcome.started, "run_dir": str(run_dir),
                               "error": outcome.error.strip()[-500:]})
        if outcome.ok:
            pack(args.pack, run_dir.resolve(), root)
            if args.drop_checkpoints:
                for path in (RunDir(run_dir).checkpoint, RunDir(run_dir).previous_checkpoint):
                    path.unlink(missing_ok=True)
        report_path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{'done' if outcome.ok else 'FAILED'} {cell.row} | {cell.column} | seed {cell.seed} "
              f"({outcome.ended - outcome.started:.0f} s, at {time.time() - started:.0f} s)", flush=True)

    deadline = threading.Timer(max(1.0, args.budget_s - (time.time() - started)), os.kill,
                               (os.getpid(), 15))  # SIGTERM: the local launcher stops its workers
    deadline.daemon = True
    deadline.start()
    try:
        launch(configs, launcher, Path(args.out_dir) / ".launch" / "fit", on_outcome=finished)
    except KeyboardInterrupt:  # the deadline: the runs still going are left out
        print(f"deadline at {time.time() - started:.0f} s: {len(configs) - len(report['runs'])} runs stopped",
              flush=True)
        return 1
    deadline.cancel()
    print(f"all runs ended at {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
