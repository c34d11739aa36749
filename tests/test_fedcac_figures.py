"""FedCAC figure commands produce their files from records (tiny settings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.run import execute, run_dir_for, to_container
from tests.helpers import config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "fedcac_figures.py"


def figure(tmp_path: Path, *args: str) -> list[str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert paths and all((tmp_path / p).stat().st_size > 0 for p in paths)
    return paths


def test_fig3_to_fig6_from_table_csvs(tmp_path):
    out = tmp_path / "results" / "fedcac"
    out.mkdir(parents=True)
    rows = [{"method": m, "column": c, "mean": 50.0 + i, "std": 1.0} for i, m in enumerate(["A", "B"])
            for c in ["X", "Y"]]
    pd.DataFrame(rows).to_csv(out / "fig3.csv", index=False)
    sweep = [{"method": f"tau={t}", "column": "X", "mean": 60.0 + t, "std": 0.5} for t in (0.1, 0.5, 0.9)]
    pd.DataFrame(sweep).to_csv(out / "fig5.csv", index=False)
    assert figure(tmp_path, "fig3") == ["results/fedcac/figures/fig3_mini.png", "results/fedcac/figures/fig3_mini.pdf"]
    figure(tmp_path, "fig5")
    proc = subprocess.run([sys.executable, str(SCRIPT), "fig4"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0 and "conf/paper/fedcac/fig4.yaml" in proc.stderr


def test_fig7_and_fig8_from_a_fedcac_run(tmp_path):
    overrides = ("method=fedcac", "rounds=2", "method.overlap_matrix_every=1")
    execute(config(tmp_path, *overrides))
    run = run_dir_for(to_container(config(tmp_path, *overrides)))
    figure(tmp_path, "fig7", "--run", str(run))
    figure(tmp_path, "fig8", "--run", str(run))


def test_fig1a_and_fig1b_train_what_they_plot(tmp_path):
    figure(tmp_path, "fig1a", "--rounds", "2")
    figure(tmp_path, "fig1b", "--epochs", "1")
    assert (tmp_path / "results" / "fedcac" / "figures" / "fig1b.json").exists()
