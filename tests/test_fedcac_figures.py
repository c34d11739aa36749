"""FedCAC figure commands draw what their records hold (tiny settings): bar heights and curves from the table
CSVs, the run's overlap matrix and class mix, its partition plot, and the angles and sensitivities they train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bench.run import execute, run_dir_for, to_container
from common.verified_io import read_jsonl
from tests.helpers import config, drawn_figures, plotted

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "fedcac_figures.py"
sys.path.insert(0, str(ROOT / "scripts"))
import fedcac_figures  # noqa: E402


@pytest.fixture
def figures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return drawn_figures(monkeypatch, fedcac_figures)


def test_fig3_bars_and_fig5_sweep_are_the_table_csvs_numbers(tmp_path, figures):
    out = tmp_path / "results" / "fedcac"
    out.mkdir(parents=True)
    rows = [{"method": m, "column": c, "mean": 50.0 + i + 10 * j, "std": 1.0 + i}
            for i, m in enumerate(["A", "B"]) for j, c in enumerate(["X", "Y"])]
    pd.DataFrame(rows).to_csv(out / "fig3.csv", index=False)
    sweep = [{"method": f"tau={t}", "column": "X", "mean": 60.0 + t, "std": 0.5} for t in (0.9, 0.1, 0.5)]
    pd.DataFrame(sweep).to_csv(out / "fig5.csv", index=False)

    paths = fedcac_figures.bars("fig3", "mini", "critical-parameter selection")
    assert [str(p) for p in paths] == ["results/fedcac/figures/fig3_mini.png", "results/fedcac/figures/fig3_mini.pdf"]
    assert all(p.stat().st_size > 0 for p in paths)
    ax = figures["fig3_mini"].axes[0]
    heights = {c.get_label(): [bar.get_height() for bar in c] for c in ax.containers if hasattr(c, "patches")}
    assert heights == {"A": [50.0, 60.0], "B": [51.0, 61.0]}  # one bar per row, columns in the CSV's order
    assert [t.get_text() for t in ax.get_xticklabels()] == ["X", "Y"]
    assert "mini stand-in" in ax.get_title()

    fedcac_figures.sweep("fig5", "mini", "tau")
    assert plotted(figures["fig5_mini"].axes[0]) == {"X": ([0.1, 0.5, 0.9], [60.1, 60.5, 60.9])}  # sorted by tau

    proc = subprocess.run([sys.executable, str(SCRIPT), "fig4"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0 and "conf/paper/fedcac/fig4.yaml" in proc.stderr


def test_fig7_draws_the_runs_last_overlap_matrix_and_class_mix_and_fig8_its_partition_plot(tmp_path, figures):
    overrides = ("method=fedcac", "rounds=2", "method.overlap_matrix_every=1")
    execute(config(tmp_path, *overrides))
    run = run_dir_for(to_container(config(tmp_path, *overrides)))
    fedcac_figures.fig7(run)
    overlap, mix = figures[f"fig7_{run.name}"].axes[:2]
    last = [r for r in read_jsonl(run / "rounds.jsonl") if "overlap_matrix" in r][-1]
    assert last["round"] == 2 and overlap.get_title() == "overlap O_ij, round 2"
    np.testing.assert_array_equal(overlap.get_images()[0].get_array(), np.array(last["overlap_matrix"]))
    counts = pd.read_csv(run / "partition" / "class_counts.csv")
    train = counts[counts["part"] == "train"].set_index("client").filter(like="class_").to_numpy()
    np.testing.assert_allclose(mix.get_images()[0].get_array(), train / train.sum(1, keepdims=True))

    fedcac_figures.fig8(run)
    shown = figures[f"fig8_{run.name}"].axes[0].get_images()[0].get_array()
    np.testing.assert_array_equal(shown, plt.imread(run / "partition" / "partition.png"))


def test_fig1a_plots_an_angle_per_round_per_alpha_and_fig1b_the_held_classes_sensitivity(tmp_path, figures):
    fedcac_figures.fig1a("mini", 2)
    curves = plotted(figures["fig1a_mini"].axes[0])
    assert sorted(curves) == ["alpha=0.1", "alpha=0.5", "alpha=1.0"]
    for rounds, angles in curves.values():
        assert rounds == [1.0, 2.0] and all(0.0 < a < 180.0 for a in angles)

    fedcac_figures.fig1b("mini", 1)
    saved = json.loads((tmp_path / "results" / "fedcac" / "figures" / "fig1b.json").read_text())
    assert saved["shares"] == [4, 4, 1, 1] and len(saved["classes"]) == 4
    sensitivity = np.asarray(figures["fig1b_mini"].axes[0].get_images()[0].get_array())
    assert sensitivity.shape[0] == len(saved["row_mean"]) == 10  # one row per class of the data set
    np.testing.assert_allclose(sensitivity.mean(1), saved["row_mean"], rtol=1e-6)
    held = sensitivity.mean(1)[saved["classes"]]
    assert held.min() > 0  # the classes the client holds moved their last-layer weights
