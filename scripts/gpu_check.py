"""The GPU checks of ``scripts/gpu_check.sh``, one part per subcommand; each part writes its JSON to ``--out`` as it
goes (a part cut short by its time limit keeps what it finished), and ``report`` gathers them into one table.

    python scripts/gpu_check.py env --out DIR           the machine: GPU, driver, torch, CPU
    python scripts/gpu_check.py cuda-runs --out DIR     (a) short runs of the engine, one method per family
    python scripts/gpu_check.py round-time --out DIR    (b) FedCAC's paper round, clients in turn vs together
    python scripts/gpu_check.py concurrency --out DIR   (c) runs per GPU: 1, 2, 4, 8 processes of one run at once
    python scripts/gpu_check.py report --out DIR        gpu_check.md + gpu_check.json from the parts

``GPU_CHECK_DEVICE`` (default cuda) and ``GPU_CHECK_SCALE`` (``paper``, default, or ``tiny``: small sizes that let
the whole script run on a CPU in a minute, to check the script itself) choose where and how big.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")
TINY = os.environ.get("GPU_CHECK_SCALE", "paper") == "tiny"
WORK = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check_work"))

#: (a) one method per family, each on digits for 2 rounds; ``batched`` rows train the clients together
FAMILIES: list[tuple[str, str, list[str]]] = [
    ("FedAvg", "global model", ["method=fedavg"]),
    ("FedAvg batched", "global model, clients trained together", ["method=fedavg", "train.batched_clients=true"]),
    ("FedCAC", "per-client model", ["method=fedcac", "model.options.norm=bn"]),
    ("FedCAC batched", "per-client model, clients trained together",
     ["method=fedcac", "model.options.norm=bn", "train.batched_clients=true"]),
    ("FedRep", "partial personalization", ["method=fedrep", "method.head_epochs=1"]),
    ("Ditto", "two models per client", ["method=ditto"]),
    ("HeteroFL", "capacity-heterogeneous", ["method=heterofl", "capacity.setting=hetero", "model.options.norm=bn"]),
    ("Pa3dFL", "decomposed layers + hypernetwork", ["method=pa3dfl", "capacity.setting=hetero",
                                                    "partition.val_fraction=0.2"]),
    ("FedSelect", "masks grown by GradLTN", ["method=fedselect", "method.ltn_iters=1", "method.ltn_epochs=1",
                                             "method.alt_epochs=1"]),
    ("FedC2I", "influence-weighted mixing (Adam)", ["method=fedc2i", "train.optimizer=adam", "train.lr=0.001"]),
]
RUN_BASE = ["dataset=digits", "model=small_cnn", "num_clients=10", "rounds=2", "train.epochs=1", "train.batch_size=20",
            "train.lr=0.05", "logger.wandb.mode=disabled", "quiet=true", "cache_dir=null", "eval.chance_z=null"]

#: (c) the run several copies of which share the GPU: FedAvg, ResNet-8 on CIFAR-10-shaped synthetic images
CONCURRENT_RUN = (["method=fedavg", "dataset=synthetic", "dataset.options.num_classes=4",
                   "dataset.options.num_train=2000", "partition=iid", "model=small_cnn", "num_clients=4", "rounds=2",
                   "train.batch_size=20"] if TINY else
                  ["method=fedavg", "dataset=synthetic", "dataset.options.num_channels=3", "dataset.options.size=32",
                   "dataset.options.num_classes=10", "dataset.options.num_train=12000", "partition=dirichlet",
                   "partition.alpha=0.1", "partition.n_train=500", "partition.n_test=100", "model=resnet8",
                   "num_clients=20", "rounds=6", "train.batch_size=50", "train.epochs=1", "train.lr=0.05"])
CONCURRENCY = [1, 2, 4] if TINY else [1, 2, 4, 8]


def write(out: Path, name: str, data: Any) -> None:
    (out / name).write_text(json.dumps(data, indent=1, default=str) + "\n")


def env(out: Path) -> None:
    import torch

    from scripts.batched_clients import cpu_name

    info: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_name(),
                            "cpus": os.cpu_count(), "device": DEVICE, "scale": "tiny" if TINY else "paper",
                            "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False)
        info["nvidia_smi"] = smi.stdout.strip()
    write(out, "part_env.json", info)
    print(json.dumps(info))


def cuda_runs(out: Path) -> None:
    """(a): every family's run for 2 rounds on ``DEVICE`` through ``bench.experiment.run.execute`` (validation, records,
    summary), one process; a failing method is recorded with its error and the next one runs."""
    import torch

    from bench.experiment.compose import compose_config
    from bench.experiment.run import execute

    rows: list[dict[str, Any]] = []
    for name, family, overrides in FAMILIES:
        run_dir = WORK / "cuda_runs" / name.replace(" ", "_")
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg = compose_config([*RUN_BASE, *overrides, f"device={DEVICE}", f"run_dir={run_dir}"])
        start = time.perf_counter()
        row: dict[str, Any] = {"method": name, "family": family, "overrides": overrides}
        try:
            summary = execute(cfg)
            if DEVICE.startswith("cuda"):
                torch.cuda.synchronize()
            row.update(ok=True, primary_acc=round(summary["primary"]["acc"], 2),
                       peak_gpu_mib=round(torch.cuda.max_memory_allocated() / 2**20) if DEVICE.startswith("cuda")
                       else None)
        except Exception as err:  # one method failing must not lose the others
            row.update(ok=False, error=f"{type(err).__name__}: {err}"[:400], trace=traceback.format_exc()[-1500:])
        row["seconds"] = round(time.perf_counter() - start, 2)
        if DEVICE.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        rows.append(row)
        write(out, "part_a.json", rows)
        print(json.dumps({k: v for k, v in row.items() if k != "trace"}), flush=True)


def round_time(out: Path) -> None:
    """(b): FedCAC's paper workload (``scripts/batched_clients.py --workload fedcac``) with 40 clients."""
    import torch

    from scripts.batched_clients import measure

    if DEVICE.startswith("cuda"):
        torch.backends.cudnn.deterministic = True  # as bench.experiment.run configures a CUDA run
        torch.backends.cudnn.benchmark = False
    workload, clients, rounds = ("tiny", 4, 1) if TINY else ("fedcac", 40, 3)
    def progress(row: dict[str, Any]) -> None:
        if DEVICE.startswith("cuda"):
            row["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
        write(out, "part_b.json", [row])
        print(json.dumps(row), flush=True)

    measure(workload, clients, rounds, DEVICE, [], progress)


def concurrency(out: Path) -> None:
    """(c): N copies of one run (``python -m bench.experiment.run``, each its own process and run directory) started at
    once, for N in ``CONCURRENCY``: the wall-clock until all finished, runs per hour, and each run's own time."""
    rows: list[dict[str, Any]] = []
    for n in CONCURRENCY:
        base = WORK / "concurrency" / f"n{n}"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-m", "bench.experiment.run", *CONCURRENT_RUN, f"device={DEVICE}",
                                   "logger.wandb.mode=disabled", "quiet=true", "cache_dir=null", "eval.every=1000",
                                   f"run_dir={base / f'run{i}'}"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for i in range(n)]
        outputs = [p.communicate()[0] for p in procs]
        wall = time.perf_counter() - start
        own = []
        for i in range(n):
            timing = base / f"run{i}" / "timing.json"
            if timing.exists():
                own.append(json.loads(timing.read_text())["wall_seconds"])
        failed = [o[-600:] for p, o in zip(procs, outputs, strict=True) if p.returncode != 0]
        row = {"runs_at_once": n, "wall_s": round(wall, 2), "runs_per_hour": round(3600 * n / wall, 1),
               "run_own_s_median": round(statistics.median(own), 2) if own else None, "failed": len(failed),
               "errors": failed[:2]}
        rows.append(row)
        write(out, "part_c.json", rows)
        print(json.dumps(row), flush=True)


def report(out: Path) -> None:
    def load(name: str) -> Any:
        path = out / name
        return json.loads(path.read_text()) if path.exists() else None

    env_info, a, b, c = (load(f"part_{p}.json") for p in ("env", "a", "b", "c"))
    device = (env_info or {}).get("gpu") or (env_info or {}).get("cpu") or DEVICE
    lines = [f"# GPU check on {device}", ""]
    if env_info:
        lines += ["Machine: " + ", ".join(f"{k} {v}" for k, v in env_info.items()), ""]
    lines += ["## (a) CUDA runs of the engine, one method per family (digits, 10 clients, 2 rounds)", ""]
    if a:
        lines += ["| method | family | ok | primary acc | seconds | peak GPU MiB | error |",
                  "|---|---|---|---:|---:|---:|---|"]
        for r in a:
            lines.append(f"| {r['method']} | {r['family']} | {'yes' if r['ok'] else 'NO'} | "
                         f"{r.get('primary_acc', '')} | {r['seconds']} | {r.get('peak_gpu_mib') or ''} | "
                         f"{r.get('error', '')[:160]} |")
    else:
        lines.append("not run or failed before its first method (see the log)")
    lines += ["", "## (b) FedCAC's paper round: 40 clients, ResNet-8, batch 100, E=5 (CIFAR-10-shaped synthetic)", ""]
    if b:
        from scripts.batched_clients import markdown

        lines += [markdown(b).rstrip(), "", f"Rounds (s): sequential {b[0]['sequential_rounds_s']}, batched "
                  f"{b[0]['batched_rounds_s']}; peak GPU MiB {b[0].get('peak_gpu_mib', '')}.", "",
                  "The last column is no equality check here: FedCAC's top-k critical masks and lr 0.1 with momentum "
                  "0.9 can turn last-bit differences (other summation orders) into large ones within a few rounds (the "
                  "tiny check workload: 18 in float32, 1e-15 in float64); the paths' equality is tested in float64 "
                  "(tests/test_batched.py)."]
    else:
        lines.append("not run or failed (see the log)")
    lines += ["", "## (c) runs per GPU: copies of one run (FedAvg, ResNet-8, 20 clients, 6 rounds) at once", ""]
    if c:
        lines += ["| runs at once | wall s | runs per hour | each run's own s (median) | failed |",
                  "|---:|---:|---:|---:|---:|"]
        for r in c:
            lines.append(f"| {r['runs_at_once']} | {r['wall_s']} | {r['runs_per_hour']} | "
                         f"{r['run_own_s_median']} | {r['failed']} |")
    else:
        lines.append("not run or failed (see the log)")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    write(out, "gpu_check.json", {"env": env_info, "cuda_runs": a, "round_time": b, "concurrency": c})
    print("\n".join(lines))


PARTS = {"env": env, "cuda-runs": cuda_runs, "round-time": round_time, "concurrency": concurrency, "report": report}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    PARTS[args.part](args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
