"""Table specs: expansion, validation before any run, reuse of finished cells, paper column, partial runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.table import collect, expand, load_spec, run_cells, write_table

ROOT = Path(__file__).resolve().parent.parent
SPEC = """
paper: fedcac
table: "1"
title: toy
protocol: {stage: post, selection: best, weighting: unweighted}
seeds: [0, 1]
base: [rounds=2, num_clients=4, train.batch_size=10, cache_dir=null, quiet=true, partition.n_train=40,
       partition.n_test=20]
columns:
  - {name: A, dataset: synthetic, model: small_cnn, overrides: [partition=pathological],
     paper: {dataset: cifar10, setting: pathological-2}}
rows:
  - {name: FedAvg, overrides: [method=fedavg]}
  - {name: Separate, overrides: [method=local], by_dataset: {synthetic: [train.lr=0.2]}}
  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}
scales:
  mini:
    seeds: [0]
    base: [rounds=1]
"""


def spec_file(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return path


def test_expand_cells_and_overrides(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"))
    assert [(c.row, c.seed) for c in cells] == [("FedAvg", 0), ("FedAvg", 1), ("Separate", 0), ("Separate", 1)]
    sep = cells[2].overrides
    assert "train.lr=0.2" in sep and "method=local" in sep and sep[-1] == "seed=0"
    assert "exp=fedcac/table1/paper" in sep and "eval.primary.selection=best" in sep
    mini = expand(spec, "mini", out_dir=str(tmp_path / "runs"))
    assert len(mini) == 2 and "rounds=1" in mini[0].overrides and "exp=fedcac/table1/mini" in mini[0].overrides
    with pytest.raises(ValueError, match="scale='huge'"):
        expand(spec, "huge")


def test_a_bad_cell_fails_before_any_run(tmp_path):
    spec = load_spec(spec_file(tmp_path, SPEC.replace("train.lr=0.2", "train.lr=0.2, participation=7")))
    with pytest.raises(ValueError, match="participation=7"):
        run_cells(expand(spec, "paper", out_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists()


def test_table_runs_missing_cells_and_shows_the_paper_beside_ours(tmp_path, capsys):
    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"))
    dirs = run_cells(cells)
    assert "4 to run" in capsys.readouterr().out
    run_cells(cells)
    assert "4 finished, 0 to run" in capsys.readouterr().out  # finished cells are reused
    # a partial run (killed mid-way) is listed, never averaged in
    (dirs[cells[1]] / "summary.json").unlink()
    frame, problems = collect(spec, "paper", dirs)
    fedavg = frame[frame["method"] == "FedAvg"].iloc[0]
    only_seed0 = json.loads((dirs[cells[0]] / "summary.json").read_text())["primary"]["acc"]
    assert fedavg["seeds"] == 1 and fedavg["mean"] == pytest.approx(only_seed0)
    assert fedavg["paper_mean"] == 54.33 and fedavg["paper_std"] == 3.03  # FedCAC Table 1, CIFAR-10
    assert any(p.startswith("partial: FedAvg | A | seed 1") for p in problems)
    assert any("not run: pFedGate" in p for p in problems)
    md = write_table(spec, "paper", frame, problems, tmp_path / "results").read_text()
    assert "| method | A (ours) | A (paper) |" in md
    assert "54.33 ± 3.03" in md and "Not averaged in" in md
    for suffix in (".csv", ".tex"):
        assert (tmp_path / "results" / "fedcac" / "paper-scale" / f"table1{suffix}").exists()
    tex = (tmp_path / "results" / "fedcac" / "paper-scale" / "table1.tex").read_text()
    assert r"54.33 $\pm$ 3.03" in tex and r"\begin{tabular}" in tex and "pFedGate" in tex


def test_mini_tables_are_labelled_as_stand_ins(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    dirs = run_cells(expand(spec, "mini", out_dir=str(tmp_path / "runs")))
    frame, problems = collect(spec, "mini", dirs)
    md = write_table(spec, "mini", frame, problems, tmp_path / "results").read_text()
    assert "Mini-scale stand-in" in md and (tmp_path / "results" / "fedcac" / "table1.md").exists()


@pytest.mark.parametrize("table", ["table1", "table2", "table3", "table4", "fig3", "fig4", "fig5", "fig6"])
def test_fedcac_specs_expand_and_validate_at_both_scales(table):
    spec = load_spec(ROOT / "conf" / "paper" / "fedcac" / f"{table}.yaml")
    for scale in ("mini", "paper"):
        cells = expand(spec, scale)
        assert cells
        run_cells(cells, dry_run=True)  # composes and validates every cell
