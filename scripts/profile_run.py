"""Where the time of one mini table2 run goes, in a fresh process and in a warm worker.

    python scripts/profile_run.py [--repeats 3] [--row FedAvg] [--column "CIFAR-10 a=0.1"] [--seed 0]
                                  [--wandb-setup] [--json results/bench/throughput.json] [--out-dir /tmp/profile]

Each repeat starts a new Python process (as a local job did before the worker pool) that imports what a run
needs, then runs the cell's config (a) fresh, as the process's first run, and (b) warm, again into another out_dir,
as a pool worker runs every config after its first (same config, so the two are the same work; the data source
is read by the fresh run and shared with the warm ones, as in a worker). Phases are timed
by wrapping the functions that do them (exclusive time: a nested phase is not counted in its caller), so the
records are those of a normal run. It profiles the code of its own tree (a copy of another commit too: its
``bench`` comes before any installed one). The table process's own share (composing the cell's config with Hydra, and
building its partition once in the pre-launch check) is timed here too. ``--wandb-setup`` calls
``wandb.setup()`` before the fresh run (a worker that starts W&B's service up front). Medians over the repeats.
"""

from __future__ import annotations

import time

T_FIRST = time.time()  # before anything else: when this interpreter began running Python code of ours

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections import defaultdict  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# the code of this script's own tree, also when it is a copy of another commit run by the venv of a checkout whose
# editable install would otherwise import that checkout's bench (the child processes run this file too)
sys.path.insert(0, str(ROOT))
SPEC = ROOT / "conf" / "paper" / "fedcac" / "table2.yaml"
#: the phases of a run, in the order they happen
RUN_PHASES = ("config validation", "data + partition", "model build", "partition report (CSV + figure)",
              "training", "of which optimizer construction", "evaluation", "records, checkpoints, summary",
              "code identity (git, source hash)", "W&B init", "W&B log + finish", "other (locks, callbacks)")


class Phases:
    """Exclusive wall-clock time per phase: entering a nested phase pauses the enclosing one."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.stack: list[list[Any]] = []

    def enter(self, name: str) -> None:
        now = time.perf_counter()
        if self.stack:
            self.totals[self.stack[-1][0]] += now - self.stack[-1][1]
        self.stack.append([name, now])

    def leave(self) -> None:
        now = time.perf_counter()
        name, start = self.stack.pop()
        self.totals[name] += now - start
        if self.stack:
            self.stack[-1][1] = now

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        fn: Callable[..., Any] = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        setattr(owner, attr, timed)

    def take(self) -> dict[str, float]:
        out = {name: round(self.totals.get(name, 0.0), 3) for name in RUN_PHASES}
        self.totals.clear()
        return out


def instrument(phases: Phases) -> None:
    import torch

    import bench.builder as builder
    import bench.core.engine as engine
    import bench.experiment.run as run
    import bench.experiment.wandb_logger as wandb_logger
    from bench.core.records import RunDir

    phases.wrap(run, "validate", "config validation")
    phases.wrap(run, "build_experiment", "model build")  # minus the data, timed inside it
    for name in ("load_sources", "build_federated_data"):
        phases.wrap(builder, name, "data + partition")
    phases.wrap(run, "partition_report", "partition report (CSV + figure)")
    phases.wrap(engine.Engine, "round", "training")  # minus evaluation, timed inside it
    phases.wrap(torch.optim.Optimizer, "__init__", "of which optimizer construction")
    phases.wrap(engine.Engine, "evaluate_client", "evaluation")
    for owner, name in ((RunDir, "append_records"), (RunDir, "save_checkpoint"), (RunDir, "load_checkpoint"),
                        (RunDir, "records"), (engine, "summarize"), (run, "atomic_write_json"),
                        (run, "atomic_write_text"), (run, "client_capacity_table")):
        phases.wrap(owner, name, "records, checkpoints, summary")
    phases.wrap(run, "code_identity", "code identity (git, source hash)")
    phases.wrap(wandb_logger.WandbLogger, "__init__", "W&B init")
    for name in ("on_round", "on_end"):
        phases.wrap(wandb_logger.WandbLogger, name, "W&B log + finish")


def child(args: argparse.Namespace) -> None:
    """One fresh process: imports, a fresh run, warm runs; prints its timings as JSON."""
    process = {"python start-up": T_FIRST - args.launched}
    start = time.time()
    import torch  # noqa: F401

    process["import torch"] = time.time() - start
    start = time.time()
    import bench.experiment.run  # noqa: F401 - methods, Hydra, OmegaConf, the core
    from bench.core.data import sharing_sources
    from bench.experiment.run import execute

    process["import bench.experiment.run (methods, Hydra, core)"] = time.time() - start
    if args.wandb_setup:
        start = time.time()
        import wandb

        wandb.setup()
        process["wandb.setup()"] = time.time() - start
    cfg = json.loads(args.config)
    phases = Phases()
    instrument(phases)
    runs = []
    with sharing_sources():  # as a pool worker: a data source is read by the first run only
        for label in ["fresh"] + [f"warm{i}" for i in range(1, args.warm + 1)]:
            run_cfg = {**cfg, "out_dir": str(Path(args.out_dir) / label)}
            phases.enter("other (locks, callbacks)")
            start = time.time()
            execute(run_cfg)
            total = time.time() - start
            phases.leave()
            runs.append({"label": label, "total": round(total, 3), **phases.take()})
    print(json.dumps({"process": {k: round(v, 3) for k, v in process.items()}, "runs": runs, "done": time.time()}))
    sys.stdout.flush()


def load() -> str:
    """The 1, 5 and 15 minute load averages (as ``uptime`` shows them)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes (medians over them)")
    parser.add_argument("--warm", type=int, default=2, help="warm runs per process after the fresh one")
    parser.add_argument("--row", default="FedAvg")
    parser.add_argument("--column", default="CIFAR-10 a=0.1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wandb-setup", action="store_true", help="call wandb.setup() before the fresh run")
    parser.add_argument("--out-dir", help="where the runs go (default: a temporary folder, removed)")
    parser.add_argument("--json", help="merge the result into this JSON file under the key 'profile'")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    os.environ.setdefault("WANDB_MODE", "offline")
    with tempfile.TemporaryDirectory(prefix="profile-run-") as tmp:
        out = Path(args.out_dir or tmp)
        result = profile(args, out)
    print(report(result))
    if args.json:
        path = Path(args.json)
        data = json.loads(path.read_text()) if path.exists() else {}
        data["profile" + ("_wandb_setup" if args.wandb_setup else "")] = result
        path.write_text(json.dumps(data, indent=1) + "\n")
    return 0


def profile(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    start = time.time()
    from bench.experiment.compose import sharing_compositions
    from bench.experiment.precheck import check_inputs
    from bench.experiment.spec import cell_config, expand, load_spec

    imports = time.time() - start
    spec = load_spec(SPEC)
    table = expand(spec, "mini", out_dir=str(out))
    cells = [c for c in table if (c.row, c.column, c.seed) == (args.row, args.column, args.seed)]
    if not cells:
        raise SystemExit(f"no cell {args.row} | {args.column} | seed {args.seed} in {SPEC}")
    start = time.time()
    cfg = {**cell_config(cells[0], spec, "mini"), "threads": 1, "cache_dir": str(out / "cache")}
    compose = time.time() - start
    start = time.time()
    with sharing_compositions():  # as bench.experiment.cells composes a table's cells
        for cell in table:
            cell_config(cell, spec, "mini")
    compose_table = (time.time() - start) / len(table)
    start = time.time()
    check_inputs(cells, {cells[0]: cfg})  # what the table does once before launching: the partition is cached
    precheck = time.time() - start
    samples = []
    before = load()
    for repeat in range(args.repeats):
        launched = time.time()
        proc = subprocess.run([sys.executable, __file__, "--child", "--launched", str(launched), "--warm",
                               str(args.warm), "--out-dir", str(out / f"p{repeat}"), "--config", json.dumps(cfg)]
                              + (["--wandb-setup"] if args.wandb_setup else []),
                              cwd=ROOT, capture_output=True, text=True, check=False)
        ended = time.time()
        if proc.returncode:
            raise SystemExit(f"the profiled process failed:\n{proc.stderr[-3000:]}")
        sample = json.loads(proc.stdout.strip().splitlines()[-1])
        sample["process"]["process exit (W&B teardown, interpreter)"] = round(ended - sample.pop("done"), 3)
        samples.append(sample)

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    process = {k: median([s["process"][k] for s in samples]) for k in samples[0]["process"]}
    runs = {}
    for kind, pick in (("fresh", lambda s: s["runs"][:1]), ("warm", lambda s: s["runs"][1:])):
        chosen = [r for s in samples for r in pick(s)]
        runs[kind] = {k: median([r[k] for r in chosen]) for k in ("total", *RUN_PHASES)}
    return {"cell": f"{args.row} | {args.column} | seed {args.seed}", "repeats": args.repeats, "warm": args.warm,
            "load_before": before, "load_after": load(), "table_process": {
                "imports (bench.experiment.spec, precheck)": round(imports,
                                                                   3), "config composition (Hydra), one cell alone":
                round(compose, 3), "config composition, per cell of the whole table (sharing_compositions)":
                round(compose_table, 4), "pre-launch check (data + partition, cached), per distinct partition":
                round(precheck, 3)}, "process": process, "run": runs, "samples": samples}


def report(result: dict[str, Any]) -> str:
    lines = [f"cell {result['cell']}; {result['repeats']} fresh processes x (1 fresh + {result['warm']} warm runs); "
             f"load {result['load_before']} -> {result['load_after']}", "", "| phase | fresh process | warm worker |",
             "|---|---|---|"]
    for name, seconds in result["process"].items():
        lines.append(f"| {name} | {seconds:.2f} | 0 |")
    fresh, warm = result["run"]["fresh"], result["run"]["warm"]
    for name in RUN_PHASES:
        lines.append(f"| {name} | {fresh[name]:.2f} | {warm[name]:.2f} |")
    per_process = sum(result["process"].values())
    lines.append(f"| **run total** (execute) | {fresh['total']:.2f} | {warm['total']:.2f} |")
    lines.append(f"| **run incl. process** | {fresh['total'] + per_process:.2f} | {warm['total']:.2f} |")
    lines += ["", "table process: " + ", ".join(f"{k} {v:.3g} s" for k, v in result["table_process"].items())]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
