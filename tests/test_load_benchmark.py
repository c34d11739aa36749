"""scripts/load_benchmark.py without its measurements: the interleaved schedule, the busy processes' lifetime and
the summary arithmetic (the measurement itself is `python scripts/load_benchmark.py`, results/bench/load.md)."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import load_benchmark  # noqa: E402


def test_schedule_interleaves_the_cases_and_balances_their_positions() -> None:
    order = load_benchmark.schedule(2, [1, 2])
    cases = {(c, t) for c in load_benchmark.CONDITIONS for t in (1, 2)}
    assert sorted(order) == sorted(list(cases) * 2)
    first = order[:4]
    assert all(a[0] != b[0] for a, b in zip(first, first[1:], strict=False))  # alone and busy alternate
    assert [t for _, t in first] == [1, 1, 2, 2]
    positions = {case: statistics.mean(i for i, c in enumerate(order) if c == case) for case in cases}
    assert len(set(positions.values())) == 1, positions  # a linear drift of the load hits every case alike


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_busy_processes_run_during_the_block_and_are_gone_after() -> None:
    with load_benchmark.busy(2) as pids:
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    assert not any(pid_alive(p) for p in pids)
    with load_benchmark.busy(0) as none:
        assert none == []


def test_summary_and_ratios() -> None:
    cases = [{"condition": c, "threads": t, "run_s": s, "wall_s": s + 1, "cpu_s": s, "load_before": 1.0}
             for c, t, s in [("alone", 1, 10), ("alone", 1, 12), ("busy", 1, 15), ("busy", 1, 13),
                             ("alone", 2, 20), ("alone", 2, 20), ("busy", 2, 60), ("busy", 2, 80)]]
    rows = load_benchmark.summarize(cases, [1, 2])
    by = {(r["condition"], r["threads"]): r for r in rows}
    assert by["alone", 1]["run_s_median"] == 11 and by["busy", 2]["run_s_all"] == [60, 80]
    assert load_benchmark.ratios(rows) == {"busy/alone at threads=1": 1.27, "busy/alone at threads=2": 3.5,
                                           "threads=2 / threads=1 alone": 1.82, "threads=2 / threads=1 busy": 5.0}
