"""Table specs: expansion, validation before any run, reuse of finished cells, paper column, partial runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.experiment.cells import run_cells
from bench.experiment.collect import collect
from bench.experiment.render import write_table
from bench.experiment.spec import expand, load_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = """
paper: fedcac
table: "1"
title: toy
protocol: {stage: post, selection: best, weighting: unweighted}
seeds: [0, 1]
base: [rounds=2, num_clients=4, train.batch_size=10, cache_dir=null, quiet=true, logger.wandb.mode=disabled,
       partition.n_train=40,
       partition.n_test=20,
       eval.chance_z=null]  # toy runs test the machinery and do not train: no "did not train" verdict
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
# every row searched over two steps relative to its own (Separate's: 0.2 in column A)
TUNING = ("tuning:\n  seeds: [7]\n  val_fraction: 0.25\n  lr_factors_alone: [1.0, 0.005]\n"
          "  grid: {FedAvg: null, Separate: null}\n")


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
    spec["scales"]["mini"]["column_overrides"] = {"A": ["partition.classes_per_client=3"]}
    over = expand(spec, "mini", out_dir=str(tmp_path / "runs"))[0].overrides  # after the column's own overrides
    assert over.index("partition.classes_per_client=3") == over.index("partition=pathological") + 1
    # by the column's paper data set (a stand-in shared by several tables): column-level, then row-level
    spec["scales"]["mini"]["by_dataset"] = {"synthetic": ["partition.n_train=41"], "cifar100": ["never=1"]}
    spec["scales"]["mini"]["rows_by_dataset"] = {"FedAvg": {"synthetic": ["train.epochs=2"]}, "NoSuchRow": {}}
    fedavg, separate = (expand(spec, "mini", out_dir=str(tmp_path / "runs"), seeds=[0])[i].overrides for i in (0, 1))
    assert fedavg.index("partition.n_train=41") == fedavg.index("partition.classes_per_client=3") - 1
    assert "train.epochs=2" in fedavg and "train.epochs=2" not in separate and "never=1" not in fedavg
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


# every paper spec at every scale is composed, validated and its partitions built: tests/test_dry_build.py


MEDIUM = SPEC.replace("""columns:
  - {name: A,""", """columns:
  - {name: B, dataset: synthetic, model: small_cnn, overrides: [partition=pathological]}
  - {name: A,""") + """  medium:
    columns: [A]
    seeds: [0, 1]
    base: [rounds=3]
    datasets: {synthetic: digits}
    model: small_cnn
    rows: {FedAvg: [train.lr=0.01]}
"""


def test_medium_scale_runs_its_columns_with_its_block_and_writes_under_medium(tmp_path):
    spec = load_spec(spec_file(tmp_path, MEDIUM))
    cells = expand(spec, "medium", out_dir=str(tmp_path / "runs"))
    assert {c.column for c in cells} == {"A"} and {c.seed for c in cells} == {0, 1}
    fedavg = next(c for c in cells if c.row == "FedAvg")
    assert "rounds=3" in fedavg.overrides and "dataset=digits" in fedavg.overrides
    assert fedavg.overrides.index("train.lr=0.01") > fedavg.overrides.index("method=fedavg")
    assert "exp=fedcac/table1/medium" in fedavg.overrides
    assert {c.column for c in expand(spec, "paper")} == {"A", "B"}  # the paper scale keeps every column
    dirs = run_cells(cells)
    frame, problems = collect(spec, "medium", dirs)
    path = write_table(spec, "medium", frame, problems, tmp_path / "results")
    assert path.parent == tmp_path / "results" / "fedcac" / "medium"
    md = path.read_text()
    assert "Medium scale" in md and "synthetic → digits" in md and "| B" not in md


def test_a_scale_naming_an_unknown_column_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"scales.medium.columns names no column \['C'\]"):
        expand(load_spec(spec_file(tmp_path, MEDIUM.replace("columns: [A]", "columns: [A, C]"))), "medium")
    with pytest.raises(ValueError, match="has no medium scale"):
        expand(load_spec(spec_file(tmp_path)), "medium")


def test_tuning_picks_the_best_validation_point_and_the_final_seeds_use_it(tmp_path):
    from bench.experiment.launch import load_launcher
    from bench.experiment.tuning import grid_points, tune

    assert grid_points({"a": [1, 2], "b": [3]}) == [["a=1", "b=3"], ["a=2", "b=3"]]
    text = SPEC + TUNING
    spec = load_spec(spec_file(tmp_path, text))
    tuned = tune(spec, "paper", load_launcher("inline"), str(tmp_path / "runs"), (), tmp_path / "results")
    report = json.loads((tmp_path / "results" / "fedcac" / "paper-scale" / "table1.tuning.json").read_text())
    points = [r for r in report["results"] if "point" in r and r["row"] == "Separate"]
    # the relative steps resolved against Separate's own step in column A (by_dataset synthetic: 0.2)
    assert [(r["point"], r["overrides"]) for r in points] == [(["train.lr=×1"], ["train.lr=0.2"]),
                                                               (["train.lr=×0.005"], ["train.lr=0.001"])]
    scores = {r["overrides"][0]: r["val_acc"] for r in points}
    chosen = next(r for r in report["results"] if "chosen" in r and r["row"] == "Separate")
    assert chosen["chosen"] == [max(scores, key=scores.get)] and chosen["val_acc"] == max(scores.values())
    assert chosen["points"] == 2 and {r["row"] for r in report["results"]} == {"FedAvg", "Separate"}
    separate = next(r for r in tuned["rows"] if r["name"] == "Separate")
    assert separate["tuned"] == {"A": chosen["chosen"]} and separate["searched"] == 2
    final = [c for c in expand(tuned, "paper", out_dir=str(tmp_path / "runs")) if c.row == "Separate"]
    assert [c.seed for c in final] == [0, 1] and all(c.overrides[-2] == chosen["chosen"][0] for c in final)
    md = write_table(tuned, "paper", *collect(tuned, "paper", run_cells(final)), tmp_path / "results").read_text()
    assert f"- Separate | A: {chosen['chosen'][0]}" in md
    assert "- Search budget: 2 points for every row on the tuning seeds [7]" in md  # the caption states the budget
    assert "✓" in (tmp_path / "results" / "fedcac" / "paper-scale" / "table1.tuning.md").read_text()
    # the collector alone (make collect) reads the search's choices and finds the table's runs
    from bench.experiment.collect import main as collect_main
    collect_main([str(spec_file(tmp_path, text)), "--scale", "paper", "--out-dir", str(tmp_path / "runs"),
                  "--results", str(tmp_path / "results"), "--seeds", "0", "1"])
    again = (tmp_path / "results" / "fedcac" / "paper-scale" / "table1.md").read_text()
    assert f"- Separate | A: {chosen['chosen'][0]}" in again and "missing: Separate" not in again
    assert "- Search budget: 2 points for every row" in again  # with_tuned read each row's searched points
    tuning_runs = [p for p in (tmp_path / "runs").rglob("summary.json") if "-s7-" in str(p)]
    assert len(tuning_runs) == 4  # one per row and point, on the tuning seed only
    with pytest.raises(ValueError, match="tuning.grid names rows \\['Nope'\\]"):
        tune(load_spec(spec_file(tmp_path, text.replace("Separate: null", "Separate: null, Nope: null"))), "paper",
             load_launcher("inline"))
    with pytest.raises(ValueError, match="leaves out rows \\['FedAvg'\\]: every row gets the same search"):
        tune(load_spec(spec_file(tmp_path, text.replace("FedAvg: null, ", ""))), "paper", load_launcher("inline"))


def test_the_dry_run_counts_the_search_then_the_final_cells_at_its_picks(tmp_path, capsys):
    # the dry run used to skip the search and count the tuned rows' final cells at their own values, so a table
    # whose search and final seeds had all finished was reported with cells "to run"
    from bench.experiment.table import main as table_main

    text = SPEC + TUNING
    args = [str(spec_file(tmp_path, text)), "--scale", "paper", "--launcher", "inline", "--dry-run", "--no-cost",
            "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    assert table_main(args) == 0
    out = capsys.readouterr().out
    assert "tuning: 4 grid points (2 rows x 2 each) x 1 columns x 1 seeds\n4 cells, 0 finished, 4 to run" in out
    assert "the search has not finished" in out and "4 cells, 0 finished, 4 to run" in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()  # nothing run or written
    assert table_main([a for a in args if a not in ("--dry-run", "--no-cost")]) == 0  # search, then the table
    report = json.loads((tmp_path / "results" / "fedcac" / "paper-scale" / "table1.tuning.json").read_text())
    chosen = {r["row"]: r["chosen"] for r in report["results"] if "chosen" in r}
    capsys.readouterr()
    assert table_main(args) == 0
    out = capsys.readouterr().out
    assert out.count("4 cells, 4 finished, 0 to run") == 2  # the search, then the final cells
    assert ("the search has finished; the final cells below at the points it picks "
            f"(FedAvg | A: {chosen['FedAvg'][0]}; Separate | A: {chosen['Separate'][0]})") in out


def test_tuning_searches_and_chooses_only_the_columns_of_its_scale(tmp_path):
    # a scale running a subset of the columns (scales.medium.columns: [A]) used to fail with a KeyError on the
    # columns it does not run
    import bench.experiment.tuning
    from bench.experiment.launch import load_launcher

    text = MEDIUM + TUNING
    tuned = bench.experiment.tuning.tune(load_spec(spec_file(tmp_path, text)), "medium", load_launcher("inline"),
                              str(tmp_path / "runs"), (), tmp_path / "results")
    separate = next(r for r in tuned["rows"] if r["name"] == "Separate")
    assert list(separate["tuned"]) == ["A"]
    report = json.loads((tmp_path / "results" / "fedcac" / "medium" / "table1.tuning.json").read_text())
    assert {r["column"] for r in report["results"]} == {"A"} and len(report["results"]) == 6  # 2 rows x (2 + choice)


def test_spec_include_list_merges_in_order_and_names_a_missing_file(tmp_path):
    (tmp_path / "_setup.yaml").write_text("seeds: [0, 1, 2]\nscales: {mini: {seeds: [0], base: [rounds=1]}}\n")
    (tmp_path / "_standin.yaml").write_text("scales: {mini: {seeds: [5, 6], base: [rounds=3]}}\n")
    body = SPEC.replace("seeds: [0, 1]\n", "", 1).split("scales:")[0]
    spec_path = tmp_path / "toy.yaml"
    spec_path.write_text("include: [_setup.yaml, _standin.yaml]\n" + body)
    spec = load_spec(spec_path)
    assert spec["seeds"] == [0, 1, 2]  # from the first file
    assert spec["scales"]["mini"] == {"seeds": [5, 6], "base": ["rounds=3"]}  # the later file wins
    assert [c.seed for c in expand(spec, "mini", out_dir=str(tmp_path / "runs"))][:2] == [5, 6]
    spec_path.write_text("include: _setup.yaml\nseeds: [4]\n" + body)  # one file; the spec itself wins
    assert load_spec(spec_path)["seeds"] == [4]
    spec_path.write_text("include: [_setup.yaml, _nowhere.yaml]\n" + body)
    with pytest.raises(ValueError, match="include names '_nowhere.yaml'"):
        load_spec(spec_path)


def test_scale_rows_by_column_reach_only_that_row_and_column(tmp_path):
    extra_column = ("  - {name: B, dataset: synthetic, model: small_cnn, overrides: [partition=iid],\n"
                    "     paper: {dataset: cifar10, setting: pathological-2}}\n")
    two_columns = SPEC.replace("rows:\n", extra_column + "rows:\n", 1)
    text = two_columns + "    rows_by_column: {Separate: {B: [train.epochs=3]}}\n"
    spec = load_spec(spec_file(tmp_path, text))
    cells = expand(spec, "mini", out_dir=str(tmp_path / "runs"))
    with_epochs = {(c.row, c.column) for c in cells if "train.epochs=3" in c.overrides}
    assert with_epochs == {("Separate", "B")}
    assert expand(spec, "paper", out_dir=str(tmp_path / "runs"))[0].overrides.count("train.epochs=3") == 0
    for bad, message in (("Nobody: {B: [train.epochs=3]}", "rows_by_column names no row 'Nobody'"),
                         ("Separate: {Z: [train.epochs=3]}", r"rows_by_column.Separate names no column \['Z'\]")):
        spec_file(tmp_path, two_columns + "    rows_by_column: {" + bad + "}\n")
        with pytest.raises(ValueError, match=message):
            load_spec(tmp_path / "toy.yaml")


def test_the_caption_states_each_rows_mean_p_squared_widest_width_and_rule_from_the_runs(tmp_path):
    hetero = SPEC.replace("eval.chance_z=null]", "eval.chance_z=null, capacity.setting=grid, capacity.low=0.0625]")
    hetero = hetero.replace("  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}\n",
                            "  - {name: HeteroFL, overrides: [method=heterofl]}\n"
                            "  - {name: HeteroFL own, overrides: [method=heterofl, capacity.width_rule=method]}\n")
    spec = load_spec(spec_file(tmp_path, hetero.replace("base: [rounds=2,", "base: [capacity.width_rule=multiple, "
                                                                          "rounds=2,")))
    cells = expand(spec, "mini", out_dir=str(tmp_path / "runs"))
    frame, problems = collect(spec, "mini", run_cells(cells))
    md = write_table(spec, "mini", frame, problems, tmp_path / "results").read_text()
    # r = 1/16, 3/8, 11/16, 1: shared rule p = 1/4, 1/2, 3/4, 1 (mean p^2 0.469); HeteroFL's own 1/4, 1/2, 1/2, 1
    # (0.391); FedAvg and Separate run the weakest client's 1/4 everywhere
    assert ("A: FedAvg 0.062 / 0.25, Separate 0.062 / 0.25, HeteroFL 0.469 / 1, HeteroFL own 0.391 / 1." in md)
    assert "HeteroFL: the largest multiple p of p_min with p² ≤ r" in md
    assert "HeteroFL own: the largest p in {1, 1/2, 1/4, ...} with p² ≤ r" in md
    tex = (tmp_path / "results" / "fedcac" / "table1.tex").read_text()
    assert r"p$^2$ $\le$ r" in tex
    from bench.experiment.render import rerender

    assert rerender(spec, "mini", tmp_path / "results").read_text() == md  # from the CSV and .stats.json alone
