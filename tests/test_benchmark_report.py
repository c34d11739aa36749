"""scripts/benchmark.py without its measurements: the eager-vs-compiled verdicts (break-even arithmetic, the
noise caveat) and bench.md assembled from bench.json and compile.json (the measurement itself is `make bench`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import benchmark  # noqa: E402


def compile_row(eager: list[float], compiled: list[float], compile_cold: float, compile_warm: float) -> dict:
    eager_s, compiled_s = sorted(eager)[len(eager) // 2], sorted(compiled)[len(compiled) // 2]
    saving = eager_s - compiled_s
    return {"workload": "w", "clients": 10, "eager_s_per_round": eager_s, "compiled_s_per_round": compiled_s,
            "speedup": round(eager_s / compiled_s, 3), "compile_s_cold": compile_cold, "compile_s_warm": compile_warm,
            "eager_first_round_s": 1.0, "compiled_first_round_cold_s": 2.0, "compiled_first_round_warm_s": 1.5,
            "break_even_rounds_cold": round(compile_cold / saving, 1) if saving > 0 else None,
            "break_even_rounds_warm": round(compile_warm / saving, 1) if saving > 0 else None,
            "eager_round_s": eager, "compiled_round_s": compiled}


def test_verdict_gives_the_break_even_when_compile_pays_and_says_never_when_it_does_not() -> None:
    pays = benchmark.verdict(compile_row([10.0, 10.2, 10.1], [8.1, 8.1, 8.1], 20.0, 2.0))
    assert "compiled rounds take 20% less time" in pays and "ahead after 10.0 rounds (1.0 warm)" in pays
    assert "noise" not in pays  # 8.1 is outside the eager rounds' range 10.0-10.2
    slower = benchmark.verdict(compile_row([5.0, 5.1, 5.2], [6.0, 6.1, 6.2], 18.0, 1.6))
    assert "not faster" in slower and "18.0 s of compilation" in slower
    within = benchmark.verdict(compile_row([5.0, 6.0, 7.0], [5.5, 5.6, 5.4], 18.0, 1.6))
    assert "within this machine's noise" in within


def test_bench_md_has_a_section_per_result_file_with_its_machine_and_command(tmp_path: Path) -> None:
    meta = {"machine": "x86_64", "processor": "cpu", "cores": 2, "load_avg_at_start": [0.1, 0.2, 0.3],
            "torch": "t", "threads": 1}
    naive = {**meta, "command": "python scripts/benchmark.py --parts naive",
             "results": [{"workload": "small", "clients": 10, "engine_s_per_round": 1.5, "naive_s_per_round": 3.0,
                          "speedup": 2.0, "engine_peak_rss_mb": 100.0, "engine_training_rss_growth_mb": 10.0,
                          "naive_peak_rss_mb": 120.0, "naive_training_rss_growth_mb": 30.0}]}
    (tmp_path / "bench.json").write_text(json.dumps(naive))
    benchmark.write_bench_md(tmp_path)
    only_naive = (tmp_path / "bench.md").read_text()
    assert "## Engine vs naive loop" in only_naive and "| small | 10 | 1.5 | 3.0 | 2.0 |" in only_naive
    assert "Eager vs compiled" not in only_naive and "--parts naive" in only_naive
    row = compile_row([10.0, 10.2, 10.1], [8.1, 8.1, 8.1], 20.0, 2.0)
    compiled = {**meta, "command": "python scripts/benchmark.py --parts compile", "results": [row],
                "verdicts": [benchmark.verdict(row)]}
    (tmp_path / "compile.json").write_text(json.dumps(compiled))
    benchmark.write_bench_md(tmp_path)
    both = (tmp_path / "bench.md").read_text()
    assert both.index("## Engine vs naive loop") < both.index("## Eager vs compiled")
    assert "| w | 10 | 10.1 | 8.1 | 1.247 | 20.0 / 2.0 | 10.0 / 1.0 |" in both and "- w: compiled rounds" in both
