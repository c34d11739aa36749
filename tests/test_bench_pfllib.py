"""scripts/bench_pfllib.py without running either side: merging invocations measured side by side."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_pfllib  # noqa: E402


def part(method: str, ours: float, theirs: float, acc: float) -> dict:
    side = {"ours": {"wall": [ours], "cpu": [ours / 2]}, "theirs": {"wall": [theirs], "cpu": [theirs / 2]}}
    return {"meta": {"repeats": 1}, "results": {method: {**side, "ours_acc": {"post r10": acc}, "theirs_acc": acc}}}


def test_merge_pools_the_runs_of_a_method_from_several_invocations():
    parts = [part("fedavg", 10.0, 30.0, 70.0), part("fedcac", 20.0, 50.0, 60.0), part("fedavg", 12.0, 28.0, 71.0)]
    merged = bench_pfllib.merge_results(parts)
    assert merged["fedavg"]["ours"] == {"wall": [10.0, 12.0], "cpu": [5.0, 6.0]}
    assert merged["fedavg"]["theirs"] == {"wall": [30.0, 28.0], "cpu": [15.0, 14.0]}
    assert merged["fedavg"]["ours_acc"] == {"post r10": 70.0}  # the first invocation's
    assert merged["fedcac"]["ours"]["wall"] == [20.0]
    assert parts[0]["results"]["fedavg"]["ours"]["wall"] == [10.0]  # the inputs are left as they were
    report = bench_pfllib.report(merged, {
        "command": "c", "pfllib_url": "u", "pfllib_commit": "x", "pfllib_python": "p", "our_commit": "y",
        "dirty": False, "cpu": "cpu", "cores": 2, "torch": "t", "load_before": "1", "load_after": "2",
        "split_sizes": {"train": 10000, "test": 2000}, "repeats": "1 + 1"})
    assert "| ours | 10.0 / 12.0 | 11.0 |" in report and "**2.64x**" in report  # median 29 / median 11


def test_report_names_the_load_average_at_each_runs_start():
    """Each run's 1-minute load average at its start is pooled like its seconds and shown beside them; reports
    written before it was recorded say so."""
    parts = [part("fedavg", 10.0, 30.0, 70.0), part("fedavg", 12.0, 28.0, 71.0)]
    for p, load in zip(parts, (0.5, 3.25), strict=True):
        for side in ("ours", "theirs"):
            p["results"]["fedavg"][side]["load"] = [load]
    merged = bench_pfllib.merge_results(parts)
    assert merged["fedavg"]["ours"]["load"] == [0.5, 3.25]
    meta = {"command": "c", "pfllib_url": "u", "pfllib_commit": "x", "pfllib_python": "p", "our_commit": "y",
            "dirty": False, "cpu": "cpu", "cores": 2, "torch": "t", "load_before": "1", "load_after": "2",
            "split_sizes": {"train": 10000, "test": 2000}, "repeats": "1 + 1"}
    assert "| ours | 10.0 / 12.0 | 11.0 | 5.0 / 6.0 | 5.5 | 0.5 / 3.2 |" in bench_pfllib.report(merged, meta)
    old = bench_pfllib.merge_results([part("fedavg", 10.0, 30.0, 70.0)])
    assert "| 5.0 | 5.0 | not recorded |" in bench_pfllib.report(old, meta)
