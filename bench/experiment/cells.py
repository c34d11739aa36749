"""Run the cells of a table: compose and validate every cell, check the data, launch the missing ones (showing
progress), and mark failed runs with ``error.txt`` (removed when the run later completes)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from bench.core.records import RunDir
from bench.experiment.compose import sharing_compositions
from bench.experiment.errors import config_phase
from bench.experiment.identity import run_dir_for
from bench.experiment.launch import Outcome, launch, load_launcher
from bench.experiment.precheck import CellsError, check_inputs, dry_build
from bench.experiment.provenance import is_stale, run_code
from bench.experiment.run import validate
from bench.experiment.spec import Cell, cell_config
from common.verified_io import atomic_write_text


def duration(seconds: float) -> str:
    """``1h02m``, ``3m07s`` or ``42s``."""
    seconds = max(0, round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class TableProgress:
    """Runs done / total, failures so far and an ETA while a table's runs go on, as one line rewritten in place
    on a terminal. Batch mode (``stream`` is not a TTY: a Slurm job, a pipe, a log file) and ``quiet`` show
    nothing here: only :func:`run_cells`' start and final lines.

    ETA = remaining runs x elapsed / finished runs: the finished runs' mean duration divided by the concurrency
    they achieved, so it holds for one process, a pool of workers or a job array alike."""

    def __init__(self, total: int, *, stream: TextIO | None = None, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.live = not quiet and self.stream.isatty()
        self.total, self.done, self.failed = total, 0, 0
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def line(self) -> str:
        elapsed = self.elapsed()
        left = self.total - self.done
        eta = duration(elapsed / self.done * left) if self.done else "?"
        return (f"[{self.done}/{self.total} runs] {self.failed} failed | elapsed {duration(elapsed)} | "
                f"ETA {eta if left else 'done'}")

    def __call__(self, outcome: Outcome) -> None:
        self.done += 1
        self.failed += not outcome.ok
        if self.live:
            self.stream.write(f"\r{self.line()}\x1b[K")  # carriage return, then clear the rest of the line
            self.stream.flush()

    def close(self) -> None:
        if self.live and self.done:
            self.stream.write("\n")
            self.stream.flush()


def set_aside_stale(cells: Sequence[Cell], configs: dict[Cell, dict[str, Any]], dirs: dict[Cell, Path]) -> None:
    """Move the finished runs of ``cells`` that other code computed to ``<out_dir>/.stale/<run>.<code>``."""
    for cell in cells:
        summary = json.loads(RunDir(dirs[cell]).summary.read_text())
        if not is_stale(summary, configs[cell].get("imports") or ()):
            continue
        out_dir = Path(configs[cell]["out_dir"])
        where = dirs[cell].relative_to(out_dir) if dirs[cell].is_relative_to(out_dir) else Path(dirs[cell].name)
        target = out_dir / ".stale" / f"{where}.{(run_code(summary) or 'unknown')[:10]}"
        while target.exists():  # set aside before, by the same old code: keep both
            target = target.with_name(target.name + "+")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(dirs[cell], target)
        print(f"stale: {cell.row} | {cell.column} | seed {cell.seed} was computed by other code; set aside to "
              f"{target} and run again", flush=True)


def run_cells(cells: Sequence[Cell], *, dry_run: bool = False, launcher: dict[str, Any] | None = None,
              spec: dict[str, Any] | None = None, scale: str = "paper", precheck: bool = True,
              rerun_stale: bool = False, quiet: bool = False, cost: bool = False) -> dict[Cell, Path]:
    """Compose and validate every cell first, check the data of the missing ones (``precheck``), then launch
    them, with a :class:`TableProgress` line on a terminal (``quiet``: none). ``rerun_stale``: finished runs
    computed by other code than this tree's are set aside (moved under ``<out_dir>/.stale/``, never deleted) and
    run again. ``dry_run``: launch nothing; with ``precheck``, build every cell's partition (every cell, finished
    or not: :func:`bench.experiment.precheck.dry_build`) and raise :class:`CellsError` naming each cell that cannot be
    built; with ``cost`` too, print the cost estimate of the runs a launch would start
    (:mod:`bench.experiment.cost`)."""
    launcher = launcher or load_launcher("inline")
    configs = {}
    with config_phase(), sharing_compositions():  # the cells' few distinct config-group choices: composed once each
        for cell in cells:
            cfg = cell_config(cell, spec, scale)
            validate(cfg, check_device=launcher["name"] != "slurm")  # Slurm: the GPU is on the compute node
            configs[cell] = cfg
    dirs = {cell: run_dir_for(cfg) for cell, cfg in configs.items()}
    if rerun_stale:
        set_aside_stale([c for c in cells if RunDir(dirs[c]).is_complete()], configs, dirs)
    missing = [c for c in cells if not RunDir(dirs[c]).is_complete()]
    print(f"{len(cells)} cells, {len(cells) - len(missing)} finished, {len(missing)} to run"
          + ("" if dry_run or not missing else f" ({launcher['name']} launcher)"), flush=True)
    if dry_run:
        if precheck:
            from bench.experiment.cost import base_rss, cost_report

            base = base_rss()  # before the dry build reads any data: what a run's process holds besides its work
            report = dry_build(cells, configs)
            print(report.summary(), flush=True)
            if report.problems:
                raise CellsError(f"{len(report.problems)} of {len(cells)} cells cannot be built:\n"
                                 + "\n".join(f"- {p}" for p in report.problems))
            if cost:
                sizes = {cell: report.cell_sizes(configs[cell]) for cell in cells}
                print(cost_report(cells, configs, sizes, launcher, missing, base), flush=True)
        return dirs
    if not missing:
        return dirs
    if precheck:
        with config_phase():
            check_inputs(missing, configs)
    log_dir = Path(configs[missing[0]]["out_dir"]) / ".launch" / str(configs[missing[0]].get("exp", "default"))
    progress = TableProgress(len(missing), quiet=quiet)
    try:
        outcomes = launch([configs[c] for c in missing], launcher, log_dir, on_outcome=progress)
    finally:
        progress.close()
    failed = 0
    for outcome in outcomes:
        cell = missing[outcome.index]
        if outcome.ok:
            (dirs[cell] / "error.txt").unlink(missing_ok=True)
            continue
        failed += 1
        atomic_write_text(dirs[cell] / "error.txt", f"{outcome.error}\nlog: {outcome.log}\n")
        print(f"FAILED {cell.row} | {cell.column} | seed {cell.seed} (run dir {dirs[cell]}; log {outcome.log}):\n"
              f"{outcome.error.strip().splitlines()[-1] if outcome.error.strip() else ''}", flush=True)
    print(f"{len(missing) - failed} runs finished, {failed} failed in {duration(progress.elapsed())}", flush=True)
    return dirs
