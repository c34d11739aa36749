"""FedCAC figure commands draw what their records hold (tiny settings): bar heights and curves from the table
CSVs, the run's overlap matrix and class mix, its partition plot, and the angles and sensitivities they train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.experiment.run import execute, run_dir_for, to_container
from common.verified_io import read_jsonl
from scripts.fedcac import figures as fedcac_figures
from tests.helpers import config, drawn_figures, plotted

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "fedcac" / "figures.py"


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


def test_fig7_draws_the_runs_last_overlap_matrix_and_class_mix(tmp_path, figures):
    overrides = ("method=fedcac", "rounds=2", "method.overlap_matrix_every=1")
    execute(config(tmp_path, *overrides))
    run = run_dir_for(to_container(config(tmp_path, *overrides)))
    fedcac_figures.fig7(run)
    overlap, mix = figures[f"fig7_{run.name}"].axes[:2]
    last = [r for r in read_jsonl(run / "rounds.jsonl") if "overlap_matrix" in r][-1]
    assert last["round"] == 2 and overlap.get_title() == "overlap O_ij (i != j), round 2"
    shown, recorded = np.asarray(overlap.get_images()[0].get_array().filled(np.nan)), np.array(last["overlap_matrix"])
    off = ~np.eye(len(recorded), dtype=bool)
    np.testing.assert_array_equal(shown[off], recorded[off])  # the diagonal (1) is left out of the colour scale
    assert np.isnan(np.diag(shown)).all()
    counts = pd.read_csv(run / "partition" / "class_counts.csv")
    train = counts[counts["part"] == "train"].set_index("client").filter(like="class_").to_numpy()
    np.testing.assert_allclose(mix.get_images()[0].get_array(), train / train.sum(1, keepdims=True))


def test_fig7_of_class_mix_runs_states_the_papers_claim_from_the_overlaps(tmp_path, figures):
    mixes = [[1, 1, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]  # the synthetic data's 4 classes
    overrides = ("method=fedcac", "rounds=2", "method.overlap_matrix_every=1", "partition=class_mix",
                 f"partition.mixes={mixes}".replace(" ", ""))
    execute(config(tmp_path, *overrides))
    run = run_dir_for(to_container(config(tmp_path, *overrides)))
    paths = fedcac_figures.fig7(run, "mini")
    caption = (tmp_path / "results" / "fedcac" / "figures" / "fig7_mini.caption.txt").read_text()
    assert caption.startswith("Paper (App. A, Fig. 7)") and Path("results/fedcac/figures/fig7_mini.png") in paths
    m = np.array([r for r in read_jsonl(run / "rounds.jsonl") if "overlap_matrix" in r][-1]["overlap_matrix"])
    same, share, disjoint = m[0, 1], np.mean([m[0, 2], m[1, 2], m[2, 3]]), np.mean([m[0, 3], m[1, 3]])
    assert f"same mix {same:.3f}, a shared class {share:.3f}, disjoint {disjoint:.3f}" in caption
    assert ("holds" if same > share > disjoint else "does not hold") in caption.split("ordered as the paper says: ")[1]


def test_fig7_claims_group_the_pairs_by_how_their_mixes_relate():
    mixes = np.array([[1, 1, 0, 0], [2, 2, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=float)
    m = np.array([[1, .9, .5, .1], [.9, 1, .5, .1], [.5, .5, 1, .3], [.1, .1, .3, 1]])
    assert [fedcac_figures.mix_relation(mixes, 0, j) for j in (1, 2, 3)] == ["same", "share", "disjoint"]
    text = fedcac_figures.fig7_claims([m], mixes, "paper")
    # same: (0,1) .9; share: (0,2) .5, (1,2) .5, (2,3) .3 (mean .433); disjoint: (0,3) .1, (1,3) .1
    assert "same mix 0.900, a shared class 0.433, disjoint 0.100: ordered as the paper says: holds" in text
    assert "top partner is client 1 in 1 of 1 seeds" in text
    assert "Client 0 with 8-9" not in text  # the truck clients of the spec's 15 mixes only
    flipped = fedcac_figures.fig7_claims([1 - m + np.eye(4)], mixes, "mini")
    assert "ordered as the paper says: does not hold" in flipped


def test_fig7_finds_its_runs_through_the_tables_manifest_without_composing(tmp_path, monkeypatch):
    from bench.core.records import RunDir
    from bench.experiment import manifest
    from bench.experiment.spec import expand, load_spec

    monkeypatch.chdir(ROOT)  # the spec's includes, read from the repository; nothing is written there
    spec = load_spec(fedcac_figures.spec_path("fig7"))
    cells = expand(spec, "mini", out_dir=str(tmp_path / "runs"))
    listed = {c: tmp_path / "runs" / f"listed-{c.seed}" for c in cells}  # names no composition gives
    manifest.write_manifest(spec, "mini", listed, tmp_path / "results")

    def refuse(cell):
        raise AssertionError(f"{cell} was composed although the manifest lists it")

    monkeypatch.setattr(manifest, "composed_dir", refuse)
    monkeypatch.setattr(RunDir, "is_complete", lambda self: self.path.name.startswith("listed-"))
    found = fedcac_figures.fig7_runs("mini", str(tmp_path / "runs"), str(tmp_path / "results"))
    assert found == [listed[c] for c in cells] and found


def test_fig8_draws_each_alphas_partition_and_its_statistics(tmp_path, figures):
    paths = fedcac_figures.fig8("mini")
    table = pd.read_csv(tmp_path / "results" / "fedcac" / "figures" / "fig8_mini.csv")
    assert list(dict.fromkeys(table["column"])) == ["a=0.01", "a=0.1", "a=0.5", "a=1.0"]
    axes = figures["fig8_mini"].axes
    for ax, (column, sub) in zip(axes, table.groupby("column", sort=False), strict=True):
        counts = sub.filter(like="class_").to_numpy()
        assert counts.shape == (20, 10) and (counts.sum(1) == 500).all()
        clients, classes = np.nonzero(counts)
        np.testing.assert_array_equal(ax.collections[0].get_offsets(), np.c_[clients, classes])
        assert ax.get_title().startswith(column)
    caption = (tmp_path / "results" / "fedcac" / "figures" / "fig8_mini.caption.txt").read_text()
    assert caption.startswith("Paper (App. B, Fig. 8)") and Path("results/fedcac/figures/fig8_mini.csv") in paths


def test_fig8_stats_by_hand():
    counts = np.array([[10, 0, 0], [10, 0, 0], [0, 5, 5]])
    stats = fedcac_figures.fig8_stats(counts)
    assert stats["classes_held"] == pytest.approx(4 / 3)
    assert stats["mean_tv"] == pytest.approx((0 + 1 + 1) * 2 / 6)  # pairs (0,1) 0, (0,2) 1, (1,2) 1
    assert stats["twins"] == pytest.approx(2 / 3)  # clients 0 and 1 are each other's twin
    text = fedcac_figures.fig8_claims([("a", {"mean_tv": .9, "twins": .5, "classes_held": 1.0}),
                                       ("b", {"mean_tv": .5, "twins": 0.0, "classes_held": 5.0})])
    assert "shrinks with alpha: holds" in text and "variety grows with alpha: holds" in text
    text = fedcac_figures.fig8_claims([("a", {"mean_tv": .5, "twins": 0.0, "classes_held": 1.0}),
                                       ("b", {"mean_tv": .9, "twins": .5, "classes_held": 5.0})])
    assert "shrinks with alpha: does not hold" in text and "variety grows with alpha: does not hold" in text


def test_fig1a_plots_an_angle_per_round_per_alpha_and_fig1b_the_held_classes_sensitivity(tmp_path, figures):
    fedcac_figures.fig1a("mini", 2)
    curves = plotted(figures["fig1a_mini"].axes[0])
    assert sorted(curves) == ["alpha=0.1", "alpha=0.5", "alpha=1.0"]  # the spec's columns
    for rounds, angles in curves.values():
        assert rounds == [1.0, 2.0] and all(0.0 < a < 180.0 for a in angles)
    caption = (tmp_path / "results" / "fedcac" / "figures" / "fig1a_mini.caption.txt").read_text()
    rises = [np.mean(a[-1:]) - np.mean(a[:1]) for _, a in (curves[f"alpha={x}"] for x in (0.1, 0.5, 1.0))]
    assert ", ".join(f"{r:+.1f} deg" for r in rises) in caption.replace("alpha=0.5: ", "").replace(
        "alpha=1.0: ", "").replace("alpha=0.1: ", "")

    fedcac_figures.fig1b("mini", 1)
    saved = json.loads((tmp_path / "results" / "fedcac" / "figures" / "fig1b_mini.json").read_text())
    assert saved["classes"] == [0, 3, 5, 9] and saved["shares"] == [4, 1, 1, 4]  # the spec's 4:4:1:1 mix
    sensitivity = np.asarray(figures["fig1b_mini"].axes[0].get_images()[0].get_array())
    assert sensitivity.shape[0] == len(saved["row_mean"]) == 10  # one row per class of the data set
    np.testing.assert_allclose(sensitivity.mean(1), saved["row_mean"], rtol=1e-6)
    held = sensitivity.mean(1)[saved["classes"]]
    assert held.min() > 0  # the classes the client holds moved their last-layer weights
    caption = (tmp_path / "results" / "fedcac" / "figures" / "fig1b_mini.caption.txt").read_text()
    assert "4-share classes " + ", ".join(f"{saved['row_mean'][c]:.2e}" for c in (0, 9)) in caption
