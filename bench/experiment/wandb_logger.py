"""Optional Weights & Biases logging (``logger.wandb.mode=disabled|offline|online``).

A run logs its resolved config, one history row per round (mean accuracies and losses per stage and
split, train loss, method metrics) and the summary. The W&B run id is derived from the run directory,
so a resumed run continues the same W&B run. Offline runs land under ``<run_dir>/wandb`` and can be
uploaded later with ``wandb sync <run_dir>/wandb/offline-run-*``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.core.records import RunDir


def history_row(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Flatten one round's records into scalar W&B metrics."""
    row: dict[str, float] = {}
    for rec in records:
        if rec["kind"] == "eval":
            prefix = f"{rec['stage']}/{rec['split']}"
            for key in ("mean_acc", "weighted_acc", "mean_loss", "weighted_loss"):
                row[f"{prefix}/{key}"] = rec[key]
        elif rec["kind"] == "train":
            row["train/mean_loss"] = rec["mean_loss"]
            row["train/lr"] = rec["lr"]
        elif rec["kind"] == "method":
            row.update({f"method/{k}": v for k, v in rec.items()
                        if k not in ("kind", "round") and isinstance(v, int | float)})
    return row


#: W&B's length limits (its settings validation refuses longer values and the run fails)
WANDB_LIMITS = {"tag": 64, "job_type": 64, "group": 128}


def wandb_safe(value: str, kind: str) -> str:
    """``value`` within W&B's length limit for ``kind``: a longer one is cut and ends with a hash of the whole,
    so two long names stay distinct."""
    limit = WANDB_LIMITS[kind]
    if len(value) <= limit:
        return value
    return value[:limit - 9] + "~" + hashlib.sha256(value.encode()).hexdigest()[:8]


def wandb_requested(overrides: Sequence[str]) -> bool:
    """Whether a run started with these command-line ``overrides`` logs to W&B: unless one of them sets
    ``logger.wandb.mode=disabled`` (the config's default mode is ``offline``)."""
    modes = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("logger.wandb.mode=")]
    return not modes or modes[-1] != "disabled"


def preload_wandb(overrides: Sequence[str]) -> None:
    """Import W&B, and the launch module its ``wandb.init`` imports, while few modules are loaded, for a run that
    will log to W&B (:func:`wandb_requested`); call it before torch is imported. The results are the same either
    way; only the cost differs: some of W&B's pydantic models read their fields' docstrings from source at import
    time, and pydantic finds a class's source by asking ``inspect.getmodule`` about each frame of the import
    stack, which scans every loaded module each time: after torch and Hydra (~2,000 modules) that import costs
    ~1.7 CPU s, before them ~0.3 s. Does nothing when W&B is not installed."""
    if not wandb_requested(overrides) or "wandb" in sys.modules:
        return
    try:
        import wandb  # noqa: F401
        from wandb.sdk.launch.inputs.internal import StagedLaunchInputs  # noqa: F401
    except ImportError:
        return


class WandbLogger:
    def __init__(self, conf: Mapping[str, Any], run: RunDir) -> None:
        import wandb

        opts = conf["logger"]["wandb"]
        run_id = hashlib.sha256(str(run.path.resolve()).encode()).hexdigest()[:16]
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=opts.get("project") or "pflrepro",
            entity=opts.get("entity"),
            group=wandb_safe(opts.get("group") or f"{conf.get('exp', 'default')}", "group"),
            job_type=wandb_safe(opts.get("job_type") or conf["method"]["name"], "job_type"),
            tags=[wandb_safe(str(t), "tag") for t in [*(opts.get("tags") or []),
                  f"dataset:{conf['dataset']['name']}", f"partition:{conf['partition']['scheme']}",
                  f"seed:{conf['seed']}"]],
            name=run.path.name,
            id=run_id,
            resume="allow",
            mode=opts["mode"],
            dir=str(opts.get("dir") or run.path),
            config=dict(conf),
        )

    def on_round(self, round_: int, records: Sequence[Mapping[str, Any]]) -> None:
        self.run.log(history_row(records), step=round_)

    def on_end(self, summary: Mapping[str, Any]) -> None:
        primary = summary["primary"]
        self.run.summary.update({"primary/acc": primary["acc"], "primary/round": primary["round"],
                                 "protocol": "/".join(str(v) for v in summary["protocol"].values())})
        for r in summary["results"]:
            self.run.summary[f"{r['stage']}/{r['selection']}/{r['weighting']}/acc"] = r["acc"]
        self.run.finish()
