"""Seconds per run, ours against PFLlib's own code, on the same split, model, optimiser and machine.

    python scripts/bench_pfllib.py /path/to/PFLlib [--methods fedavg fedcac] [--repeats 2]
                                   [--our-eval-stages default post workload] [--rounds 10]
                                   [--pfllib-python /tmp/pfllib-venv/bin/python] [--out results/bench/pfllib.md]
    python scripts/bench_pfllib.py --ours-only --our-eval-stages default post --rounds 3 --repeats 2 --out ...

The workload: Fashion-MNIST, 20 clients (our Dirichlet split, alpha 0.1, 500 training and 100 test images per
client), PFLlib's 582k-parameter FedAvgCNN (ours: ``model=cnn_fedavg``), SGD lr 0.01, batch 50, one local epoch,
10 rounds of local training, every client every round, one thread, on the CPU. Each side runs as a whole process
(start-up, data, training, evaluation, records), timed from outside; the sides alternate, ``--repeats`` times.

Our split goes to PFLlib as its own data format: ``python -m bench.experiment.partition export`` writes the first run's
partition (indices into the official splits), and this script writes each client's images and labels, as our pool
holds them (float32 in [0, 1], 1 x 28 x 28), to ``<PFLlib>/dataset/FMNIST-pflrepro/{train,test}/<client>.npz``.
PFLlib's ``main.py`` runs unchanged from ``<PFLlib>/system`` with ``torch.set_num_threads(1)`` set before it starts.
Their code is not part of this repository; the report names the commit it ran.

Per round PFLlib evaluates before training (``-gr R`` trains R + 1 rounds), so it runs with ``-gr 9``: 10 rounds
of local training like ours, its last evaluation after 9 of them. Evaluation work differs by design: PFLlib
evaluates every client's test data and makes a forward pass over every client's training data per round; we
evaluate every client's test data after local training and after aggregation (``pre`` and ``post``). With
``--our-eval-stages default post`` our side also runs with ``eval.stages=[post]`` (after aggregation only: one
evaluation of every client's test data per round, PFLlib's count), each of our modes in turn before PFLlib's run,
and the report shows every mode against PFLlib. ``workload`` is PFLlib's work and no more: ``eval.stages=[post]``
and ``logger.wandb.mode=disabled`` (PFLlib writes no W&B run; W&B is not part of a run's identity, so the records
are those of ``post``). ``--ours-only`` runs only our modes (no PFLlib checkout needed), to measure what a mode
saves.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DATASET = "FMNIST-pflrepro"  # PFLlib picks FedAvgCNN's 1024 input features for names containing "MNIST"
ROUNDS, CLIENTS, LR, BATCH, EPOCHS = 10, 20, 0.01, 50, 1
OURS = ["dataset=fashion_mnist", "model=cnn_fedavg", "partition=dirichlet", f"num_clients={CLIENTS}",
        f"rounds={ROUNDS}", f"train.lr={LR}", f"train.batch_size={BATCH}", f"train.epochs={EPOCHS}", "seed=0",
        "threads=1", "quiet=true"]
#: our evaluation modes (``--our-eval-stages``): the overrides, the key of their runs in the report's data and what
#: they evaluate per round
OUR_MODES = {
    "default": ([], "ours", "ours", "2 evaluations per round: every client's test data after local training (pre) and "
                "after aggregation (post), the method's own stages"),
    "post": (["eval.stages=[post]"], "ours_post", "ours, eval.stages=[post]", "1 evaluation per round: every "
             "client's test data after aggregation (post) only"),
    "workload": (["eval.stages=[post]", "logger.wandb.mode=disabled"], "ours_workload",
                 "ours, PFLlib's workload (eval.stages=[post], W&B disabled)", "1 evaluation per round: every "
                 "client's test data after aggregation (post) only, and no W&B run (PFLlib logs to none)"),
}
THEIR_EVALUATION = ("1 evaluation per round: every client's test data before the round's training, plus a forward "
                    "pass over every client's training data for its train loss")
#: each method as ours names it (with its hyperparameters) and as PFLlib's main.py does (same values)
METHODS = {
    "fedavg": (["method=fedavg"], ["-algo", "FedAvg"]),
    "fedcac": (["method=fedcac", "method.tau=0.5", "method.beta=100"],
               ["-algo", "FedCAC", "-tau", "0.5", "-bt", "100"]),
}
THEIRS = ["-data", DATASET, "-ncl", "10", "-m", "CNN", "-dev", "cpu", "-nc", str(CLIENTS), "-jr", "1",
          "-lbs", str(BATCH), "-lr", str(LR), "-ls", str(EPOCHS), "-gr", str(ROUNDS - 1), "-eg", "1", "-t", "1"]


def with_rounds(args: list[str], rounds: int) -> list[str]:
    """Our (``rounds=``) or PFLlib's (``-gr``, one less) arguments for ``rounds`` rounds of local training."""
    if "-gr" in args:
        at = args.index("-gr") + 1
        return [*args[:at], str(rounds - 1), *args[at + 1:]]
    return [f"rounds={rounds}" if a.startswith("rounds=") else a for a in args]
#: runs PFLlib's main.py as ``python main.py ...`` would, with one torch thread
WRAP = ("import runpy, sys, torch; torch.set_num_threads(1); sys.argv = ['main.py'] + sys.argv[1:]; "
        "runpy.run_path('main.py', run_name='__main__')")
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: what :func:`timed` measures of each run
TIMES = ("wall", "cpu", "load")


def timed(cmd: list[str], cwd: Path, log: Path) -> dict[str, Any]:
    """Run ``cmd`` to completion; its wall-clock and CPU seconds (user + system of it and its children) and the
    1-minute load average when it started."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **ONE_THREAD})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed with status {proc.returncode}; see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "load": load}


def our_command(method: str, mode: str, rounds: int, out_dir: Path, cache: Path) -> list[str]:
    """Our run of ``method`` in evaluation ``mode`` (:data:`OUR_MODES`) for ``rounds`` rounds."""
    return [sys.executable, "-m", "bench.experiment.run", *with_rounds(OURS, rounds), *METHODS[method][0],
            *OUR_MODES[mode][0], f"out_dir={out_dir}", f"cache_dir={cache}"]


def run_ours(method: str, mode: str, rounds: int, out_dir: Path, cache: Path, log: Path
             ) -> tuple[dict[str, Any], Path]:
    cmd = our_command(method, mode, rounds, out_dir, cache)
    times = timed(cmd, ROOT, log)
    (run_dir,) = [p.parent for p in out_dir.rglob("summary.json")]
    return times, run_dir


def our_accuracies(run_dir: Path, rounds: int = ROUNDS) -> dict[str, float]:
    """Mean test accuracy over clients (each holds 100 test images, so weighted = unweighted) per stage at the last
    two rounds."""
    out = {}
    for line in (run_dir / "rounds.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "eval" and rec["split"] == "test" and rec["round"] in (rounds - 1, rounds):
            out[f"{rec['stage']} r{rec['round']}"] = statistics.fmean(rec["acc"])
    return out


def export_split(run_dir: Path, pfllib: Path, work: Path) -> dict[str, int]:
    """Write the run's split in PFLlib's format (one ``{"data": {"x", "y"}}`` npz per client and split)."""
    import numpy as np

    from bench.core.data import load_sources
    from bench.experiment.partition import export, load_run_config

    path = export(run_dir, work / "partition.json", "json")
    clients = json.loads(path.read_text())["clients"]
    conf = load_run_config(run_dir)
    train, test = load_sources(conf["dataset"], conf.get("data_root"))
    images = {"train": train[0].images.numpy(), "test": test[0].images.numpy()}
    labels = {"train": train[0].labels.numpy(), "test": test[0].labels.numpy()}
    root = pfllib / "dataset" / DATASET
    shutil.rmtree(root, ignore_errors=True)
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        for cid, client in enumerate(clients):
            idx = np.asarray(client[split], dtype=np.int64)
            data = {"x": images[split][idx].astype(np.float32), "y": labels[split][idx].astype(np.int64)}
            np.savez_compressed(root / split / f"{cid}.npz", data=data)
    return {split: sum(len(c[split]) for c in clients) for split in ("train", "test")}


def their_accuracy(log: Path) -> float:
    found = re.findall(r"Averaged Test Accuracy: ([0-9.]+)", log.read_text())
    if not found:
        raise SystemExit(f"no test accuracy in {log}")
    return 100 * float(found[-1])


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def sides_of(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, label, what it evaluates per round) of each side measured in a method's results: our modes in
    :data:`OUR_MODES` order, then PFLlib."""
    ours = [(key, label, what) for _, key, label, what in OUR_MODES.values() if key in r]
    return ours + ([("theirs", "PFLlib", THEIR_EVALUATION)] if "theirs" in r else [])


def ratio_rows(r: dict[str, Any]) -> list[str]:
    """PFLlib's median seconds over each of our modes'; without PFLlib, our first mode's over each other's."""
    sides = sides_of(r)
    ours = [s for s in sides if s[0] != "theirs"]
    base, others = (sides[-1], ours) if sides[-1][0] == "theirs" else (ours[0], ours[1:])
    rows = []
    for key, label, _ in others:
        wall = median(r[base[0]]["wall"]) / median(r[key]["wall"])
        cpu = median(r[base[0]]["cpu"]) / median(r[key]["cpu"])
        rows.append(f"| {base[1]} / {label} | | **{wall:.2f}x** | | **{cpu:.2f}x** | |")
    return rows


def report(results: dict[str, Any], meta: dict[str, Any]) -> str:
    rounds = int(meta.get("rounds", ROUNDS))
    ours_only = not any("theirs" in r for r in results.values())
    modes = [m for m in OUR_MODES if any(OUR_MODES[m][1] in r for r in results.values())]
    lines = ["# Seconds per run: ours vs PFLlib" if not ours_only else "# Seconds per run: our evaluation modes", "",
             "Written by `python scripts/bench_pfllib.py` (command below); PFLlib's code is not in this repository.",
             "", f"- command: `{meta['command']}`"]
    if not ours_only:
        lines.append(f"- PFLlib: {meta['pfllib_url']} at commit `{meta['pfllib_commit']}`, `system/main.py` unchanged, "
                     f"run by `{meta['pfllib_python']}` with `torch.set_num_threads(1)`")
    lines += [f"- ours: commit `{meta['our_commit']}`{' (with uncommitted changes)' if meta['dirty'] else ''}",
              f"- machine: {meta['cpu']}, {meta['cores']} cores, torch {meta['torch']}; load average "
              f"{meta['load_before']} before, {meta['load_after']} after (a shared machine: wall-clock seconds "
              "include waiting for a core; CPU seconds do not)",
              f"- CPU kernels (both sides run in this environment): {meta.get('kernels', 'not recorded')}"]
    if not ours_only:
        lines.append(f"- data: Fashion-MNIST, our Dirichlet split (alpha 0.1, data seed 0), {CLIENTS} clients, "
                     f"{meta['split_sizes']['train']} training and {meta['split_sizes']['test']} test images in all "
                     "(500 and 100 per client), exported with `bench.experiment.partition export` and written in "
                     "PFLlib's format")
    lines += [f"- training: FedAvgCNN (582,026 parameters), SGD lr {LR}, batch {BATCH}, {EPOCHS} local epoch, "
              f"{rounds} rounds of local training, every client every round, 1 thread (`OMP_NUM_THREADS=1`), CPU",
              f"- ours: `python -m bench.experiment.run {' '.join(with_rounds(OURS, rounds))} <method>` (W&B offline, "
              "as by default)" + "".join(f"; {OUR_MODES[m][2]}: adds `{' '.join(OUR_MODES[m][0])}`"
                                         for m in modes if OUR_MODES[m][0])]
    if not ours_only:
        lines.append(f"- PFLlib: `python main.py {' '.join(with_rounds(THEIRS, rounds))} <method>` "
                     f"(`-gr {rounds - 1}`: it trains R + 1 rounds, evaluating before each, so its last evaluation "
                     f"follows {rounds - 1} rounds of training)")
    evaluations = [f"{OUR_MODES[m][2]}: {OUR_MODES[m][3]}" for m in modes]
    lines.append("- evaluation per round: " + "; ".join(evaluations + ([] if ours_only else
                                                                       [f"PFLlib: {THEIR_EVALUATION}"])))
    lines += [f"- each {'mode' if ours_only else 'side'} {meta['repeats']} times, in turn; whole process timed from "
              "outside", ""]
    for method, r in results.items():
        sides = sides_of(r)
        lines += [f"## {method} ({' '.join(METHODS[method][0])}" + ("" if ours_only else
                                                                    f" / {' '.join(METHODS[method][1])}") + ")", "",
                  "| | wall s (each run) | median wall s | CPU s (each run) | median CPU s | load average at "
                  "each start |",
                  "|---|---|---|---|---|---|",
                  *(f"| {label} | {' / '.join(f'{x:.1f}' for x in r[key]['wall'])} | {median(r[key]['wall']):.1f} | "
                    f"{' / '.join(f'{x:.1f}' for x in r[key]['cpu'])} | {median(r[key]['cpu']):.1f} | "
                    f"{' / '.join(f'{x:.1f}' for x in r[key].get('load', [])) or 'not recorded'} |"
                    for key, label, _ in sides),
                  *ratio_rows(r), ""]
        accuracies = [f"{label} " + ", ".join(f"{k} {v:.2f}" for k, v in r[f"{key}_acc"].items())
                      for key, label, _ in sides if key != "theirs" and r.get(f"{key}_acc")]
        if not ours_only:
            accuracies.append(f"PFLlib at its last evaluation (after {rounds - 1} rounds) {r['theirs_acc']:.2f}")
        if accuracies:
            lines += ["Test accuracy (mean over clients, %): " + "; ".join(accuracies) + "."
                      + ("" if ours_only else " The two sides draw different initial weights and batches, so "
                         "accuracies agree only roughly."), ""]
    return "\n".join(lines)


def merge_results(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The methods of several invocations' reports; the runs of a method's side (one of our modes, or PFLlib)
    measured by more than one are pooled (accuracies: the first invocation's)."""
    merged: dict[str, Any] = {}
    for part in parts:
        for method, r in part["results"].items():
            if method not in merged:
                merged[method] = json.loads(json.dumps(r))
                continue
            for key, _, _ in sides_of(r):
                if key not in merged[method]:
                    merged[method][key] = json.loads(json.dumps(r[key]))
                    if f"{key}_acc" in r:
                        merged[method][f"{key}_acc"] = r[f"{key}_acc"]
                    continue
                for k in TIMES:
                    if k in r[key]:  # load averages: not in reports written before they were recorded
                        merged[method][key].setdefault(k, []).extend(r[key][k])
    return merged


def git(args: list[str], cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pfllib", type=Path, nargs="?",
                        help="a checkout of github.com/TsingZ0/PFLlib (holds system/main.py)")
    parser.add_argument("--merge", type=Path, nargs="+",
                        help="write the report from the .json files of earlier invocations (e.g. one method or one "
                             "repeat each, run side by side to save time; a method's runs are pooled) instead of "
                             "running anything")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--our-eval-stages", nargs="+", default=["default"], choices=list(OUR_MODES),
                        help="our evaluation modes, each run in turn before PFLlib's run: default = the method's "
                             "stages (pre and post, 2 evaluations per round); post = eval.stages=[post] (1 per "
                             "round, PFLlib's count)")
    parser.add_argument("--ours-only", action="store_true",
                        help="run only our modes (no PFLlib checkout): what a mode saves")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of local training on each side")
    parser.add_argument("--pfllib-python", default=sys.executable,
                        help="the Python that runs PFLlib (it needs h5py, scikit-learn, torchvision)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "pfllib.md")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds {args.rounds} is too few: PFLlib evaluates after R - 1 rounds; give 2 or more")
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        meta = dict(parts[0]["meta"])
        meta["command"] = " ; ".join(p["meta"]["command"] for p in parts) + " (side by side), then --merge"
        meta["load_before"] = " / ".join(p["meta"]["load_before"] for p in parts)
        meta["load_after"] = " / ".join(p["meta"]["load_after"] for p in parts)
        meta["repeats"] = " + ".join(str(p["meta"]["repeats"]) for p in parts)
        write(args, merge_results(parts), meta)
        print(f"wrote {args.out}")
        return
    pfllib = None
    if not args.ours_only:
        if args.pfllib is None:
            parser.error("give a PFLlib checkout (or --ours-only, or --merge)")
        pfllib = args.pfllib.resolve()
        if not (pfllib / "system" / "main.py").is_file():
            raise SystemExit(f"{pfllib} is not a PFLlib checkout: it has no system/main.py")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_pfllib_"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    split_sizes: dict[str, int] = {}
    for method in args.methods:
        keys = [OUR_MODES[m][1] for m in args.our_eval_stages] + ([] if pfllib is None else ["theirs"])
        r: dict[str, Any] = {key: {k: [] for k in TIMES} for key in keys}
        for rep in range(args.repeats):
            done = []
            for mode in args.our_eval_stages:
                key = OUR_MODES[mode][1]
                name = f"{key}-{method}-{rep}"
                times, run_dir = run_ours(method, mode, args.rounds, work / name, cache, work / f"{name}.log")
                for k in TIMES:
                    r[key][k].append(times[k])
                r[f"{key}_acc"] = our_accuracies(run_dir, args.rounds)
                done.append(f"{OUR_MODES[mode][2]} {times['cpu']:.1f} CPU s")
                if pfllib is not None and not split_sizes:
                    split_sizes = export_split(run_dir, pfllib, work)
            if pfllib is not None:
                log = work / f"pfllib-{method}-{rep}.log"
                times = timed([args.pfllib_python, "-c", WRAP, *with_rounds(THEIRS, args.rounds),
                               *METHODS[method][1]], pfllib / "system", log)
                for k in TIMES:
                    r["theirs"][k].append(times[k])
                r["theirs_acc"] = their_accuracy(log)
                done.append(f"PFLlib {times['cpu']:.1f} CPU s")
            print(f"{method} repeat {rep}: " + ", ".join(done), flush=True)
        results[method] = r
        write(args, results, meta_of(args, pfllib, load_before, split_sizes))  # after each method: a partial report
    print(f"wrote {args.out}")


def meta_of(args: argparse.Namespace, pfllib: Path | None, load_before: tuple[float, ...],
            split_sizes: dict[str, int]) -> dict[str, Any]:
    import torch

    options = [f"--methods {' '.join(args.methods)}", f"--repeats {args.repeats}"]
    if args.our_eval_stages != ["default"]:
        options.append(f"--our-eval-stages {' '.join(args.our_eval_stages)}")
    if args.rounds != ROUNDS:
        options.append(f"--rounds {args.rounds}")
    theirs = {} if pfllib is None else {
        "pfllib_url": "https://github.com/TsingZ0/PFLlib", "pfllib_commit": git(["rev-parse", "HEAD"], pfllib),
        "pfllib_python": args.pfllib_python}
    return {"command": "python scripts/bench_pfllib.py " + ("--ours-only " if pfllib is None else
                                                            "<PFLlib checkout> ") + " ".join(options),
            **theirs, "our_commit": git(["rev-parse", "HEAD"], ROOT),
            "dirty": bool(git(["status", "--porcelain", "--untracked-files=no"], ROOT)),
            "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith("model name")), platform.processor()),
            "cores": os.cpu_count(), "torch": torch.__version__, "repeats": args.repeats, "rounds": args.rounds,
            "load_before": " ".join(f"{x:.1f}" for x in load_before),
            "load_after": " ".join(f"{x:.1f}" for x in os.getloadavg()), "split_sizes": split_sizes,
            "kernels": kernel_setting(torch.backends.cpu.get_cpu_capability(), os.environ)}


KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def kernel_setting(capability: str, env: Mapping[str, str]) -> str:
    """The instruction set torch's CPU kernels use and the environment caps that choose it: they move both sides'
    seconds (AVX2 trains ~1.5x slower than AVX-512 here) and so the ratio."""
    caps = [f"{k}={env[k]}" for k in KERNEL_CAPS if k in env]
    return f"torch CPU capability {capability}; " + (", ".join(caps) if caps else "no caps set (the defaults)")


def write(args: argparse.Namespace, results: dict[str, Any], meta: dict[str, Any]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(results, meta) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
