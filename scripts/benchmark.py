"""Seconds per FedAvg round: our engine vs a naive reference loop, in the same process.

The naive loop is how FL code is commonly written: ``copy.deepcopy`` of the global model and a new
``DataLoader`` per client per round, then a state-dict average. Both train the same model on the same
data with the same optimizer; only the plumbing differs. Peak memory (max RSS) of each is measured in a
fresh child process, since max RSS never decreases within one.

Workloads: ``fedcac`` = 40 clients x 500 samples of 3x32x32, batch 100, 5 local epochs, ResNet-8,
SGD lr 0.1 momentum 0.9 (FedCAC's CIFAR-10 setting, synthetic images); ``small`` = the same federation
shape on 1x8x8 images with the small CNN.

Compiled vs eager (``compile=true``, ``torch.compile`` of the model's body): each workload runs once eager and
once compiled, each in a fresh child process (the compiled one with an empty inductor cache, so its first round
pays the whole compilation, then once more with that cache warm, as a second run of a table would). The first
round trains, evaluates (so the evaluation graph is compiled too) and compiles; the timed rounds after it train
only, as above. To keep ``make bench`` affordable this part uses fewer clients (``--compile-clients``, default
10; seconds per round scale linearly with the clients).

Writes ``bench.json`` (engine vs naive), ``compile.json`` (eager vs compiled), their ``.md`` tables and
``bench.md`` (both tables, with the machine, torch version, threads and command).

Usage: ``python scripts/benchmark.py [--parts naive compile] [--workloads fedcac small] [--rounds 2] [--clients 40]
[--compile-clients 10] [--threads 1] [--out results/bench]``
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from bench.builder import build_experiment, build_worker
from bench.core.data import build_federated_data
from bench.experiment.compose import compose_config, to_container
from bench.experiment.provenance import cpu_name
from common.verified_io import atomic_write_json, atomic_write_text

WORKLOADS = {
    "fedcac": ["model=resnet8", "dataset.options.num_channels=3", "dataset.options.size=32",
               "train.batch_size=100", "train.epochs=5", "train.lr=0.1", "train.momentum=0.9"],
    "small": ["model=small_cnn", "dataset.options.num_channels=1", "dataset.options.size=8",
              "train.batch_size=100", "train.epochs=5", "train.lr=0.1", "train.momentum=0.9"],
}


def workload_config(name: str, clients: int, compile_model: bool = False) -> dict[str, Any]:
    """The resolved run config of workload ``name`` with ``clients`` clients (``compile=true`` if asked)."""
    pool = max(clients, 10)
    overrides = ["dataset=synthetic", "dataset.options.num_classes=10", f"dataset.options.num_train={pool * 500}",
                 f"dataset.options.num_test={pool * 100}", "partition=pathological", "partition.n_train=500",
                 "partition.n_test=100", f"num_clients={clients}", "method=fedavg", "cache_dir=null",
                 "quiet=true", f"compile={str(compile_model).lower()}", *WORKLOADS[name]]
    return to_container(compose_config(overrides))


def engine_times(cfg: dict[str, Any], rounds: int, on_ready: Callable[[], None] = lambda: None,
                 evaluate_first: bool = False, after_round: Callable[[], None] = lambda: None) -> list[float]:
    """Seconds of ``1 + rounds`` rounds of our engine (training + aggregation, no evaluation; with
    ``evaluate_first`` the first round evaluates too), the first round first."""
    experiment = build_experiment(cfg, "cpu")
    engine = experiment.engine()
    experiment.method.setup(experiment.fed.worker.read())
    on_ready()
    times = []
    for t in range(1, rounds + 2):
        start = time.perf_counter()
        engine.round(t, evaluate=evaluate_first and t == 1)
        times.append(time.perf_counter() - start)
        after_round()
    return times


def compile_seconds() -> list[float]:
    """Seconds of each torch.compile compilation in this process so far (Dynamo's own timer of a frame's
    compilation: tracing, AOTAutograd forward and backward, inductor codegen, the C++ compiler, loading)."""
    import torch._dynamo.utils

    return list(getattr(torch._dynamo.utils, "compilation_time_metrics", {}).get("_compile.compile_inner", []))


def engine_rounds(cfg: dict[str, Any], rounds: int, on_ready: Callable[[], None] = lambda: None
                  ) -> list[float]:
    """Seconds per round of our engine (training + aggregation, no evaluation) after a warm-up round."""
    return engine_times(cfg, rounds, on_ready)[1:]


def naive_rounds(cfg: dict[str, Any], rounds: int, on_ready: Callable[[], None] = lambda: None) -> list[float]:
    """Seconds per round of the reference loop: deepcopy + DataLoader per client, state-dict averaging."""
    device = torch.device("cpu")
    data = build_federated_data(cfg["dataset"], cfg["partition"], num_clients=cfg["num_clients"],
                                data_seed=0, device=device)
    global_model = build_worker(cfg, data.num_classes, data.in_channels, data.image_size, device).module
    train = cfg["train"]
    on_ready()
    times = []
    for t in range(rounds + 1):
        start = time.perf_counter()
        states, weights = [], []
        for cid in range(data.num_clients):
            local = copy.deepcopy(global_model)
            idx = data.client(cid).train.cpu()
            loader = DataLoader(TensorDataset(data.images[idx], data.labels[idx]), batch_size=train["batch_size"],
                                shuffle=True, generator=torch.Generator().manual_seed(t * 1000 + cid))
            opt = torch.optim.SGD(local.parameters(), lr=train["lr"], momentum=train["momentum"])
            local.train()
            for _ in range(train["epochs"]):
                for x, y in loader:
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(local(x), y).backward()
                    opt.step()
            states.append(local.state_dict())
            weights.append(len(idx))
        total = sum(weights)
        averaged = {}
        for key, value in states[0].items():
            if value.is_floating_point():
                averaged[key] = sum(s[key] * (w / total) for s, w in zip(states, weights, strict=True))
            else:
                averaged[key] = value
        global_model.load_state_dict(averaged)
        times.append(time.perf_counter() - start)
    return times[1:]


BASELINE: dict[str, float] = {}


def proc_status_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Reset the peak-RSS counter once data and model are built, so the peak covers training only."""
    Path("/proc/self/clear_refs").write_text("5")
    BASELINE["rss"] = proc_status_mb("VmRSS")


def peak_rss_mb(workload: str, variant: str, clients: int) -> tuple[float, float]:
    """(peak RSS, peak above the RSS before training) in MB of a child process running two rounds of ``variant``."""
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--workloads", workload,
                          "--clients", str(clients), "--threads", str(torch.get_num_threads())],
                         capture_output=True, text=True, check=True)
    peak, growth = out.stdout.strip().splitlines()[-1].split()
    return float(peak), float(growth)


def compile_case(workload: str, clients: int, rounds: int, compile_model: bool, cache_dir: Path) -> dict[str, Any]:
    """Round times and compile seconds of one eager or compiled child process (inductor cache in ``cache_dir``)."""
    load = os.getloadavg()[0]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, __file__, "--child", "timing", "--workloads", workload, "--clients",
                          str(clients), "--rounds", str(rounds), "--threads", str(torch.get_num_threads()),
                          *(["--compile"] if compile_model else [])],
                         capture_output=True, text=True, check=True, env=env)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    return {"first_round_s": child["times"][0], "round_s": child["times"][1:], "compile_s": child["compile_s"],
            "graphs_first_round": child["graphs_first_round"], "graphs_later_rounds": child["graphs_later_rounds"],
            "load_before": round(load, 2)}


def compile_row(workload: str, clients: int, rounds: int) -> dict[str, Any]:
    """Eager vs compiled seconds per round of ``workload``; compile seconds cold (empty inductor cache) and warm."""
    with tempfile.TemporaryDirectory(prefix="inductor-") as tmp:
        cache = Path(tmp)
        eager = compile_case(workload, clients, rounds, False, cache)
        cold = compile_case(workload, clients, rounds, True, cache)
        warm = compile_case(workload, clients, 0, True, cache)
    eager_s = statistics.median(eager["round_s"])
    compiled_s = statistics.median(cold["round_s"])
    saving = eager_s - compiled_s
    return {"workload": workload, "clients": clients, "rounds_timed": rounds,
            "eager_s_per_round": round(eager_s, 3), "compiled_s_per_round": round(compiled_s, 3),
            "speedup": round(eager_s / compiled_s, 3),
            "compile_s_cold": round(cold["compile_s"], 1), "compile_s_warm": round(warm["compile_s"], 1),
            "eager_first_round_s": round(eager["first_round_s"], 3),
            "compiled_first_round_cold_s": round(cold["first_round_s"], 3),
            "compiled_first_round_warm_s": round(warm["first_round_s"], 3),
            "break_even_rounds_cold": round(cold["compile_s"] / saving, 1) if saving > 0 else None,
            "break_even_rounds_warm": round(warm["compile_s"] / saving, 1) if saving > 0 else None,
            "graphs_compiled_build_and_first_round": cold["graphs_first_round"],
            "graphs_compiled_later_rounds": cold["graphs_later_rounds"],
            "eager_round_s": [round(x, 3) for x in eager["round_s"]],
            "compiled_round_s": [round(x, 3) for x in cold["round_s"]],
            "load_before": {"eager": eager["load_before"], "compiled_cold": cold["load_before"],
                            "compiled_warm": warm["load_before"]}}


def verdict(row: dict[str, Any]) -> str:
    """One plain sentence: does compile pay for this workload here, after how many rounds, and is the difference
    larger than the spread of the eager rounds themselves."""
    eager, compiled = row["eager_round_s"], row["compiled_round_s"]
    noise = (f" The eager rounds themselves ranged {min(eager)}-{max(eager)} s, so the difference is within this "
             "machine's noise." if min(eager) <= statistics.median(compiled) <= max(eager) else "")
    if row["break_even_rounds_cold"] is None:
        return (f"{row['workload']}: compiled rounds are not faster ({row['compiled_s_per_round']} vs "
                f"{row['eager_s_per_round']} s eager at {row['clients']} clients): compile does not pay on this "
                f"CPU, and costs {row['compile_s_cold']} s of compilation per run ({row['compile_s_warm']} s with a "
                f"warm cache).{noise}")
    gain = f"{(1 - 1 / row['speedup']) * 100:.0f}%"
    full = row["eager_s_per_round"] * 40 / row["clients"]
    return (f"{row['workload']}: compiled rounds take {gain} less time ({row['compiled_s_per_round']} vs "
            f"{row['eager_s_per_round']} s at {row['clients']} clients); compiling costs {row['compile_s_cold']} s "
            f"once per run process ({row['compile_s_warm']} s with a warm inductor cache), so a run is ahead after "
            f"{row['break_even_rounds_cold']} rounds ({row['break_even_rounds_warm']} warm) at {row['clients']} "
            f"clients, {row['break_even_rounds_cold'] * row['clients'] / 40:.1f} "
            f"({row['break_even_rounds_warm'] * row['clients'] / 40:.1f} warm) at 40 clients (~{full:.0f} s/round "
            f"eager).{noise}")


def machine() -> dict[str, Any]:
    """Machine, torch version, threads and load average, for the result files."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "processor": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}


def header(meta: dict[str, Any]) -> list[str]:
    return [f"Machine: {meta['machine']}, {meta['processor']}, {meta['cores']} cores (shared with other jobs; "
            f"1/5/15-min load average at start {meta['load_avg_at_start']}); torch {meta['torch']}, "
            f"{meta['threads']} torch thread(s).", "", f"Command: `{meta['command']}`", ""]


NAIVE_HEAD = ["| workload | clients | engine s/round | naive s/round | naive/engine | engine peak RSS MB "
              "(training above baseline) | naive peak RSS MB (training above baseline) |",
              "|---|---|---|---|---|---|---|"]
COMPILE_HEAD = ["| workload | clients | eager s/round | compiled s/round | eager/compiled | compile s (cold / warm "
                "cache) | break-even rounds (cold / warm) | 1st round s: eager, compiled cold / warm |",
                "|---|---|---|---|---|---|---|---|"]


def naive_table(results: list[dict[str, Any]]) -> list[str]:
    return NAIVE_HEAD + [
        f"| {r['workload']} | {r['clients']} | {r['engine_s_per_round']} | {r['naive_s_per_round']} | "
        f"{r['speedup']} | {r['engine_peak_rss_mb']} (+{r['engine_training_rss_growth_mb']}) | "
        f"{r['naive_peak_rss_mb']} (+{r['naive_training_rss_growth_mb']}) |" for r in results]


def compile_table(results: list[dict[str, Any]]) -> list[str]:
    def never(value: Any) -> Any:
        return "never" if value is None else value

    return COMPILE_HEAD + [
        f"| {r['workload']} | {r['clients']} | {r['eager_s_per_round']} | {r['compiled_s_per_round']} | "
        f"{r['speedup']} | {r['compile_s_cold']} / {r['compile_s_warm']} | {never(r['break_even_rounds_cold'])} / "
        f"{never(r['break_even_rounds_warm'])} | {r['eager_first_round_s']}, {r['compiled_first_round_cold_s']} / "
        f"{r['compiled_first_round_warm_s']} |" for r in results]


NAIVE_NOTE = ("Seconds per FedAvg round (training + aggregation, no evaluation; median of the timed rounds after "
              "one warm-up round) of our engine and of a naive loop (deepcopy + DataLoader per client, state-dict "
              "averaging), in one process; peak RSS from a fresh child process each.")
COMPILE_NOTE = ("Eager vs `compile=true` (torch.compile of the model's body, inductor on CPU), each in a fresh "
                "child process, with **fewer clients than above** to keep `make bench` affordable (time per round "
                "is linear in the clients, the compile time is not). s/round: median of the timed rounds (training "
                "+ aggregation) after the first round, which is excluded: it trains, evaluates every client and "
                "compiles the training and the evaluation graphs. Compile s: Dynamo's own timer of the "
                "compilations in the run process (tracing, AOTAutograd, inductor codegen, gcc, loading), with an "
                "empty inductor cache (cold: the first run of a model on a machine) and with the cache the cold run "
                "left (warm: every later run process, e.g. the other cells of a table). Break-even = compile s / "
                "(eager - compiled s/round): the rounds after which a compiled run is ahead; `never` = compiled "
                "rounds are not faster. Graphs compiled: 3 by the end of the first round (the model check on 2 "
                "images while building, training, evaluation; `graphs_compiled_build_and_first_round` in "
                "compile.json), none in the timed rounds (`graphs_compiled_later_rounds`). The model check makes "
                "Dynamo compile the batch dimension as dynamic: see docs/performance.md.")


def write_bench_md(out: Path) -> None:
    """``bench.md``: both tables from ``bench.json`` and ``compile.json`` (whichever exist)."""
    lines = ["# `make bench`: seconds per FedAvg round", ""]
    for name, title, note, table in (("bench.json", "Engine vs naive loop", NAIVE_NOTE, naive_table),
                                     ("compile.json", "Eager vs compiled (`compile=true`)", COMPILE_NOTE,
                                      compile_table)):
        if (out / name).exists():
            meta = json.loads((out / name).read_text())
            lines += [f"## {title}", "", note, "", *header(meta), *table(meta["results"]), ""]
            lines += [f"- {v}" for v in meta.get("verdicts", [])] + ([""] if meta.get("verdicts") else [])
    lines += ["Details: [compile.md](compile.md); threads under load: [load.md](load.md); "
              "[docs/performance.md](../../docs/performance.md).", ""]
    atomic_write_text(out / "bench.md", "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["naive", "compile"], choices=["naive", "compile"],
                        help="naive: engine vs naive loop (bench.json); compile: eager vs compiled (compile.json)")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds after the first (warm-up) round")
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--compile-clients", type=int, default=10, help="clients of the eager vs compiled runs")
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (never torch's default: see README)")
    parser.add_argument("--child", choices=["engine", "naive", "timing"], help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child == "timing":
        cfg = workload_config(args.workloads[0], args.clients, args.compile)
        compiles: list[list[float]] = []
        times = engine_times(cfg, args.rounds, evaluate_first=True,
                             after_round=lambda: compiles.append(list(compile_seconds())))
        print(json.dumps({"times": times, "compile_s": sum(compiles[-1]), "graphs_first_round": len(compiles[0]),
                          "graphs_later_rounds": len(compiles[-1]) - len(compiles[0])}))
        return
    if args.child:
        cfg = workload_config(args.workloads[0], args.clients)
        (engine_rounds if args.child == "engine" else naive_rounds)(cfg, 1, on_ready=reset_peak)
        print(proc_status_mb("VmHWM"), proc_status_mb("VmHWM") - BASELINE["rss"])
        return
    out = Path(args.out)
    command = shlex.join(["python", "scripts/benchmark.py", *sys.argv[1:]])
    if "naive" in args.parts:
        run_naive(args, out, command)
    if "compile" in args.parts:
        run_compile(args, out, command)
    write_bench_md(out)
    print((out / "bench.md").read_text())


def run_compile(args: argparse.Namespace, out: Path, command: str) -> None:
    meta = {**machine(), "command": command, "rounds_timed": args.rounds}
    results = []
    for name in args.workloads:
        row = compile_row(name, args.compile_clients, args.rounds)
        results.append(row)
        print(json.dumps(row), flush=True)
    meta.update(results=results, verdicts=[verdict(r) for r in results])
    atomic_write_json(out / "compile.json", meta)
    lines = ["# Eager vs compiled (`compile=true`) seconds per FedAvg round", "", COMPILE_NOTE, "", *header(meta),
             *compile_table(results), "", *[f"- {v}" for v in meta["verdicts"]], "",
             "Per-round seconds, load average before each case and the workloads' settings: "
             "[compile.json](compile.json), `scripts/benchmark.py`.", ""]
    atomic_write_text(out / "compile.md", "\n".join(lines))


def run_naive(args: argparse.Namespace, out: Path, command: str) -> None:
    meta = {**machine(), "command": command}
    results = []
    for name in args.workloads:
        cfg = workload_config(name, args.clients)
        ours = statistics.median(engine_rounds(cfg, args.rounds))
        naive = statistics.median(naive_rounds(cfg, args.rounds))
        engine_peak, engine_growth = peak_rss_mb(name, "engine", args.clients)
        naive_peak, naive_growth = peak_rss_mb(name, "naive", args.clients)
        row = {"workload": name, "clients": args.clients, "engine_s_per_round": round(ours, 3),
               "naive_s_per_round": round(naive, 3), "speedup": round(naive / ours, 3),
               "engine_peak_rss_mb": round(engine_peak, 1), "engine_training_rss_growth_mb": round(engine_growth, 1),
               "naive_peak_rss_mb": round(naive_peak, 1), "naive_training_rss_growth_mb": round(naive_growth, 1)}
        results.append(row)
        print(json.dumps(row), flush=True)
    meta.update(rounds_timed=args.rounds, results=results)
    atomic_write_json(out / "bench.json", meta)


if __name__ == "__main__":
    main()
