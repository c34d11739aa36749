"""End to end: the demo (one column of FedCAC Table 1) on a shortened schedule, and collection of its runs."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench.core.summary import pick
from bench.experiment.report import discover

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from demo import CONFIG, demo_spec  # noqa: E402

pytestmark = pytest.mark.slow  # runs the demo


def accuracies(runs: Path) -> dict[str, list[float]]:
    """method -> each complete run's accuracy under its own protocol, read from its summary."""
    out: dict[str, list[float]] = {}
    for path in sorted(runs.rglob("summary.json")):
        summary = json.loads(path.read_text())
        assert summary["complete"], path
        proto = summary["protocol"]
        out.setdefault(summary["method"], []).append(
            pick(summary["results"], proto["stage"], proto["selection"], proto["weighting"])["acc"])
    return out


def test_demo_writes_a_paper_table_a_figure_and_a_page_and_no_committed_result(tmp_path):
    out = tmp_path / "demo"
    committed = {p: p.read_bytes() for p in (ROOT / "results").glob("*/table1.*")}
    # 2 rounds do not train: no chance verdict (eval.chance_z=null)
    proc = subprocess.run([sys.executable, "scripts/demo.py", "--out", str(out), "--seeds", "0", "1", "--launcher",
                           "inline", "--", "rounds=2", "cache_dir=null", "eval.chance_z=null"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    spec = demo_spec(OmegaConf.to_container(OmegaConf.load(CONFIG)))
    table = (out / spec["paper"] / "table1.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| method |"))
    assert header == "| method | CIFAR-10 (ours) | CIFAR-10 (paper) |"  # one column, ours beside the paper's
    accs = accuracies(out / "runs")
    assert len(accs) == len(spec["rows"]) and all(len(v) == 2 for v in accs.values())  # every row, 2 seeds
    for method, values in accs.items():
        row = next(r["name"] for r in spec["rows"] if f"method={method}" in r["overrides"])
        line = next(line for line in table.splitlines() if line.startswith(f"| {row} |"))
        assert f"| {statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} |" in line, (row, line)
        assert "(paper" not in line and line.count("±") == 2  # the paper's mean ± std in its own column
    stats = json.loads((out / spec["paper"] / "table1.stats.json").read_text())
    assert [o["column"] for o in stats["ordering"]] == ["CIFAR-10"] and stats["ordering"][0]["rows"] == 7
    assert {p["other"] for p in stats["paired"]} == {r["name"] for r in spec["rows"]} - {"FedCAC"}
    assert "Kendall" in table and ("✓" in table or "✗" in table)
    assert (out / spec["paper"] / "figures" / "curves" / "table1_CIFAR-10.png").stat().st_size > 0
    page = (out / "index.html").read_text()
    assert "<h1>pflrepro demo</h1>" in page and "table1_CIFAR-10.png" in page and "14 runs, 14 of them" in page
    assert {p: p.read_bytes() for p in (ROOT / "results").glob("*/table1.*")} == committed


def test_demo_refuses_a_column_its_table_does_not_have(tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text("spec: conf/paper/fedcac/table1.yaml\nscale: mini\ncolumns: [CIFAR10]\n")
    proc = subprocess.run([sys.executable, "scripts/demo.py", "--out", str(tmp_path / "out"), "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "columns=['CIFAR10']" in proc.stderr and "'CIFAR-10'" in proc.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="unknown key"):
        demo_spec({"spec": "conf/paper/fedcac/table1.yaml", "scale": "mini", "rows": ["FedAvg"]})


def test_the_results_page_leaves_out_the_demo_which_has_its_own(tmp_path):
    (tmp_path / "demo" / "fedcac" / "figures").mkdir(parents=True)
    (tmp_path / "demo" / "fedcac" / "figures" / "curves.png").write_bytes(b"png")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.md").write_text("# bench\n")
    assert [s.name for s in discover(tmp_path)] == ["bench"]
