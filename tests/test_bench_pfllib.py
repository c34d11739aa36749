"""scripts/bench_pfllib.py without running either side: merging invocations measured side by side."""

from __future__ import annotations

import json
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


META = {"command": "c", "pfllib_url": "u", "pfllib_commit": "x", "pfllib_python": "p", "our_commit": "y",
        "dirty": False, "cpu": "cpu", "cores": 2, "torch": "t", "load_before": "1", "load_after": "2",
        "split_sizes": {"train": 10000, "test": 2000}, "repeats": "2", "rounds": 10}


def test_the_post_mode_passes_eval_stages_post_to_our_runs_only():
    default = bench_pfllib.our_command("fedavg", "default", 3, Path("o"), Path("c"))
    post = bench_pfllib.our_command("fedavg", "post", 3, Path("o"), Path("c"))
    assert not any(a.startswith("eval.stages") for a in default) and "rounds=3" in default
    assert [a for a in post if a not in default] == ["eval.stages=[post]"]
    workload = bench_pfllib.our_command("fedavg", "workload", 3, Path("o"), Path("c"))
    assert [a for a in workload if a not in default] == ["eval.stages=[post]", "logger.wandb.mode=disabled"]
    theirs = bench_pfllib.with_rounds(bench_pfllib.THEIRS, 3)
    assert theirs[theirs.index("-gr") + 1] == "2" and len(theirs) == len(bench_pfllib.THEIRS)


def test_report_shows_each_of_our_modes_against_pfllib_with_what_each_side_evaluates_per_round():
    r = {"ours": {"wall": [50.0], "cpu": [40.0]}, "ours_post": {"wall": [45.0], "cpu": [36.0]},
         "theirs": {"wall": [90.0], "cpu": [72.0]}, "ours_acc": {"pre r10": 70.0, "post r10": 40.0},
         "ours_post_acc": {"post r10": 40.0}, "theirs_acc": 38.0}
    report = bench_pfllib.report({"fedavg": r}, META)
    assert "| PFLlib / ours | | **1.80x** | | **1.80x** | |" in report
    assert "| PFLlib / ours, eval.stages=[post] | | **2.00x** | | **2.00x** | |" in report
    assert "| ours, eval.stages=[post] | 45.0 | 45.0 | 36.0 | 36.0 | not recorded |" in report
    evaluation = next(line for line in report.splitlines() if line.startswith("- evaluation per round:"))
    assert "ours: 2 evaluations per round" in evaluation and "eval.stages=[post]: 1 evaluation per round" in evaluation
    assert "PFLlib: 1 evaluation per round" in evaluation and "forward pass over every client's training" in evaluation
    assert "adds `eval.stages=[post]`" in report and "ours, eval.stages=[post] post r10 40.00" in report


def test_ours_only_runs_each_mode_in_turn_without_pfllib_and_reports_the_saving(tmp_path, monkeypatch):
    order = []

    def fake_run(method, mode, rounds, out_dir, cache, log):
        order.append((method, mode, rounds))
        out_dir.mkdir(parents=True)
        (out_dir / "rounds.jsonl").write_text("")
        cpu = {"default": 30.0, "post": 27.0}[mode]
        return {"wall": cpu + 1, "cpu": cpu, "load": 0.5}, out_dir

    monkeypatch.setattr(bench_pfllib, "run_ours", fake_run)
    out = tmp_path / "modes.md"
    monkeypatch.setattr(sys, "argv", ["bench_pfllib.py", "--ours-only", "--our-eval-stages", "default", "post",
                                      "--methods", "fedavg", "--rounds", "3", "--repeats", "2", "--work",
                                      str(tmp_path / "work"), "--out", str(out)])
    bench_pfllib.main()
    assert order == [("fedavg", "default", 3), ("fedavg", "post", 3)] * 2  # interleaved
    report = out.read_text()
    assert "| ours / ours, eval.stages=[post] | | **1.11x** | | **1.11x** | |" in report and "| PFLlib" not in report
    assert "--ours-only --methods fedavg --repeats 2 --our-eval-stages default post --rounds 3" in report
    merged = bench_pfllib.merge_results([json.loads(out.with_suffix(".json").read_text())] * 2)
    assert merged["fedavg"]["ours_post"]["cpu"] == [27.0] * 4


def test_the_report_names_the_cpu_kernels_both_sides_ran_with():
    """The kernel caps move both sides' seconds and the ratio, so the report states them; older reports say they
    were not recorded."""
    caps = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "PATH": "/bin"}
    assert bench_pfllib.kernel_setting("AVX2", caps) == (
        "torch CPU capability AVX2; ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2")
    assert bench_pfllib.kernel_setting("AVX512", {}) == "torch CPU capability AVX512; no caps set (the defaults)"
    merged = bench_pfllib.merge_results([part("fedavg", 10.0, 30.0, 70.0)])
    assert "- CPU kernels (both sides run in this environment): torch CPU capability AVX2; x" in bench_pfllib.report(
        merged, {**META, "kernels": "torch CPU capability AVX2; x"})
    assert "- CPU kernels (both sides run in this environment): not recorded" in bench_pfllib.report(merged, META)
