"""Seconds per round with a round's clients trained in turn and trained together (``train.batched_clients``).

    python scripts/batched_clients.py --workload fmnist --clients 10 40 --rounds 3 --json rows.json
    python scripts/batched_clients.py --workload fedcac --clients 40 --device cuda --json /tmp/fedcac.json

Workloads (the settings are the ones named, nothing else differs between the two paths):

- ``fmnist``: FedAvg, the small CNN on Fashion-MNIST, 500 training images per client (Dirichlet a=0.1), batch 50,
  one local epoch, SGD lr 0.01 (the setting of the PFLlib comparison);
- ``fedcac``: FedCAC's paper workload (``conf/paper/fedcac/_setup.yaml``): FedCAC, ResNet-8, 500 images per client,
  batch 100, E=5, SGD lr 0.1 momentum 0.9, on CIFAR-10-shaped synthetic images (3x32x32, 10 classes), so that it
  runs where CIFAR-10 is not installed;
- ``tiny``: the ``fedcac`` settings on 8x8 synthetic images, 2 epochs of 40 images: a check of the script itself.

Both paths build the same experiment (one data pool, the same initial model) and train the same rounds, without
evaluation; the rounds alternate between the paths after one warm-up round each, so a change of the machine's load
hits both. A round's time is wall-clock (with ``torch.cuda.synchronize`` on a GPU) and process CPU time; the table
gives medians, and the largest difference between the two paths' models after the timed rounds (float32).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.builder import build_experiment  # noqa: E402
from bench.experiment.compose import compose_config, to_container  # noqa: E402

COMMON = ["logger.wandb.mode=disabled", "quiet=true", "cache_dir=null", "participation=1.0", "eval.every=1000"]
WORKLOADS: dict[str, list[str]] = {
    "fmnist": ["method=fedavg", "dataset=fashion_mnist", "model=small_cnn", "partition=dirichlet",
               "partition.alpha=0.1", "partition.n_train=500", "partition.n_test=100", "train.batch_size=50",
               "train.epochs=1", "train.lr=0.01"],
    "fedcac": ["method=fedcac", "dataset=synthetic", "dataset.options.num_channels=3", "dataset.options.size=32",
               "dataset.options.num_classes=10", "model=resnet8", "partition=dirichlet", "partition.alpha=0.1",
               "partition.n_train=500", "partition.n_test=100", "train.batch_size=100", "train.epochs=5",
               "train.lr=0.1", "train.momentum=0.9"],
    "tiny": ["method=fedcac", "dataset=synthetic", "model=small_cnn", "model.options.norm=bn", "partition=dirichlet",
             "partition.alpha=0.1", "partition.n_train=40", "partition.n_test=10", "train.batch_size=16",
             "train.epochs=2", "train.lr=0.1", "train.momentum=0.9"],
}


def cpu_name() -> str:
    """The CPU model as ``lscpu`` names it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(workload: str, clients: int, rounds: int, device: str, extra: list[str],
            progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Median seconds per round of each path, and how far apart their models end; ``progress(row)`` sees the row
    after every timed round (a caller with a time limit keeps what was measured)."""
    overrides = [*COMMON, *WORKLOADS[workload], f"num_clients={clients}", f"device={device}", *extra]
    if workload in ("fedcac", "tiny"):  # enough synthetic images for every client's draw
        overrides.append(f"dataset.options.num_train={max(2000, 600 * clients)}")
    engines, methods = {}, {}
    data = None
    for batched in (False, True):
        cfg = to_container(compose_config([*overrides, f"train.batched_clients={str(batched).lower()}"]))
        experiment = build_experiment(cfg, device, data=data)
        data = experiment.data
        experiment.method.setup(experiment.fed.worker.read())
        engines[batched], methods[batched] = experiment.engine(), experiment.method
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    row: dict[str, Any] = {}
    for round_ in range(1, rounds + 2):  # round 1 warms up (allocations, kernel choice) and is not counted
        for batched in (False, True):
            sync(device)
            wall, cpu = time.perf_counter(), time.process_time()
            engines[batched].round(round_, evaluate=False)
            sync(device)
            if round_ > 1:
                times[batched].append((time.perf_counter() - wall, time.process_time() - cpu))
        if round_ > 1:
            row = summary_row(workload, clients, device, methods, times)
            if progress is not None:
                progress(row)
    return row


def summary_row(workload: str, clients: int, device: str, methods: dict[bool, Any],
                times: dict[bool, list[tuple[float, float]]]) -> dict[str, Any]:
    states = [methods[b].state_dict() for b in (False, True)]
    key = "models" if "models" in states[0] else "global"
    gap = float((states[0][key] - states[1][key]).abs().max())
    row = {"workload": workload, "clients": clients, "rounds_timed": len(times[False]), "device": device_name(device),
           "threads": torch.get_num_threads(), "torch": torch.__version__,
           "load": [round(x, 2) for x in os.getloadavg()], "max_abs_model_difference": gap}
    for batched, name in ((False, "sequential"), (True, "batched")):
        row[f"{name}_s_per_round"] = statistics.median(w for w, _ in times[batched])
        row[f"{name}_cpu_s_per_round"] = statistics.median(c for _, c in times[batched])
        row[f"{name}_rounds_s"] = [round(w, 4) for w, _ in times[batched]]
    row["speedup"] = row["sequential_s_per_round"] / row["batched_s_per_round"]
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | clients | device | threads | sequential s/round | batched s/round | speedup | "
             "sequential CPU s/round | batched CPU s/round | max abs model difference |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['clients']} | {r['device']} | {r['threads']} | "
                     f"{r['sequential_s_per_round']:.3f} | {r['batched_s_per_round']:.3f} | {r['speedup']:.2f}x | "
                     f"{r['sequential_cpu_s_per_round']:.3f} | {r['batched_cpu_s_per_round']:.3f} | "
                     f"{r['max_abs_model_difference']:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="fmnist")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 40])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per path (after one warm-up round)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--out", type=Path, help="write the Markdown table here")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both paths")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cudnn.deterministic = True  # as bench.experiment.run configures a CUDA run
        torch.backends.cudnn.benchmark = False
    rows = []
    for clients in args.clients:
        rows.append(measure(args.workload, clients, args.rounds, args.device, args.overrides))
        print(json.dumps(rows[-1]), flush=True)
    table = markdown(rows)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.out:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
