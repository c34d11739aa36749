"""Rerun a sample of finished runs with this tree's code and compare their records with the stored ones.

After a change to the shared code (``common``, ``bench/core``, ``datasets``, ``bench/builder.py``,
``bench/experiment/run.py``) every stored run is marked stale; this shows, on a sample, whether the change moved any
number. Each sampled run is executed again from its own ``config.yaml`` into a temporary directory, and every record
(minus wall-clock fields) and the summary's results must be equal bit for bit.

Usage: ``python scripts/verify_reruns.py runs/fedselect runs/fedc2i --per-method 1 [--out results/bench/reruns.md]``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's code, not an installed checkout's

#: record fields that measure time, not results (timing.json holds the wall clock; this is a guard)
CLOCK = ("seconds", "wall", "time", "timestamp", "elapsed")


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(c in k for c in CLOCK)}


def _records(path: Path) -> list[dict]:
    return [_strip(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def sample_runs(roots: Sequence[Path], per_method: int, seed: int) -> list[Path]:
    """``per_method`` finished runs of every method found under ``roots``."""
    by_method: dict[str, list[Path]] = {}
    for root in roots:
        for summary in sorted(root.rglob("summary.json")):
            if ".stale" in summary.parts:
                continue
            by_method.setdefault(json.loads(summary.read_text())["method"], []).append(summary.parent)
    rng = random.Random(seed)
    return [run for runs in by_method.values() for run in rng.sample(runs, min(per_method, len(runs)))]


def with_added_keys(cfg: dict[str, Any]) -> dict[str, Any]:
    """A stored config with the keys added since it was written (``identity.ADDED``) set to today's defaults for its
    method, each the value at which the key changes nothing (checked): the run the stored config describes."""
    from bench.experiment.compose import compose_config, to_container
    from bench.experiment.identity import ADDED

    defaults = to_container(compose_config([f"method={cfg['method']['name']}"]))
    for key, neutral in ADDED.items():
        *parents, leaf = key.split(".")
        have, default = cfg, defaults
        for part in parents:
            have, default = have.get(part), (default or {}).get(part)
            if not isinstance(have, dict) or not isinstance(default, dict):
                break
        else:
            if leaf not in have and leaf in default:
                if not neutral(default[leaf]):
                    raise ValueError(f"{key}: today's default {default[leaf]!r} is not its neutral value, so a config "
                                     "written before the key cannot be rerun with it")
                have[leaf] = default[leaf]
    return cfg


def verify(run: Path, scratch: Path) -> tuple[bool, str]:
    from bench.experiment.run import execute

    cfg = with_added_keys(yaml.safe_load((run / "config.yaml").read_text()))
    cfg.update(run_dir=str(scratch / run.name), quiet=True, threads=json.loads((run / "timing.json").read_text())
               .get("threads", 1) if (run / "timing.json").exists() else 1)
    cfg["logger"]["wandb"]["mode"] = "disabled"
    cfg["eval"].setdefault("chance_z", 2.33)  # configs from before the key: it changes no record, only the verdict
    summary = execute(cfg)
    old, new = _records(run / "rounds.jsonl"), _records(scratch / run.name / "rounds.jsonl")
    same = old == new and json.loads((run / "summary.json").read_text())["results"] == summary["results"]
    if same:
        return True, f"{len(new)} records"
    return False, f"records differ ({len(old)} stored, {len(new)} now){kernels_hint(run)}"


def kernels_hint(run: Path) -> str:
    """Why records can differ without a code change: another CPU instruction set (docs/design.md)."""
    from bench.experiment.provenance import cpu_kernels

    stored = json.loads((run / "timing.json").read_text()) if (run / "timing.json").exists() else {}
    now = cpu_kernels()["cpu_capability"]
    if stored.get("cpu_capability") == now:
        return ""
    return (f"; stored with {stored.get('cpu_capability', 'unrecorded')} kernels, rerun with {now}: cap them to the "
            "stored run's instruction set, e.g. ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "
            "MKL_ENABLE_INSTRUCTIONS=AVX2 (docs/design.md)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--per-method", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as scratch:
        for run in sample_runs(args.roots, args.per_method, args.seed):
            same, detail = verify(run, Path(scratch))
            ok &= same
            rows.append(f"| {run} | {'identical' if same else 'DIFFERENT'} | {detail} |")
            print(rows[-1], flush=True)
    if args.out:
        args.out.write_text("| stored run | rerun | detail |\n|---|---|---|\n" + "\n".join(rows) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
