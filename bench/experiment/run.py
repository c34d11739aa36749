"""Run one experiment from a config: ``python -m bench.experiment.run method=fedavg dataset=digits seed=0``.

Hydra composes the config from ``conf/``; multirun (``-m seed=0,1,2 method=fedavg,local``) fans out.
The run directory is derived from the config (``<out_dir>/<exp>/<method>/<dataset>-<scheme>-s<seed>-<hash>``,
:mod:`bench.experiment.identity`), so the same command finds its own directory again: a finished run is reused, a killed
one resumes from its checkpoint.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # before torch and Hydra are imported (see preload_wandb)
    from bench.experiment.wandb_logger import preload_wandb

    preload_wandb(sys.argv[1:])

import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import methods
from bench.builder import (
    Experiment,
    build_experiment,
    check_batched_config,
    check_kept_optimizer_config,
    chosen_stages,
    client_capacity_table,
    engine_config,
    import_plugins,
    method_class,
)
from bench.core.capacity import IDEAL, check_capacity_config
from bench.core.data import FederatedData, active_sharing
from bench.core.engine import Diverged
from bench.core.method import evaluated_stages, scored_stage
from bench.core.models import MODELS
from bench.core.records import RunDir
from bench.core.summary import SELECTIONS, STAGES, WEIGHTINGS, chance_verdict, early_stop, final_eval, pick
from bench.experiment.compose import to_container
from bench.experiment.errors import DEBUG_ENV, ConfigError, config_phase, debugging, hydra_message, message, report
from bench.experiment.identity import config_hash, run_dir_for, semantic_config
from bench.experiment.provenance import code_identity, cpu_kernels
from bench.experiment.validation import check_config, check_hyperparameter_types
from common.verified_io import atomic_write_json, atomic_write_text, scan_records
from datasets.partition import PARTITIONERS
from datasets.partition_report import cached_partition_report, partition_label, report_key, write_report_files
from datasets.sources import SOURCES


def validate(cfg: Mapping[str, Any], check_device: bool = True) -> None:
    """Check names and values before anything is loaded or launched; errors name the key and the fix.
    ``check_device=False`` when the run goes to another machine (a Slurm login node often has no GPU)."""
    import_plugins(cfg)
    check_config(cfg)
    semantic_config(cfg)  # every key classified as part of a run's identity or not (bench.experiment.identity)
    method = {k: v for k, v in cfg["method"].items() if k != "name"}
    check_hyperparameter_types(methods.load(cfg["method"]["name"]).Hyper, method, cfg["method"]["name"])
    check_batched_config(cfg, method_class(cfg)[0])
    check_kept_optimizer_config(cfg)
    MODELS.get(cfg["model"]["name"])
    for source in cfg["dataset"].get("domains") or [cfg["dataset"]["source"]]:
        SOURCES.get(source)
    accepted = set(PARTITIONERS.get(cfg["partition"]["scheme"]).defaults) | {"scheme", "val_fraction"}
    unknown = sorted(set(cfg["partition"]) - accepted)
    if unknown:
        raise ValueError(f"partition scheme {cfg['partition']['scheme']!r} has no parameter(s) {unknown}; "
                         f"it accepts {sorted(accepted)}")
    engine_config(cfg)
    check_capacity_config(cfg.get("capacity") or IDEAL)
    if cfg["num_clients"] < 1:
        raise ValueError(f"num_clients={cfg['num_clients']} is invalid: it must be >= 1")
    primary = cfg["eval"]["primary"]
    for key, allowed in (("stage", STAGES), ("selection", SELECTIONS), ("weighting", WEIGHTINGS)):
        if primary[key] not in allowed:
            raise ValueError(f"eval.primary.{key}={primary[key]!r} is invalid: use one of {list(allowed)}")
    if primary["selection"] == "best_val" and not cfg["partition"].get("val_fraction"):
        raise ValueError("eval.primary.selection=best_val needs a validation split: set partition.val_fraction > 0")
    check_stages_config(cfg)
    if cfg["eval"].get("early_stop") is not None and not cfg["partition"].get("val_fraction"):
        raise ValueError(f"eval.early_stop={cfg['eval']['early_stop']} watches the validation accuracy and needs a "
                         "validation split: set partition.val_fraction > 0, or eval.early_stop=null")
    if not str(cfg["device"]).startswith(("cpu", "cuda")):
        raise ValueError(f"device={cfg['device']!r} is invalid: use cpu, cuda or cuda:<index>")
    if check_device and str(cfg["device"]).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={cfg['device']!r} but CUDA is not available here: use device=cpu")


def check_stages_config(cfg: Mapping[str, Any]) -> None:
    """Refuse an ``eval.stages`` that leaves out the stage the primary protocol scores (best_val selection and early
    stopping read that stage's validation records too), or that keeps none of the method's stages."""
    chosen = chosen_stages(cfg)
    if chosen is None:
        return
    name, stage = cfg["method"]["name"], cfg["eval"]["primary"]["stage"]
    cls = method_class(cfg)[0]
    needed = scored_stage(cls, stage)
    if needed not in evaluated_stages(cls, chosen):
        raise ValueError(f"eval.stages={list(chosen)} does not evaluate stage {needed!r}, which "
                         f"eval.primary.stage={stage} scores for method={name}: add it (method={name} evaluates "
                         f"{list(cls.eval_stages)}), or set eval.stages=null")


def run_threads(cfg: Mapping[str, Any]) -> int:
    """Torch threads of a run: ``threads`` if set, else Slurm's CPUs per task, else 1. Never torch's default
    (one per core): on a shared or loaded machine that makes a small run several times slower than one thread,
    and CPU records are bit-identical only for equal thread counts, so direct runs, multiruns and the table
    launchers (``cpus_per_task``, default 1) all use the same rule."""
    return int(cfg.get("threads") or os.environ.get("SLURM_CPUS_PER_TASK") or 1)


def configure_torch(cfg: Mapping[str, Any]) -> torch.device:
    torch.set_num_threads(run_threads(cfg))
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return device


class RunDiverged(RuntimeError):
    """The run stopped because its loss or model became non-finite; its directory says where."""


def execute(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Run (or resume, or reuse) one experiment; returns its summary. Raises ``RunDiverged`` for a run whose
    loss or model became non-finite (now or before: the run is deterministic, so it is not retried)."""
    conf = to_container(cfg)
    with config_phase():
        validate(conf)
    run = RunDir(run_dir_for(conf))
    state = run.summary_state()
    if state == "complete":
        return json.loads(run.summary.read_text())
    if state == "diverged":
        raise RunDiverged(f"{json.loads(run.diverged.read_text())['message']} ({run.diverged}; delete the run "
                          "directory to run this config again)")
    device = configure_torch(conf)
    with config_phase():  # data, partition and model are checked before anything is written
        experiment = build_experiment(conf, device, client_dir=client_state_dir(conf, run.path))
    with run.exclusive():
        state = run.summary_state()
        if state == "complete":  # finished by another process while this one waited to start
            return json.loads(run.summary.read_text())
        if state == "damaged" and scan_records(run.rounds).damaged_line is None:
            warnings.warn(f"{run.summary} is damaged; it is written again from the run's records", RuntimeWarning,
                          stacklevel=2)
            run.summary.unlink()  # the last checkpoint and the intact records give the summary back
        elif state == "damaged":
            warnings.warn(f"{run.path}: the finished run's records are damaged; set aside in "
                          f"{run.set_aside_damaged()} and run again", RuntimeWarning, stacklevel=2)
        return _execute(conf, run, experiment)


def _execute(conf: dict[str, Any], run: RunDir, experiment: Experiment) -> dict[str, Any]:
    digest = config_hash(conf)
    atomic_write_text(run.config, OmegaConf.to_yaml(OmegaConf.create(conf)))
    device = experiment.fed.device
    started = time.time()
    data = experiment.data
    if not (run.path / "partition" / "class_counts.csv").exists():
        title = f"{conf['dataset']['name']}: {partition_label(conf['partition'])}"
        write_report_files(partition_report(data, title, conf.get("cache_dir")), run.path / "partition")
    capacities = client_capacity_table(experiment)
    atomic_write_text(run.path / "partition" / "capacities.csv", "client,capacity,width\n" + "".join(
        f"{c},{r},{w}\n" for c, (r, w) in enumerate(zip(capacities["capacity"], capacities["width"], strict=True))))
    callbacks = make_callbacks(conf, run)
    engine = experiment.engine(run, digest, callbacks)
    try:
        results = engine.run()
    except Diverged as err:
        run.append_records([err.record()])
        atomic_write_json(run.diverged, err.record())
        raise RunDiverged(f"{err} (run directory {run.path})") from None
    finally:
        if experiment.fed.tables is not None:
            experiment.fed.tables.close()  # the live table files; a checkpoint's snapshots stay
    primary = conf["eval"]["primary"]
    records = run.records()
    stopping = ({"early_stop": early_stop(records, engine.cfg.early_stop, engine.stop_stage(), primary["weighting"])}
                if engine.cfg.early_stop is not None else {})
    summary = {
        "complete": True,
        "schema": 1,
        "method": conf["method"]["name"],
        "dataset": conf["dataset"]["name"],
        "model": conf["model"]["name"],
        "partition": conf["partition"]["scheme"],
        "exp": conf.get("exp", "default"),
        "seed": conf["seed"],
        "data_seed": conf["data_seed"],
        "rounds": conf["rounds"],
        "num_clients": conf["num_clients"],
        "config_hash": digest,
        "code": code_identity(tuple(conf.get("imports") or []), conf["method"]["name"]),
        "capacity": capacities,
        "protocol": dict(primary),
        "primary": dict(pick(results, primary["stage"], primary["selection"], primary["weighting"])),
        "trained": training_verdict(conf, data, records),
        "results": results,
        "final_metrics": final_metrics(records),
        **stopping,
        **({"eval_stages": list(engine.stages)} if conf["eval"].get("stages") is not None else {}),
    }
    atomic_write_json(run.summary, summary)
    (run.path / "error.txt").unlink(missing_ok=True)  # a failure reported earlier is history now
    atomic_write_json(run.timing, {"wall_seconds": time.time() - started, "device": str(device),
                                   "threads": torch.get_num_threads(), **cpu_kernels()})
    for cb in callbacks:
        cb.on_end(summary)
    return summary


def client_state_dir(conf: Mapping[str, Any], run_path: Path) -> Path:
    """Where a run's per-client table files go: ``<client_state.dir>/<run directory name>``, or
    ``<run_dir>/client_state``."""
    chosen = (conf.get("client_state") or {}).get("dir")
    return Path(chosen) / run_path.name if chosen else run_path / "client_state"


def training_verdict(conf: Mapping[str, Any], data: FederatedData,
                     records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Whether the run's final evaluation at the primary protocol's stage and weighting is above chance
    (:func:`bench.core.summary.chance_verdict`, margin ``eval.chance_z``); None without such a record or with
    ``eval.chance_z=null``."""
    primary, z = conf["eval"]["primary"], conf["eval"]["chance_z"]
    record = final_eval(records, primary["stage"])
    if record is None or z is None:
        return None
    labels = data.labels.cpu()
    counts = {c: torch.bincount(labels[s["test"].cpu()], minlength=data.num_classes).tolist()
              for c, s in enumerate(data.splits)}
    return chance_verdict(record, counts, primary["weighting"], float(z))


def final_metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The numbers of the run's last ``kind: method`` record (what the method's ``metrics()`` returned in the
    last round it reported, e.g. FedSelect's ``personal_fraction``) with that ``round``, so that a table can show
    them from the summary; only scalars: lists (FedSelect's ``head_mask_iou``) stay in ``rounds.jsonl``. Empty
    for a method that records none."""
    last = next((r for r in reversed(list(records)) if r.get("kind") == "method"), None)
    if last is None:
        return {}
    return {k: v for k, v in last.items() if k != "kind" and isinstance(v, int | float | str | bool)}


def partition_report(data: FederatedData, title: str, cache_dir: str | None = None) -> dict[str, bytes]:
    """The files of ``data``'s partition report; drawn once per partition and kept in ``cache_dir`` (the runs of
    every seed and method on one partition share it), and held in memory by a process serving many runs (inside
    :func:`sharing_sources`: every method of a table column draws the same report)."""
    args = (cache_dir, data.partition, data.pool_labels_full, data.num_classes)
    options = {"class_names": data.classes, "title": title}
    shared = active_sharing()
    if shared is None:
        return cached_partition_report(*args, **options)
    return shared.keep(f"partition report {report_key(*args[1:], **options)}",
                       lambda: cached_partition_report(*args, **options))


def make_callbacks(conf: Mapping[str, Any], run: RunDir) -> Sequence[Any]:
    from bench.experiment.progress import ProgressBar
    from bench.experiment.wandb_logger import WandbLogger

    callbacks: list[Any] = [ProgressBar(conf["rounds"], disable=bool(conf.get("quiet")),
                                        desc=f"{conf['method']['name']} s{conf['seed']}")]
    if conf["logger"]["wandb"]["mode"] != "disabled":
        callbacks.append(WandbLogger(conf, run))
    return callbacks


def hydra_task(cfg: DictConfig) -> None:
    """The Hydra task: run one config and print its primary result. A configuration error of a single run is
    reported here in one line (exit status 2); in a multirun it goes to :func:`main` after the other jobs."""
    try:
        summary = execute(cfg)
    except ConfigError as err:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if debugging() or HydraConfig.get().mode != RunMode.RUN:
            raise
        raise SystemExit(report(message(err))) from None  # before Hydra's "Error executing job" line
    p = summary["primary"]
    if not cfg.get("quiet"):
        print(f"{summary['method']} seed={summary['seed']}: {p['acc']:.2f}% "
              f"({p['stage']}, {p['selection']} round {p['round']}, {p['weighting']})")


def main() -> int:
    """``python -m bench.experiment.run``: configuration errors (:mod:`bench.experiment.errors`) and Hydra's override
    and config-group errors give a short message and exit status 2; ``PFL_DEBUG=1`` or ``HYDRA_FULL_ERROR=1`` shows
    their traceback. Other failures keep theirs."""
    import hydra
    from hydra.errors import HydraException

    # the task comes from the importable module, not __main__, so that submitit's launchers pickle it by
    # reference (a function of __main__ would be pickled by value, with unpicklable torch globals)
    from bench.experiment.run import hydra_task as task

    conf_dir = str(Path(__file__).resolve().parents[2] / "conf")
    app = hydra.main(config_path=conf_dir, config_name="config", version_base="1.3")(task)
    if debugging() or os.environ.get("HYDRA_FULL_ERROR") == "1":
        os.environ[DEBUG_ENV] = "1"  # the task too lets configuration errors through to Hydra
        app()
        return 0
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing, so that errors come here
    try:
        app()
    except ConfigError as err:
        return report(message(err))
    except HydraException as err:
        return report(hydra_message(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
