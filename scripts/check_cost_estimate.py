"""The dry run's cost estimate (``bench.experiment.cost``) against measured runs on this machine's CPU.

    python scripts/check_cost_estimate.py [--out results/bench/cost_estimate.md] [--work /tmp/cost_check]

For each check below: the estimate exactly as ``python -m bench.experiment.table <spec> --dry-run`` computes it (client
sizes from the partition, a calibration made now, just before the run, so that both see the same load on a shared
machine: on 2 cores shared by a dozen processes a core's CPU seconds stretch too), then the run itself in this
process (a fresh run directory, one thread), timed in CPU seconds of this process (what the estimate predicts on
a core of its own) and in wall-clock seconds; error = estimate / measured - 1. The measured time includes loading
the data and writing the run's files, which the estimate leaves out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (label, spec or None, scale, row, column, overrides of a plain run)
CHECKS = [
    ("FedCAC Table 2 mini, FedAvg / CIFAR-10 a=0.1, seed 0", "conf/paper/fedcac/table2.yaml", "mini", "FedAvg",
     "CIFAR-10 a=0.1", []),
    ("FedCAC Table 2 mini, FedCAC / CIFAR-100 a=0.1, seed 0", "conf/paper/fedcac/table2.yaml", "mini", "FedCAC",
     "CIFAR-100 a=0.1", []),
    ("Fashion-MNIST, FedAvgCNN, FedAvg, 20 clients x 500, batch 50, 10 rounds (the PFLlib comparison)", None, "", "",
     "", ["dataset=fashion_mnist", "model=cnn_fedavg", "partition=dirichlet", "num_clients=20", "rounds=10",
          "train.lr=0.01", "train.batch_size=50", "method=fedavg", "seed=0"]),
    ("FedCAC's paper round shape: ResNet-8, CIFAR-10-shaped synthetic images, 20 clients x 500, batch 100, E=5, "
     "3 rounds", None, "", "", "",
     ["dataset=synthetic", "dataset.options.num_channels=3", "dataset.options.size=32",
      "dataset.options.num_classes=10", "dataset.options.num_train=12000", "model=resnet8", "partition=dirichlet",
      "partition.alpha=0.1", "partition.n_train=500", "partition.n_test=100", "num_clients=20", "rounds=3",
      "train.batch_size=100", "train.epochs=5", "train.lr=0.1", "train.momentum=0.9", "method=fedcac", "seed=0"]),
]


def main() -> None:
    import torch

    from bench.experiment.compose import to_container
    from bench.experiment.cost import base_rss, estimate_run
    from bench.experiment.precheck import dry_build
    from bench.experiment.run import execute
    from bench.experiment.spec import Cell, cell_config, expand, load_spec

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "cost_estimate.md")
    parser.add_argument("--work", type=Path, help="scratch folder for the runs (default: a new temporary one)")
    parser.add_argument("--only", type=int, nargs="+", help="indices of the checks to run (default: all)")
    parser.add_argument("--device", default="cpu", help="cpu (compared in CPU seconds) or cuda (in wall seconds)")
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    work = args.work or Path(tempfile.mkdtemp(prefix="cost_check_"))
    torch.set_num_threads(1)
    base = base_rss()
    rows = []
    for i, (label, spec_path, scale, row, column, overrides) in enumerate(CHECKS):
        if args.only and i not in args.only:
            continue
        extra = [f"out_dir={work / str(i)}", "threads=1", "quiet=true", "logger.wandb.mode=disabled",
                 f"device={args.device}"]
        if spec_path:
            spec = load_spec(ROOT / spec_path)
            (cell,) = [c for c in expand(spec, scale, [0], str(work / str(i)), extra)
                       if c.row == row and c.column == column]
            cfg = cell_config(cell, spec, scale)
        else:
            from bench.experiment.compose import compose_config

            spec, cell = None, Cell("run", "run", 0, tuple(overrides + extra))
            cfg = to_container(compose_config(cell.overrides))
        cfg["cache_dir"] = str(work / str(i) / "cache")  # a fresh calibration, under the run's load
        sizes = dry_build([cell], {cell: cfg}).cell_sizes(cfg)
        estimate = estimate_run(cfg, sizes, 1, base)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        execute(cfg)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        rows.append((label, estimate.seconds, cpu, wall, estimate.calibration.step_s, estimate.peak_bytes))
        measured = wall if on_gpu else cpu
        print(f"{label}: estimate {estimate.seconds:.1f} s, measured {cpu:.1f} CPU s / {wall:.1f} wall s "
              f"({estimate.seconds / measured - 1:+.0%})", flush=True)
    where = (f"{torch.cuda.get_device_name()} (wall-clock seconds are the comparison)" if on_gpu else
             f"{os.uname().nodename}'s CPU "
                 f"({__import__('bench.experiment.provenance', fromlist=['cpu_name']).cpu_name()}), "
             f"1 thread; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end (a shared "
             "machine: CPU seconds are the comparison, wall-clock seconds include waiting for a core)")
    lines = [f"# Cost estimate vs measured runs ({'GPU' if on_gpu else 'CPU, 1 thread'})", "",
             f"`python scripts/check_cost_estimate.py --device {args.device}` on {where}, torch {torch.__version__}.",
             "",
             "| run | estimate s | measured CPU s | error | measured wall s | calibrated s/step | est. peak memory |",
             "|---|---|---|---|---|---|---|"]
    for label, est, cpu, wall, step, peak in rows:
        measured = wall if on_gpu else cpu
        lines.append(f"| {label} | {est:.1f} | {cpu:.1f} | {est / measured - 1:+.0%} | {wall:.1f} | "
                     f"{step * 1000:.2f} ms | {peak / 2**30:.2f} GiB |")
    lines += ["", "The estimate counts training and evaluation only; the measured time also holds loading the "
              "data, building the partition and writing the run's records (not start-up: the run executes in "
              "this script's process)."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
