"""Wall time of one small run alone and next to a busy process, with 1 and 2 torch threads.

Why ``threads`` defaults to 1 (``bench/experiment/run.py`` ``run_threads``): on a 2-core machine that is also doing
something else, a run with 2 torch threads has to wait for both of its threads to be scheduled at every
parallel operation, while a 1-thread run just runs. This script measures it on the same run (the demo's
FedAvg cell, shortened: 20 clients, 10 rounds, the small CNN on embedded digits) in four cases:
alone / next to ``--busy`` pure-Python busy-loop processes (started before the run, running throughout,
stopped after it) x ``threads`` 1 / 2. Each run is a fresh ``python -m bench.experiment.run`` process with its own
``out_dir`` (nothing is reused). The cases are interleaved (alone/busy and 1/2 threads alternate, the order
reversed in every other repeat) so that a drift of the machine's load hits all of them alike, and the load
average is recorded before each case: other jobs may be using the machine too.

Writes ``load.json`` and ``load.md`` under ``--out``.
Usage: ``python scripts/load_benchmark.py [--repeats 2] [--threads 1 2] [--busy 1] [--out results/bench]
[extra overrides of the run ...]``
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.experiment.provenance import cpu_name
from common.verified_io import atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent

#: a small FedAvg run on the embedded 8x8 digits (the earlier demo's pathological cell, 10 rounds instead of 40)
RUN = ["method=fedavg", "dataset=digits", "model=small_cnn", "partition=pathological", "num_clients=20", "rounds=10",
       "train.epochs=2", "train.batch_size=20", "train.lr=0.05", "train.momentum=0.5", "seed=0", "quiet=true",
       "cache_dir=null", "logger.wandb.mode=disabled"]
CONDITIONS = ("alone", "busy")
BUSY_LOOP = "while True:\n    pass\n"


def schedule(repeats: int, threads: Sequence[int]) -> list[tuple[str, int]]:
    """The cases in the order they run: alone and busy alternate, the thread count changes every pair, and
    every other repeat runs in reverse, so that each case sits early and late alike (equal mean position)."""
    one = [(condition, t) for t in threads for condition in CONDITIONS]
    return [case for rep in range(repeats) for case in (one if rep % 2 == 0 else one[::-1])]


@contextlib.contextmanager
def busy(processes: int) -> Iterator[list[int]]:
    """``processes`` pure-Python busy loops (one core each), running until the block ends; yields their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(processes)]
    try:
        time.sleep(1.0)  # let them start spinning before the measured run starts
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def uptime() -> str:
    """``uptime``'s line (load averages over 1, 5, 15 minutes)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_once(threads: int, out_dir: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """One ``python -m bench.experiment.run`` of the run with ``threads`` torch threads: wall and CPU seconds, and a
    digest of its records (the same run must give the same records whatever the load)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench.experiment.run", *RUN, *overrides, f"threads={threads}",
                    f"out_dir={out_dir}"],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (timing,) = out_dir.glob("*/*/*/timing.json")
    run = json.loads(timing.read_text())
    assert run["threads"] == threads, run
    return {"wall_s": round(wall, 2), "run_s": round(run["wall_seconds"], 2),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "records_sha256": hashlib.sha256((timing.parent / "rounds.jsonl").read_bytes()).hexdigest()[:16]}


def summarize(cases: list[dict[str, Any]], threads: Sequence[int]) -> list[dict[str, Any]]:
    """Per (condition, threads): median, min and max of the wall and run seconds over the repeats."""
    rows = []
    for t in threads:
        for condition in CONDITIONS:
            mine = [c for c in cases if (c["condition"], c["threads"]) == (condition, t)]
            rows.append({"condition": condition, "threads": t, "n": len(mine),
                         **{f"{k}_median": round(statistics.median(c[k] for c in mine), 2)
                            for k in ("wall_s", "run_s", "cpu_s")},
                         "run_s_all": [c["run_s"] for c in mine], "wall_s_all": [c["wall_s"] for c in mine],
                         "load_before_all": [c["load_before"] for c in mine]})
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """busy/alone per thread count and threads 2/1 per condition, on the median run seconds."""
    by = {(r["condition"], r["threads"]): r["run_s_median"] for r in rows}
    out = {f"busy/alone at threads={t}": round(by["busy", t] / by["alone", t], 2)
           for t in sorted({t for _, t in by})}
    if {t for _, t in by} >= {1, 2}:
        out.update({f"threads=2 / threads=1 {c}": round(by[c, 2] / by[c, 1], 2) for c in CONDITIONS})
    return out


def render(meta: dict[str, Any]) -> str:
    rows, cases = meta["summary"], meta["cases"]
    lines = ["# One small run alone and next to a busy process, 1 vs 2 torch threads", "",
             f"The run: `python -m bench.experiment.run {' '.join(meta['run'])} threads=<1|2>` (a small FedAvg run on "
             "the embedded digits), each time a fresh process and run directory. "
             f"\"busy\" = {meta['busy']} "
             "pure-Python busy-loop process(es) started 1 s before the run and stopped after it. run s = the "
             "run's own `timing.json` (build, training, evaluation, records); wall s = the whole process "
             "(imports too); CPU s = user + system time of the run process.", "",
             f"Machine: {meta['machine']}, {meta['processor']}, {meta['cores']} cores, torch {meta['torch']}, "
             f"Python {meta['python']}. **The machine is shared**: other jobs were running too, so \"alone\" means "
             "without our busy process, not an idle machine. `uptime` at start: "
             f"`{meta['uptime_at_start']}`; the 1-minute load average before each case is in the last table. "
             f"The cases ran interleaved ({meta['repeats']} repeats, order reversed every other repeat) so that a "
             "drift of that load affects all of them alike.", "",
             f"Command: `{meta['command']}`", "",
             "| case | threads | run s (median) | run s, each repeat | wall s (median) | CPU s (median) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['condition']} | {r['threads']} | {r['run_s_median']} | "
              f"{', '.join(map(str, r['run_s_all']))} | {r['wall_s_median']} | {r['cpu_s_median']} |" for r in rows]
    lines += ["", *[f"- {k}: **{v}x**" for k, v in meta["ratios"].items()], "",
              f"- Records identical across load and repeats for each thread count: {meta['records_identical']}", ""]
    lines += ["Each case, in the order run:", "", "| # | case | threads | 1-min load before | run s | wall s | CPU s |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {i + 1} | {c['condition']} | {c['threads']} | {c['load_before']} | {c['run_s']} | {c['wall_s']} | "
              f"{c['cpu_s']} |" for i, c in enumerate(cases)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--busy", type=int, default=1, help="busy-loop processes next to the run in the busy case")
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("overrides", nargs="*", help="extra overrides of the run, e.g. rounds=5")
    args = parser.parse_args(argv)
    # stopped with SIGTERM: leave through the `finally` blocks, so that no busy loop outlives this script
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    import torch

    meta: dict[str, Any] = {
        "command": shlex.join(["python", "scripts/load_benchmark.py", *(sys.argv[1:] if argv is None else argv)]),
        "run": [*RUN, *args.overrides], "busy": args.busy, "repeats": args.repeats, "torch": torch.__version__,
        "machine": platform.machine(), "python": platform.python_version(), "cores": os.cpu_count(),
        "processor": cpu_name(),
        "uptime_at_start": uptime(), "cases": []}
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        for i, (condition, threads) in enumerate(schedule(args.repeats, args.threads)):
            load = os.getloadavg()[0]
            with busy(args.busy if condition == "busy" else 0):
                case = run_once(threads, Path(tmp) / f"case{i}", args.overrides)
            case = {"condition": condition, "threads": threads, "load_before": round(load, 2), **case}
            meta["cases"].append(case)
            print(json.dumps(case), flush=True)
    digests = {t: {c["records_sha256"] for c in meta["cases"] if c["threads"] == t} for t in args.threads}
    meta["records_identical"] = all(len(d) == 1 for d in digests.values())
    meta["summary"] = summarize(meta["cases"], args.threads)
    meta["ratios"] = ratios(meta["summary"])
    meta["uptime_at_end"] = uptime()
    out = Path(args.out)
    atomic_write_json(out / "load.json", meta)
    atomic_write_text(out / "load.md", render(meta))
    print(render(meta))
    return meta


if __name__ == "__main__":
    main()
