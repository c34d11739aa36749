"""End to end: the demo script on a shortened schedule, and collection of its runs."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.core.summary import pick
from bench.render import markdown_table

ROOT = Path(__file__).resolve().parent.parent


def accuracies(runs: Path) -> dict[tuple[str, str], list[float]]:
    """(method, partition) -> each complete run's accuracy under its own protocol, read from its summary."""
    out: dict[tuple[str, str], list[float]] = {}
    for path in sorted(runs.rglob("summary.json")):
        summary = json.loads(path.read_text())
        assert summary["complete"], path
        proto = summary["protocol"]
        acc = pick(summary["results"], proto["stage"], proto["selection"], proto["weighting"])["acc"]
        out.setdefault((summary["method"], summary["partition"]), []).append(acc)
    return out


def test_demo_writes_a_table_and_curves_from_its_own_records(tmp_path):
    out = tmp_path / "demo"
    # 2 rounds do not train: no chance verdict (eval.chance_z=null)
    proc = subprocess.run([sys.executable, "scripts/demo.py", "--out", str(out), "--seeds", "0", "1", "--", "rounds=2",
                           "num_clients=6", "cache_dir=null", "eval.chance_z=null"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    table = (out / "table.md").read_text()
    accs = accuracies(out / "runs")
    assert sorted(accs) == [(m, p) for m in ("fedavg", "fedprox", "local") for p in ("dirichlet", "pathological")]
    assert all(len(values) == 2 for values in accs.values())  # seeds
    for (method, partition), values in accs.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
        assert f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" in row, (method, partition, row)
    for setting in ("pathological_k2", "dirichlet_a0.1"):
        assert (out / f"curves_{setting}.png").stat().st_size > 0
        assert (out / f"curves_{setting}.pdf").stat().st_size > 0


def test_markdown_table_has_the_index_name_a_separator_and_a_line_per_row():
    md = markdown_table(pd.DataFrame({"x": ["1"]}, index=pd.Index(["r"], name="method")))
    assert md.splitlines() == ["| method | x |", "|---|---|", "| r | 1 |"]
