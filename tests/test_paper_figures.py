"""FedC2I Figs. 3-4 and FedSelect Figs. 1-2 are drawn from run records, data and table CSVs (tiny runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.experiment.run import execute, run_dir_for, to_container
from bench.experiment.spec import cell_config, expand, experiment, load_spec
from common.verified_io import read_jsonl
from datasets.sources import ImageData
from scripts.fedc2i import figures as fedc2i_figures
from scripts.fedselect import figures as fedselect_figures
from tests.helpers import config, drawn_figures, plotted

ROOT = Path(__file__).resolve().parent.parent


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


def test_summary_carries_the_final_rounds_method_metrics(tmp_path):
    path = run(tmp_path, "method=fedselect", "rounds=2", "method.ltn_iters=1", "method.alt_epochs=1")
    summary = json.loads((path / "summary.json").read_text())
    last = [r for r in read_jsonl(path / "rounds.jsonl") if r["kind"] == "method"][-1]
    final = summary["final_metrics"]
    assert final["round"] == 2 and final["personal_fraction"] == last["personal_fraction"]
    assert final["personal_fraction_min"] <= final["personal_fraction"] <= final["personal_fraction_max"]
    assert "head_mask_iou" not in final and "kind" not in final  # lists stay in rounds.jsonl
    assert fedselect_figures.final_personal_fraction(path) == final["personal_fraction"]
    fedavg = run(tmp_path, "method=fedavg", "rounds=1")
    assert json.loads((fedavg / "summary.json").read_text())["final_metrics"] == {}  # records no metrics


def fig2_frame(means: dict[str, list[float]]) -> pd.DataFrame:
    """A Fig. 2 table: ``means[reading]`` = accuracy at p = 0.25, 0.5, 0.75, the same on both columns."""
    return pd.DataFrame([{"method": f"FedSelect({p:.2f}) {reading}", "column": c, "mean": m, "std": 1.0,
                          "paper_mean": None}
                         for reading, values in means.items() for p, m in zip((0.25, 0.5, 0.75), values, strict=True)
                         for c in ("CIFAR-10 s=2", "CIFAR-10 s=4")])


def test_fedselect_fig2_draws_both_readings_with_the_papers_curve_and_caption(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results" / "fedselect"
    out.mkdir(parents=True)
    frame = fig2_frame({"compounding": [70.0, 72.0, 80.0], "fixed": [71.0, 75.0, 73.0]})
    extra = pd.DataFrame([{"method": "FedAvg", "column": "CIFAR-10 s=2", "mean": 1.0}])
    pd.concat([frame, extra]).drop(columns="paper_mean").to_csv(out / "fig2.csv", index=False)
    figures = drawn_figures(monkeypatch, fedselect_figures)
    paths = fedselect_figures.fig2("mini")
    assert [p.name for p in paths] == ["fig2_accuracy_vs_p.png", "fig2_accuracy_vs_p.pdf"]
    assert all((tmp_path / p).stat().st_size > 0 for p in paths)
    # what is drawn: per column, each reading's FedSelect(p) rows (not FedAvg) against p, and the paper's curve
    paper, p = fedselect_figures.paper_curve("mini"), [0.25, 0.5, 0.75]
    accuracy = figures["fig2_accuracy_vs_p"].axes[:2]
    for ax, column in zip(accuracy, ("CIFAR-10 s=2", "CIFAR-10 s=4"), strict=True):
        assert column in ax.get_title()
        assert plotted(ax) == {"ours, compounding": (p, [70.0, 72.0, 80.0]), "ours, fixed": (p, [71.0, 75.0, 73.0]),
                               "paper (Table 1)": (p, [paper[(x, column)] for x in p])}
    # the personal-fraction panels: one line per reading, empty without runs
    assert [plotted(ax) for ax in figures["fig2_accuracy_vs_p"].axes[2:]] == [{"compounding": ([], []),
                                                                                "fixed": ([], [])}] * 2
    caption = (out / "figures" / "fig2_accuracy_vs_p.txt").read_text().splitlines()
    assert len(caption) == 2 and "fixed: best p = 0.50 by 2.0 points, beyond the std of 1.0 (holds)" in caption[1]
    assert "paper: minimal variation over p (spread 1.7 points)" in caption[0]  # Table 1's 84.22 ... 85.91
    # the paper's curve is its Table 1 FedSelect(p) rows
    assert fedselect_figures.paper_curve("mini")[(0.5, "CIFAR-10 s=4")] == 65.88


def test_fedselect_fig2_caption_checks_the_papers_claims_per_reading():
    frame = fig2_frame({"compounding": [70.0, 72.0, 80.0], "fixed": [71.0, 75.0, 73.0]})
    frame["p"] = [fedselect_figures.parse_row(m)[0] for m in frame["method"]]
    frame["reading"] = [fedselect_figures.parse_row(m)[1] for m in frame["method"]]
    frame["paper_mean"] = frame["p"].map({0.25: 65.23, 0.5: 65.88, 0.75: 62.91})
    s2, s4 = fedselect_figures.claims(frame)
    assert s4.startswith("CIFAR-10 s=4: paper: p = 0.50 best")
    assert "compounding: best p = 0.75 by 8.0 points, beyond the std of 1.0 (does not hold)" in s4
    assert "fixed: best p = 0.50 by 2.0 points, beyond the std of 1.0 (holds)" in s4
    assert "spread 3.0 points" in s2  # the paper's spread of the same rows
    assert "compounding: spread 10.0 points (does not hold)" in s2 and "fixed: spread 4.0 points (does not hold)" in s2
    assert fedselect_figures.parse_row("FedSelect(0.50)") is None  # Table 1's rows name no reading


def test_fig2_spec_shares_table1s_fedselect_cells_and_adds_the_fixed_reading():
    """The compounding rows of Fig. 2 are Table 1's FedSelect(p) cells (same exp, same config: the same runs)."""
    def cells(spec_path: Path, rows: set[str]) -> dict[tuple[str, str, int], Path]:
        spec = load_spec(spec_path)
        return {(c.row, c.column, c.seed): run_dir_for(cell_config(c)) for c in expand(spec, "mini") if c.row in rows}

    table1 = cells(fedselect_figures.SPEC, {f"FedSelect({p})" for p in ("0.25", "0.50", "0.75")})
    fig2 = cells(fedselect_figures.FIG2_SPEC, {f"FedSelect({p}) {r}" for p in ("0.25", "0.50", "0.75")
                                               for r in ("compounding", "fixed")})
    shared = {k: v for k, v in fig2.items() if k[0].endswith("compounding")}
    assert len(table1) == len(shared) == 18
    assert {(r.split()[0], c, s): v for (r, c, s), v in shared.items()} == table1
    fixed = {v for k, v in fig2.items() if k[0].endswith("fixed")}
    assert len(fixed) == 18 and not fixed & set(table1.values())
    assert all(str(v).startswith("runs/fedselect/table1/mini/fedselect/") for v in fig2.values())
    assert experiment(load_spec(fedselect_figures.SPEC)) == "fedselect/table1"  # the default: <paper>/<label>


def test_figure_commands_skip_what_has_no_runs_yet(tmp_path):
    for paper in ("fedc2i", "fedselect"):
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / paper / "figures.py"), "all"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr
        assert "skipped" in proc.stdout


def _domain(name: str, shift: float, labels: list[int]) -> ImageData:
    images = torch.stack([torch.full((3, 4, 4), shift + i / 100) for i in range(len(labels))])
    return ImageData(images=images, labels=torch.tensor(labels), classes=tuple("abcdef"), name="toy", split="train",
                     domain=name)


def test_fedc2i_fig4_shows_the_first_image_of_each_of_five_classes_per_domain(tmp_path, monkeypatch):
    domains = [_domain("standin_one", 0.0, [5, 1, 0, 2, 3, 4, 1]), _domain("standin_two", 0.5, [4, 3, 2, 1, 0, 0])]
    grid = fedc2i_figures.class_examples(domains)
    # domain one: class 0 is image 2, class 1 image 1 (the first of two); domain two: class 0 is image 4
    assert [[round(float(img[0, 0, 0]), 4) for img in row] for row in grid] == [
        [0.02, 0.01, 0.03, 0.04, 0.05], [0.54, 0.53, 0.52, 0.51, 0.5]]
    with pytest.raises(ValueError, match="no training image of class 4"):
        fedc2i_figures.class_examples([_domain("d", 0.0, [0, 1, 2, 3])])

    seen = []
    monkeypatch.setattr(fedc2i_figures, "load_sources", lambda cfg, root: (seen.append((cfg["name"], root)), (
        domains, domains))[1])
    figures = drawn_figures(monkeypatch, fedc2i_figures)
    fedc2i_figures.fig4("mini", "/data", tmp_path)
    assert seen == [("digit5_standin", "/data"), ("office10_standin", "/data")]
    drawn = figures["fig4_digit5"].axes
    assert len(drawn) == 10 and drawn[0].get_title() == "a" and drawn[0].get_ylabel() == "one"
    assert float(drawn[5].images[0].get_array()[0, 0, 0]) == pytest.approx(0.54)  # row 2, column 1: domain two, class 0
    fedc2i_figures.fig4("paper", None, tmp_path)
    assert [name for name, _ in seen[2:]] == ["digit5", "office10"]
    assert fedc2i_figures.dataset_config("digit5_standin")["options"]["size"] == 32  # interpolation resolved
