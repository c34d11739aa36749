"""How a run grows with the federation: seconds per round and peak memory against the number of clients, the model
size, and where per-client state lives (``client_state.memory_mb``).

Every point is a fresh child process (peak memory, ``ru_maxrss``, never decreases within one), one torch thread,
the engine driven directly (no run directory), times in CPU seconds of that process (the machine may be shared;
wall-clock seconds are recorded too): setup (data, partition, model, ``method.setup``, which builds the
per-client tables), two training rounds without evaluation (the second is reported: seconds per round), then one
round with the evaluation of every client (its evaluation part is reported: seconds per evaluation). The data is the
real Fashion-MNIST with fixed client sizes (``partition=pathological``, 2 classes, 50 training and 10 test images per
client, drawn with overlap as FedCAC's code does), so a round's training is the same work at every federation size
and only what grows with the clients shows.

Sweeps (``--sweeps``, each a list of points below):

- ``clients``: 10 -> 10,000 clients at 10 participants per round; FedAvg (one global model), Local and FedCAC (a
  model per client: their tables grow with the clients), the mini tables' small CNN (38k parameters) on 16 x 16
  images; at 10,000 clients Local and FedCAC again with their tables in files (``client_state.memory_mb``);
- ``model``: 100 clients, 10 per round, Local with the small CNN, ResNet-8 (1.2M) and ResNet-18 (11.2M), tables in
  memory and in files;
- ``fedcac1000``: FedCAC with 1000 clients and ResNet-8 (a 4.9 GB table of personal models), in memory and in
  files under a 512 MB bound.

Writes ``scale.json`` (every point), ``scale.md`` (tables and the machine) and ``scale.png`` / ``.pdf`` (the curves)
into ``--out`` (default ``results/bench``). Usage: ``python scripts/scale.py [--sweeps clients model fedcac1000]
[--out results/bench]``; ``--point '<json>'`` is one child's measurement.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the code of this script's own tree, also when the venv's editable install points at another checkout
sys.path.insert(0, str(ROOT))

#: what every point runs (the federation's shape; the sweeps change clients, participation, model, method, storage)
BASE = ["dataset=fashion_mnist", "partition=pathological", "partition.classes_per_client=2", "partition.n_train=50",
        "partition.n_test=10", "train.epochs=1", "train.batch_size=25", "train.lr=0.05", "cache_dir=null",
        "logger.wandb.mode=disabled", "quiet=true", "seed=0"]
#: the mini tables' small CNN on 16 x 16 images (conf/paper/fedcac/_standin_fmnist.yaml)
SMALL_CNN = ["model=small_cnn", "model.options.channels=[16,32]", "model.options.hidden=64", "dataset.image_size=16"]
MODELS = {"small_cnn": SMALL_CNN, "resnet8": ["model=resnet8", "dataset.image_size=16"],
          "resnet18": ["model=resnet18", "dataset.image_size=16"]}
PARTICIPANTS = 10
#: per-client tables beyond this many MB go to files in the "file" points
FILE_MB = {"clients": 64, "model": 256, "fedcac1000": 512}
TIMEOUT_S = 600


def point(sweep: str, method: str, clients: int, model: str, storage: str) -> dict[str, Any]:
    overrides = [*BASE, *MODELS[model], f"method={method}", f"num_clients={clients}",
                 f"participation={min(1.0, PARTICIPANTS / clients)}"]
    if storage == "file":
        overrides.append(f"client_state.memory_mb={FILE_MB[sweep]}")
    return {"sweep": sweep, "method": method, "clients": clients, "model": model, "storage": storage,
            "overrides": overrides}


def sweep_points(name: str) -> list[dict[str, Any]]:
    if name == "clients":
        points = [point(name, m, n, "small_cnn", "memory") for m in ("fedavg", "local", "fedcac")
                  for n in (10, 100, 1000, 10000)]
        return points + [point(name, m, 10000, "small_cnn", "file") for m in ("local", "fedcac")]
    if name == "model":
        return [point(name, "local", 100, model, storage) for model in MODELS for storage in ("memory", "file")]
    if name == "fedcac1000":
        return [point(name, "fedcac", 1000, "resnet8", storage) for storage in ("memory", "file")]
    raise ValueError(f"--sweeps names no sweep {name!r}; sweeps: clients, model, fedcac1000")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One point, in this (fresh) process."""
    import torch

    from bench.builder import build_experiment
    from bench.experiment.compose import compose_config, to_container
    from bench.experiment.run import configure_torch, validate

    cfg = to_container(compose_config(spec["overrides"]))
    validate(cfg)
    configure_torch(cfg)
    with tempfile.TemporaryDirectory(prefix="pflrepro-scale-") as tables_dir:
        started, cpu = time.perf_counter(), time.process_time()
        experiment = build_experiment(cfg, "cpu", client_dir=tables_dir)
        experiment.method.setup(experiment.fed.worker.read())
        setup = (time.perf_counter() - started, time.process_time() - cpu)
        engine = experiment.engine()
        evaluation = [0.0, 0.0]  # CPU and wall seconds inside the engine's evaluation of clients
        evaluate_client = engine.evaluate_client

        def timed(*args: Any) -> Any:
            cpu, wall = time.process_time(), time.perf_counter()
            out = evaluate_client(*args)
            evaluation[0] += time.process_time() - cpu
            evaluation[1] += time.perf_counter() - wall
            return out

        engine.evaluate_client = timed  # type: ignore[method-assign]
        rounds, cpus = [], []
        for round_ in (1, 2, 3):
            started, cpu = time.perf_counter(), time.process_time()
            engine.round(round_, evaluate=round_ == 3)
            rounds.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
        tables = experiment.fed.tables
        on_disk = sum(t.path.stat().st_size for t in tables.files.values()) if tables else 0
        if tables:
            tables.close()
    state_bytes = sum(v.numel() * v.element_size() for v in experiment.method.state.values() if torch.is_tensor(v))
    return {**{k: v for k, v in spec.items() if k != "overrides"},
            "participants": engine.num_participants, "parameters": experiment.fed.size,
            "setup_s": round(setup[1], 2), "round_s": round(cpus[1], 3),
            "eval_s": round(evaluation[0], 3), "setup_wall_s": round(setup[0], 2),
            "round_wall_s": round(rounds[1], 3), "eval_wall_s": round(evaluation[1], 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "state_mb": round(state_bytes / 2**20, 1), "file_mb": round(on_disk / 2**20, 1),
            "cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1)}


def run_point(spec: dict[str, Any]) -> dict[str, Any]:
    """One point in a child process; a failure or timeout is recorded, not raised."""
    label = f"{spec['sweep']}: {spec['method']} {spec['clients']} clients {spec['model']} {spec['storage']}"
    print(label, flush=True)
    try:
        done = subprocess.run([sys.executable, __file__, "--point", json.dumps(spec)], capture_output=True,
                              text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {TIMEOUT_S} s"}
    if done.returncode != 0:
        return {**spec, "error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {result['round_s']} CPU-s/round, {result['eval_s']} CPU-s/evaluation, {result['peak_rss_mb']} MB peak",
          flush=True)
    return result


# ---------------------------------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[str]:
    out = ["| " + " | ".join(name for name, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(str(row.get(key, "")) if "error" not in row or key in ("method", "clients",
                   "model", "storage") else (row["error"] if key == "round_s" else "") for _, key in columns) + " |")
    return out


COLUMNS = [("method", "method"), ("clients", "clients"), ("participants / round", "participants"),
           ("model", "model"), ("parameters", "parameters"), ("per-client state", "storage"),
           ("setup CPU-s", "setup_s"), ("CPU-s / round", "round_s"), ("CPU-s / evaluation of all clients", "eval_s"),
           ("peak RSS MB", "peak_rss_mb"), ("state tensors MB", "state_mb"), ("table files MB", "file_mb")]


def markdown(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = ["# Scale: seconds per round and peak memory against clients, model size and per-client state", "",
             f"Machine: {meta['machine']}; torch {meta['torch']}, 1 thread per point; command `{meta['command']}` "
             f"({meta['seconds']:.0f} s, {meta['cpu_s']:.0f} CPU-s in all). Each point is a fresh process: setup "
             "(data, partition, model, the method's tables), two training rounds without evaluation (CPU-s / round: "
             "the second), one round with evaluation (CPU-s / evaluation: the time spent evaluating "
             "clients, every client's post and the participants' pre);"
             " peak RSS is the "
             "process's maximum resident memory. Times are CPU seconds of the one-thread process "
             "(`time.process_time`), not wall-clock, since the machine was shared with other work while measuring "
             "(the wall-clock seconds are in `scale.json`; alone on a core the two are about equal). Data: the real "
             "Fashion-MNIST, pathological 2 classes, 50 training "
             "and 10 test images per client at every size, 1 local epoch of batch 25, 10 participants per round "
             "(all of them below 10 clients). 'file': per-client tables beyond `client_state.memory_mb` "
             f"({', '.join(f'{k}: {v} MB' for k, v in FILE_MB.items())}) memory-mapped from files "
             "(`bench.core.client_state`); their records are bit-identical to in-memory ones "
             "(`tests/test_client_state.py`).", ""]
    titles = {"clients": "## Clients (10 per round), small CNN",
              "model": "## Model size: Local, 100 clients, 10 per round",
              "fedcac1000": "## FedCAC, 1000 clients, 10 per round, ResNet-8"}
    for sweep, title in titles.items():
        rows = [r for r in results if r["sweep"] == sweep]
        if rows:
            lines += [title, "", *table(rows, COLUMNS), ""]
    lines += ["![scale](scale.png)", ""]
    return "\n".join(lines)


def figure(results: list[dict[str, Any]], base: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches
    import matplotlib.pyplot as plt

    from bench.experiment.plots import STYLE, save

    ok = [r for r in results if "error" not in r]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.4))
        sweep = [r for r in ok if r["sweep"] == "clients"]
        for method in ("fedavg", "local", "fedcac"):
            for storage, style in (("memory", "-o"), ("file", "s")):
                rows = sorted((r for r in sweep if r["method"] == method and r["storage"] == storage),
                              key=lambda r: r["clients"])
                if not rows:
                    continue
                name = f"{method}" + (" (file tables)" if storage == "file" else "")
                x = [r["clients"] for r in rows]
                axes[0].plot(x, [r["round_s"] for r in rows], style, label=f"{name}: training round")
                if storage == "memory":
                    axes[0].plot(x, [max(r["eval_s"], 1e-3) for r in rows], "--", label=f"{name}: evaluation")
                axes[1].plot(x, [r["peak_rss_mb"] for r in rows], style, label=name)
        for ax, ylabel in ((axes[0], "CPU seconds"), (axes[1], "peak RSS (MB)")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("clients (10 per round)")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=6)
        axes[0].set_title("per training round / per evaluation of all")
        axes[1].set_title("peak memory, small CNN")
        models = [r for r in ok if r["sweep"] in ("model", "fedcac1000")]
        labels = [f"{r['method']} {r['clients']}\n{r['model']}" for r in models]
        axes[2].bar(range(len(models)), [r["peak_rss_mb"] for r in models],
                    color=["#4c72b0" if r["storage"] == "memory" else "#dd8452" for r in models])
        axes[2].set_xticks(range(len(models)), labels, fontsize=6, rotation=60, ha="right")
        axes[2].legend(handles=[matplotlib.patches.Patch(color="#4c72b0", label="tables in memory"),
                                matplotlib.patches.Patch(color="#dd8452", label="tables in files (bounded)")],
                       fontsize=6)
        axes[2].set_ylabel("peak RSS (MB)")
        axes[2].set_title("model size and where per-client state lives")
        fig.tight_layout()
        save(fig, base)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", nargs="+", default=["clients", "model", "fedcac1000"])
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--point", help="measure one point (JSON) in this process and print its result")
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(measure(json.loads(args.point))))
        return 0
    points = [p for name in args.sweeps for p in sweep_points(name)]
    started = time.time()
    results = [run_point(p) for p in points]
    import torch

    from bench.experiment.provenance import cpu_name
    from common.verified_io import atomic_write_json, atomic_write_text

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    meta = {"machine": f"{cpu_name() or platform.processor()}, {platform.platform()}", "torch": torch.__version__,
            "command": "python scripts/scale.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "seconds": time.time() - started, "cpu_s": children.ru_utime + children.ru_stime}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "scale.json", {"meta": meta, "points": results})
    figure(results, out / "scale")
    atomic_write_text(out / "scale.md", markdown(results, meta))
    print(f"wrote {out / 'scale.md'}, {out / 'scale.png'}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
