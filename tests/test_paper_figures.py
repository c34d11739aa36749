"""FedC2I Fig. 3 and FedSelect Figs. 1-2 are drawn from run records and table CSVs (tiny runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.core.records import read_jsonl
from bench.run import execute, run_dir_for, to_container
from tests.helpers import config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import fedc2i_figures  # noqa: E402
import fedselect_figures  # noqa: E402


def run(tmp_path: Path, *overrides: str) -> Path:
    cfg = config(tmp_path, *overrides)
    execute(cfg)
    return run_dir_for(to_container(cfg))


def test_fedc2i_fig3_draws_the_recorded_influence_vectors_of_the_chosen_rounds(tmp_path):
    path = run(tmp_path, "method=fedc2i", "rounds=3")
    records = fedc2i_figures.influence_records(path)
    assert sorted(records) == [1, 2, 3] and len(records[3]["influence"]) == 4
    assert all(sum(v) == pytest.approx(1.0) for v in records[3]["influence"])  # lambda_m sums to one
    out = fedc2i_figures.fig3(path, [1, 3], out=tmp_path / "fig3")
    assert [p.suffix for p in out] == [".png", ".pdf"] and all(p.stat().st_size > 0 for p in out)
    with pytest.raises(ValueError, match=r"no influence record for rounds \[7\]"):
        fedc2i_figures.fig3(path, [7], out=tmp_path / "fig3")
    with pytest.raises(ValueError, match="is it a FedC2I run"):
        fedc2i_figures.influence_records(run(tmp_path, "method=fedavg", "rounds=1"))


def test_fedc2i_fig3_rounds_follow_the_papers_scaled_to_the_run():
    assert fedc2i_figures.scaled_rounds((1, 2, 10, 20), 20, 20) == [1, 2, 10, 20]
    assert fedc2i_figures.scaled_rounds((1, 2, 10, 20), 20, 6) == [1, 2, 3, 6]
    assert fedc2i_figures.scaled_rounds((1, 4, 10, 40), 40, 6) == [1, 2, 4, 6]


def test_fedselect_records_a_symmetric_final_layer_iou_with_ones_on_the_diagonal(tmp_path):
    path = run(tmp_path, "method=fedselect", "rounds=2", "method.ltn_iters=1", "method.alt_epochs=1")
    round_, clients, iou = fedselect_figures.final_iou(path)
    assert round_ == 2 and clients == [0, 1, 2, 3]
    assert all(iou[i][i] == 1.0 and iou[i][j] == iou[j][i] for i in range(4) for j in range(4))
    assert any(iou[i][j] < 1.0 for i in range(4) for j in range(4))  # the masks differ between clients
    assert len([r for r in read_jsonl(path / "rounds.jsonl") if "head_mask_iou" in r]) == 2


def test_fedselect_fig2_reads_the_p_rows_of_the_table_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results" / "fedselect"
    out.mkdir(parents=True)
    rows = [{"method": f"FedSelect({p:.2f})", "column": c, "mean": 70 + 10 * p, "std": 1.0, "paper_mean": 80.0}
            for p in (0.25, 0.5, 0.75) for c in ("s=2", "s=4")] + [{"method": "FedAvg", "column": "s=2", "mean": 1.0}]
    pd.DataFrame(rows).to_csv(out / "table1.csv", index=False)
    paths = fedselect_figures.fig2("mini")
    assert [p.name for p in paths] == ["fig2_accuracy_vs_p.png", "fig2_accuracy_vs_p.pdf"]
    assert all((tmp_path / p).stat().st_size > 0 for p in paths)


def test_figure_commands_skip_what_has_no_runs_yet(tmp_path):
    for script in ("fedc2i_figures.py", "fedselect_figures.py"):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "all"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr
        assert "skipped" in proc.stdout
