"""End to end: the demo script on a shortened schedule, and collection of its runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.collect import load_runs, mean_std_table
from bench.render import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def test_demo_writes_a_table_and_curves_from_its_own_records(tmp_path):
    out = tmp_path / "demo"
    # 2 rounds do not train: no chance verdict (eval.chance_z=null)
    proc = subprocess.run([sys.executable, "scripts/demo.py", "--out", str(out), "--seeds", "0", "1", "--", "rounds=2",
                           "num_clients=6", "cache_dir=null", "eval.chance_z=null"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    table = (out / "table.md").read_text()
    frame, partial = load_runs(out / "runs")
    assert partial == []
    assert len(frame) == 3 * 2 * 2  # methods x partitions x seeds
    for (method, setting), cell in frame.groupby(["method", "setting"]):
        mean, std = cell["acc"].mean(), cell["acc"].std()
        row = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
        assert f"{mean:.2f} ± {std:.2f}" in row, (method, setting, row)
    for setting in ("pathological_k2", "dirichlet_a0.1"):
        assert (out / f"curves_{setting}.png").stat().st_size > 0
        assert (out / f"curves_{setting}.pdf").stat().st_size > 0


def test_collection_lists_partial_runs_instead_of_averaging_them(tmp_path):
    done = tmp_path / "exp" / "fedavg" / "a"
    done.mkdir(parents=True)
    (done / "config.yaml").write_text("partition: {scheme: iid}\n")
    results = [{"stage": "post", "selection": "best", "weighting": "unweighted", "round": 3, "acc": 80.0,
                "loss": 0.5, "val_acc": None}]
    (done / "summary.json").write_text(json.dumps({
        "complete": True, "exp": "exp", "method": "fedavg", "dataset": "digits", "partition": "iid", "seed": 0,
        "protocol": {"stage": "post", "selection": "best", "weighting": "unweighted"}, "results": results}))
    partial = tmp_path / "exp" / "fedavg" / "b"
    partial.mkdir(parents=True)
    (partial / "config.yaml").write_text("partition: {scheme: iid}\n")
    (partial / "rounds.jsonl").write_text("")
    frame, missing = load_runs(tmp_path)
    assert list(frame["acc"]) == [80.0] and missing == [partial]
    table = mean_std_table(frame, rows="method", cols="setting")
    assert table.loc["fedavg", "iid"] == "80.00 ± 0.00"
    md = markdown_table(pd.DataFrame({"x": ["1"]}, index=pd.Index(["r"], name="method")))
    assert md.splitlines() == ["| method | x |", "|---|---|", "| r | 1 |"]
