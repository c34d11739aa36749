"""The scale benchmark (scripts/scale.py): its sweeps, one measured point, and its report (the measurement itself is
`make scale`, results/bench/scale.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import scale  # noqa: E402


def test_the_client_sweep_keeps_the_participants_per_round_fixed():
    points = scale.sweep_points("clients")
    assert {p["clients"] for p in points} == {10, 100, 1000, 10000}
    assert {(p["method"], p["storage"]) for p in points if p["clients"] == 10000} >= {("local", "file"),
                                                                                        ("fedcac", "file")}
    for p in points:
        participation = float(next(o for o in p["overrides"] if o.startswith("participation="))
                              .split("=")[1])
        assert round(participation * p["clients"]) == min(10, p["clients"])
    with pytest.raises(ValueError, match="no sweep 'clientz'"):
        scale.sweep_points("clientz")


def test_one_point_measures_a_file_table_and_the_report_lists_it_and_a_failure(tmp_path):
    spec = scale.point("clients", "local", 10, "small_cnn", "file")
    spec["overrides"] = [*spec["overrides"], "client_state.memory_mb=0.01"]  # the 10 clients' table: a file
    result = scale.measure(spec)
    assert result["participants"] == 10 and result["parameters"] == 38282
    assert result["file_mb"] == pytest.approx(10 * 38282 * 4 / 2**20, abs=0.1)
    assert result["round_s"] > 0 and result["eval_s"] > 0 and result["peak_rss_mb"] > 0
    failed = {**scale.point("model", "local", 100, "resnet18", "memory"), "error": "timed out after 600 s"}
    meta = {"machine": "m", "torch": "t", "command": "c", "seconds": 1.0, "cpu_s": 1.0}
    text = scale.markdown([result, failed], meta)
    assert "| local | 10 | 10 | small_cnn | 38282 | file |" in text
    assert "| local | 100 |  | resnet18 |  | memory |  | timed out after 600 s |" in text
    scale.figure([result, failed], tmp_path / "scale")
    assert (tmp_path / "scale.png").stat().st_size > 0
