"""What a table will cost before it is launched: runs, device-hours and peak memory per run, and how the launcher
packs them (``python -m bench.experiment.table <spec> --dry-run``).

A run's time is its work times a calibrated time per unit of work:

- **training steps** = rounds x participants per round x local epochs x batches per client (the mean over clients of
  ``ceil(n_train / batch_size)``, or ``floor`` with ``drop_last``), with the client sizes of the partition the dry
  build drew (:mod:`bench.experiment.precheck`), and
- **evaluated samples** = evaluation rounds x (the participants' test and validation samples at ``pre``, when the
  run evaluates there, plus every client's at ``post``; the stages are ``eval.stages``, else the method's).

The calibration (:func:`calibrate`) builds the cell's method, model and optimiser on a synthetic federation of
:data:`CAL_CLIENTS` clients of random images of the data set's shape (no data files needed), each holding as many
training and test samples as the run's clients hold on average (at most :data:`CAL_MAX_BATCHES` training batches
and :data:`CAL_MAX_EVAL_BATCHES` evaluation batches, so that what a round costs per client, such as building the
optimiser, weighs as in the run). It trains one warm-up round and :data:`CAL_ROUNDS` timed rounds and times one
evaluation of every client: in CPU time on a CPU with one thread per run (what the run takes on a core of its own,
which other processes on a loaded machine do not inflate), else in wall-clock time. Its time per step is per
*nominal* step (the ``train`` config's epochs x batches), so a method that trains more per round (FedRep's body and
head phases, Ditto's personal model) or does server work per round shows as a longer step, and an evaluation that
first fine-tunes (FedBABU) as a dearer evaluated sample. Server work that grows with the square of the clients
(FedAMP's, FedCAC's pairwise similarities) is calibrated at 2 clients and so underestimated. Start-up, data loading
and the partition report are not counted (a pool worker pays them once).

Peak memory per run: on CUDA the allocator's peak during the calibration, on the CPU the growth of the process's
peak resident set during it plus the resident set of a process that imported torch; then plus the run's data pool
(its clients' images, as float32) and the method's state scaled from 2 clients to the run's (an upper bound: a
method that keeps one model for everyone is counted as if it kept one per client).

Calibrations are cached in ``<cache_dir>/cost/<key>.json``, the key naming everything the time depends on (device
and its name, torch version, CPU kernels, threads, model, method, the ``train`` config, image shape, classes,
transforms, evaluation batch size), so a dry run calibrates each distinct setup once per machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.builder import build_experiment, chosen_stages, method_class
from bench.core.data import build_federated_data
from bench.core.method import evaluated_stages
from bench.experiment.provenance import cpu_kernels
from bench.experiment.spec import Cell
from datasets.label_counts import LABEL_COUNTS

#: (channels, height = width) of each source as it loads (before ``dataset.image_size`` / ``channels``)
IMAGE_SHAPES: dict[str, tuple[int, int]] = {
    "cifar10": (3, 32), "cifar100": (3, 32), "tiny_imagenet": (3, 64), "mnist": (1, 28), "fashion_mnist": (1, 28),
    "svhn": (3, 32), "usps": (1, 16), "digits": (1, 8), "mnist5k": (1, 28),
}
#: the calibration's clients, rounds timed after its warm-up round, and the most training batches and evaluation
#: batches a calibration client holds
CAL_CLIENTS, CAL_ROUNDS, CAL_MAX_BATCHES, CAL_MAX_EVAL_BATCHES = 2, 2, 8, 2
CACHE_VERSION = 2


@dataclass(frozen=True)
class Work:
    """A run's work: training steps (batches trained) and evaluated samples."""

    train_steps: float
    eval_samples: float


@dataclass(frozen=True)
class Calibration:
    """Seconds per training step and per evaluated sample, and memory, measured on one device."""

    step_s: float
    eval_sample_s: float
    peak_bytes: int  # during the calibration, over the process before it (CPU: plus BASE_RSS_BYTES)
    state_bytes: int  # the method's state after the calibration rounds (CAL_CLIENTS clients)
    pool_bytes: int  # the synthetic pool's images
    device: str  # "cpu" or "cuda"
    device_name: str


def client_sizes(partition: Any) -> dict[str, list[int]]:
    """Per split, each client's sample count of a :class:`datasets.partition.Partition`."""
    return {s: [len(getattr(c, s)) for c in partition.clients] for s in ("train", "val", "test")}


def participants(cfg: Mapping[str, Any]) -> int:
    """Clients sampled per round (the engine's rule)."""
    return max(1, math.floor(float(cfg["participation"]) * int(cfg["num_clients"]) + 0.5))


def eval_rounds(rounds: int, every: int) -> int:
    """Rounds the engine evaluates: every ``every``-th and the last."""
    return rounds // every + (rounds % every != 0)


def work(cfg: Mapping[str, Any], sizes: Mapping[str, Sequence[int]]) -> Work:
    """The training steps and evaluated samples of the run ``cfg`` on a partition of client ``sizes``
    (:func:`client_sizes`); with partial participation, the expectation over the sampled clients."""
    train = cfg["train"]
    batch, drop = int(train["batch_size"]), bool(train.get("drop_last", False))
    n = len(sizes["train"])
    batches = sum((k // batch if drop else math.ceil(k / batch)) for k in sizes["train"]) / n
    k = participants(cfg)
    steps = int(cfg["rounds"]) * k * int(train["epochs"]) * batches
    evaluated = [t + v for t, v in zip(sizes["test"], sizes["val"], strict=True)]
    stages = evaluated_stages(method_class(cfg)[0], chosen_stages(cfg))  # eval.stages, else the method's
    per_round = (sum(evaluated) if "post" in stages else 0.0)
    if "pre" in stages:
        per_round += k * sum(evaluated) / n
    return Work(steps, eval_rounds(int(cfg["rounds"]), int(cfg["eval"]["every"])) * per_round)


def image_shape(dataset: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(channels, size, classes) of a dataset config without its files (None when the source is unknown here)."""
    names = dataset.get("domains") or [dataset["source"]]
    first = names[0]
    if first == "synthetic":
        opts = dataset.get("options") or {}
        channels, size, classes = int(opts.get("num_channels", 1)), int(opts.get("size", 8)), int(
            opts.get("num_classes", 10))
    elif first in IMAGE_SHAPES and first in LABEL_COUNTS:
        (channels, size), classes = IMAGE_SHAPES[first], len(LABEL_COUNTS[first][0])
    else:
        from bench.core.data import load_sources

        try:
            train, _ = load_sources(dataset, None)
        except (OSError, ValueError):
            return None
        channels, size, classes = int(train[0].images.shape[1]), int(train[0].images.shape[-1]), len(
            train[0].classes)
    return (int(dataset.get("channels") or channels), int(dataset.get("image_size") or size), classes)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(cpu_kernels().get("cpu", "cpu"))


def calibration_sizes(cfg: Mapping[str, Any], sizes: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    """(training, test) samples per calibration client: the run's mean per client, capped (see the module doc)."""
    n = len(sizes["train"])
    batch, eval_batch = int(cfg["train"]["batch_size"]), int(cfg["eval"]["batch_size"])
    train = min(max(round(sum(sizes["train"]) / n), 1), CAL_MAX_BATCHES * batch)
    test = min(max(round((sum(sizes["test"]) + sum(sizes["val"])) / n), 1), CAL_MAX_EVAL_BATCHES * eval_batch)
    return train, test


def calibration_key(cfg: Mapping[str, Any], shape: tuple[int, int, int], threads: int,
                    per_client: tuple[int, int]) -> dict[str, Any]:
    """Everything a calibration's numbers depend on."""
    device = torch.device(cfg["device"])
    return {"version": CACHE_VERSION, "device": device.type, "device_name": device_name(device),
            "kernels": cpu_kernels() if device.type == "cpu" else torch.version.cuda,
            "torch": torch.__version__, "threads": threads, "model": cfg["model"], "method": cfg["method"],
            "train": cfg["train"], "shape": list(shape), "transforms": [cfg["dataset"].get("train_transform"),
                                                                        cfg["dataset"].get("test_transform")],
            "eval_batch_size": cfg["eval"]["batch_size"], "capacity": cfg.get("capacity"),
            "compile": cfg.get("compile", False), "per_client": list(per_client)}


def _rss(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in bytes (0 where /proc is absent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set (Linux >= 4.0)
        return True
    except OSError:
        return False


def _tensor_bytes(node: Any) -> int:
    if torch.is_tensor(node):
        return node.numel() * node.element_size()
    if isinstance(node, Mapping):
        return sum(_tensor_bytes(v) for v in node.values())
    if isinstance(node, list | tuple):
        return sum(_tensor_bytes(v) for v in node)
    return 0


def synthetic_config(cfg: Mapping[str, Any], shape: tuple[int, int, int], per_client: tuple[int, int]
                     ) -> dict[str, Any]:
    """``cfg`` on :data:`CAL_CLIENTS` clients of random images of ``shape``, each with ``per_client`` (training,
    test) samples."""
    channels, size, classes = shape
    n_train, n_test = CAL_CLIENTS * per_client[0], CAL_CLIENTS * per_client[1]
    val = 0.0
    dataset = {"name": "synthetic", "source": "synthetic", "image_size": None, "channels": None,
               "options": {"num_train": n_train, "num_test": n_test, "num_classes": classes,
                           "num_channels": channels, "size": size, "noise": 0.3, "seed": 0},
               "train_transform": cfg["dataset"].get("train_transform") or [],
               "test_transform": cfg["dataset"].get("test_transform") or []}
    partition = {"scheme": "iid", "test_mode": "matched", "test_fraction": n_test / (n_train + n_test),
                 "val_fraction": val}
    method = dict(cfg.get("method") or {})
    if isinstance(method.get("federation"), Mapping):  # sized by the run's federation (Pa3dFL's p_min): by this one
        method["federation"] = {**method["federation"], "num_clients": CAL_CLIENTS}
    return {**cfg, "dataset": dataset, "partition": partition, "num_clients": CAL_CLIENTS, "participation": 1.0,
            "rounds": 1 + CAL_ROUNDS, "cache_dir": None, "method": method}


def calibrate(cfg: Mapping[str, Any], shape: tuple[int, int, int], threads: int,
              per_client: tuple[int, int]) -> Calibration:
    """Time :data:`CAL_ROUNDS` rounds of ``cfg``'s method on a synthetic federation of ``shape`` after a warm-up
    round, and one evaluation of every client (see the module doc)."""
    device = torch.device(cfg["device"])
    cal = synthetic_config(cfg, shape, per_client)
    before_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(0)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                start_alloc = torch.cuda.memory_allocated(device)
            rss0 = _rss("VmRSS")
            peak_tracked = _reset_peak_rss()
            data = build_federated_data(cal["dataset"], cal["partition"], num_clients=CAL_CLIENTS, data_seed=0,
                                        device=device)
            experiment = build_experiment(cal, device, data=data)
            method = experiment.method
            method.setup(experiment.fed.worker.read())
            engine = experiment.engine()
            engine.round(1, evaluate=False)
            nominal = int(cal["train"]["epochs"]) * sum(  # the round's steps as the train config counts them
                math.ceil(data.client(c).size("train") / int(cal["train"]["batch_size"])) for c in range(CAL_CLIENTS))
            clock = _clock(device, threads)
            _sync(device)
            t0 = clock()
            for r in range(2, 2 + CAL_ROUNDS):
                engine.round(r, evaluate=False)
            _sync(device)
            step_s = (clock() - t0) / (CAL_ROUNDS * nominal)
            evaluated, t0 = 0, clock()
            lr = experiment.fed.lr_at(1 + CAL_ROUNDS)
            for cid in range(CAL_CLIENTS):
                for stage in method.eval_stages:
                    engine.evaluate_client(cid, stage, 1 + CAL_ROUNDS, lr)
                    evaluated += data.client(cid).size("test") + data.client(cid).size("val")
            _sync(device)
            eval_s = (clock() - t0) / max(evaluated, 1)
            if device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(device) - start_alloc
            else:
                peak = max(_rss("VmHWM") - rss0, 0) if peak_tracked else 0
            state = _tensor_bytes(method.state_dict())
            pool = data.images.numel() * data.images.element_size()
    finally:
        torch.set_num_threads(before_threads)
    return Calibration(step_s, eval_s, int(peak), int(state), int(pool), device.type, device_name(device))


def _clock(device: torch.device, threads: int) -> Callable[[], float]:
    """The clock a calibration reads: on the CPU with one thread this process's CPU time, so that other processes
    competing for the cores (a loaded or shared machine) do not inflate the estimate; else the wall clock."""
    return time.process_time if device.type == "cpu" and threads == 1 else time.perf_counter


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cached_calibration(cfg: Mapping[str, Any], shape: tuple[int, int, int], threads: int,
                       per_client: tuple[int, int]) -> Calibration:
    """:func:`calibrate`, read from ``<cache_dir>/cost/`` when this setup was calibrated before (written there
    otherwise; no cache with ``cache_dir: null``)."""
    key = calibration_key(cfg, shape, threads, per_client)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = Path(cfg["cache_dir"]) / "cost" / f"{digest}.json" if cfg.get("cache_dir") else None
    if path is not None and path.is_file():
        return Calibration(**json.loads(path.read_text())["calibration"])
    result = calibrate(cfg, shape, threads, per_client)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "calibration": asdict(result)}, indent=1, default=str))
        os.replace(tmp, path)
    return result


def base_rss() -> int:
    """The resident set of this process (Python, torch, the harness): what a CPU run's process holds besides its
    data, model and training."""
    return _rss("VmRSS")


@dataclass
class RunEstimate:
    seconds: float
    peak_bytes: int
    calibration: Calibration


def estimate_run(cfg: Mapping[str, Any], sizes: Mapping[str, Sequence[int]], threads: int,
                 base_bytes: int = 0) -> RunEstimate:
    """Seconds and peak memory of the run ``cfg`` on a partition of client ``sizes``."""
    shape = image_shape(cfg["dataset"])
    if shape is None:
        raise ValueError(f"the image shape of dataset {cfg['dataset']['name']!r} is unknown here")
    cal = cached_calibration(cfg, shape, threads, calibration_sizes(cfg, sizes))
    w = work(cfg, sizes)
    channels, size, _ = shape
    pool = 4 * channels * size * size * sum(sum(v) for v in sizes.values())
    clients = len(sizes["train"])
    peak = (cal.peak_bytes - cal.pool_bytes + pool + cal.state_bytes * max(clients / CAL_CLIENTS - 1, 0)
            + (base_bytes if cal.device == "cpu" else 0))
    return RunEstimate(w.train_steps * cal.step_s + w.eval_samples * cal.eval_sample_s, int(peak), cal)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds / 60:.1f} min"


def cost_report(cells: Sequence[Cell], configs: Mapping[Cell, Mapping[str, Any]],
                sizes: Mapping[Cell, Mapping[str, Sequence[int]] | None], launcher: Mapping[str, Any],
                pending: Sequence[Cell], base: int = 0) -> str:
    """The dry run's cost lines: runs, device-hours and peak memory per run by row, and the launcher's packing.
    ``pending``: the cells not finished yet (what a launch would run); ``base``: the resident bytes a CPU run's
    process holds besides its work (:func:`base_rss` before any data is read)."""
    threads = int(launcher.get("cpus_per_task") or 1)
    estimates: dict[Cell, RunEstimate] = {}
    failed: dict[str, list[Cell]] = defaultdict(list)
    for cell in cells:
        cfg = configs[cell]
        if sizes.get(cell) is None:
            failed["partition not built (data absent, no label counts)"].append(cell)
            continue
        if torch.device(cfg["device"]).type == "cuda" and not torch.cuda.is_available():
            failed[f"device={cfg['device']} is not here: run the dry run where the runs will run"].append(cell)
            continue
        try:
            estimates[cell] = estimate_run(cfg, sizes[cell], int(cfg.get("threads") or threads), base)
        except Exception as err:  # noqa: BLE001  (an estimate is advice: a setup that cannot calibrate is named)
            failed[f"calibration failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                   ].append(cell)
    devices = sorted({e.calibration.device_name for e in estimates.values()})
    lines = [f"cost estimate (calibrated here on {', '.join(devices) or 'no device'}, torch {torch.__version__}, "
             f"{threads} thread(s) per run; training and evaluation, start-up and data loading excluded):"]
    todo = [c for c in pending if c in estimates]
    total = sum(estimates[c].seconds for c in todo)
    lines.append(f"  {len(pending)} runs to launch of {len(cells)}: {total / 3600:.2f} device-hours"
                 + (f" ({len(pending) - len(todo)} not estimated)" if len(todo) < len(pending) else ""))
    by_row: dict[str, list[Cell]] = defaultdict(list)
    for c in todo:
        by_row[c.row].append(c)
    for row, row_cells in by_row.items():
        secs = [estimates[c].seconds for c in row_cells]
        peak = max(estimates[c].peak_bytes for c in row_cells)
        lines.append(f"  {row}: {len(row_cells)} runs, {sum(secs) / 3600:.2f} device-hours, per run "
                     f"{hours(min(secs))}-{hours(max(secs))}, peak memory {gib(peak)}")
    if todo:
        peak = max(estimates[c].peak_bytes for c in todo)
        lines.append(f"  peak memory per run: {gib(peak)} at most")
        lines.append("  " + packing(launcher, len(todo), peak, total))
    for why, bad in failed.items():
        lines.append(f"  not estimated ({len(bad)} cells): {why}")
    return "\n".join(lines)


def packing(launcher: Mapping[str, Any], runs: int, peak: int, seconds: float) -> str:
    """How the launcher's settings pack ``runs`` runs of at most ``peak`` bytes each onto devices."""
    name = launcher.get("name")
    per_job = launcher.get("runs_per_job") or 1
    if name == "slurm":
        at_once = int(launcher.get("runs_at_once") or 1)
        jobs = math.ceil(runs / int(per_job))
        return (f"slurm: runs_per_job={per_job}, runs_at_once={at_once} -> {jobs} array tasks, {at_once} runs "
                f"sharing a GPU at a time ({gib(at_once * peak)} of its memory; mem_gb={launcher.get('mem_gb')} per "
                f"task); GPU-hours {seconds / 3600:.2f} if runs sharing a GPU gain nothing, "
                f"{seconds / 3600 / at_once:.2f} if they overlap fully")
    if name == "local":
        workers = launcher.get("max_concurrent") or max(1, (os.cpu_count() or 1) // int(launcher.get(
            "cpus_per_task") or 1))
        return (f"local: max_concurrent={workers} workers (runs at once on this machine or its GPU: "
                f"{gib(workers * peak)}), runs_per_job={launcher.get('runs_per_job')}; wall-clock at best "
                f"{seconds / 3600 / workers:.2f} h")
    return f"{name}: one run at a time, {seconds / 3600:.2f} h"
