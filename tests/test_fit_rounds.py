"""scripts/fit_rounds.py: a table's cells at as many rounds as fit a time budget, every run the table command will
need (each grid point's final cells and the search's), packed so that the table afterwards reuses them all."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from bench.experiment.cells import run_cells
from bench.experiment.identity import run_dir_for
from bench.experiment.spec import cell_config, expand, load_spec
from bench.experiment.tuning import own_values, resolve, row_grids, tune
from tests.helpers import script

pytestmark = pytest.mark.slow  # trains the runs a table needs

fit_rounds = script("fit_rounds")

PA3DFL = Path(__file__).resolve().parent.parent / "conf" / "paper" / "pa3dfl" / "table1.yaml"

SPEC = """\
paper: fedcac
table: "1"
title: toy
protocol: {stage: post, selection: best_val, weighting: unweighted}
seeds: [0]
base: [rounds=2, num_clients=4, train.batch_size=10, cache_dir=null, quiet=true, logger.wandb.mode=disabled,
       partition.n_train=40, partition.n_test=20, partition.val_fraction=0.25, eval.chance_z=null]
columns:
  - {name: A, dataset: synthetic, model: small_cnn, overrides: [partition=pathological],
     paper: {dataset: cifar10, setting: pathological-2}}
rows:
  - {name: FedAvg, overrides: [method=fedavg]}
  - {name: Separate, overrides: [method=local]}
tuning:
  seeds: [7]
  val_fraction: 0.25
  grid:
    FedAvg: {train.lr: [0.001, 0.3]}
    Separate: {train.lr: [0.001, 0.3]}
scales:
  mini:
    seeds: [0]
    base: [rounds=1]
"""


def test_longest_first_schedule_and_the_most_rounds_that_fit():
    assert fit_rounds.makespan([3, 3, 2, 2, 2], 2) == 7  # 3+2+2 | 3+2
    assert fit_rounds.makespan([5], 4) == 5 and fit_rounds.makespan([], 2) == 0
    costs = [(1.0, 2.0), (0.5, 2.0)]  # (seconds per round, start-up)
    # one worker: 4 + 1.5 R <= 20 -> R <= 10.67; multiples of 2 -> 10
    assert fit_rounds.choose_rounds(costs, 1, 20.0, 2, 100, 1.0) == 10
    assert fit_rounds.choose_rounds(costs, 2, 20.0, 2, 100, 1.0) == 18  # the slower run alone: 2 + R <= 20
    assert fit_rounds.choose_rounds(costs, 2, 20.0, 2, 12, 1.0) == 12  # capped
    assert fit_rounds.choose_rounds(costs, 2, 20.0, 2, 100, 2.0) == 8  # margin on the seconds per round
    assert fit_rounds.choose_rounds(costs, 1, 3.0, 2, 100, 1.0) == 0  # not even 2 rounds fit


def test_every_run_the_table_may_need_once_whichever_point_the_search_picks():
    spec = load_spec(PA3DFL)
    pairs = fit_rounds.all_cells(spec, "medium", "runs", [])
    composed = fit_rounds.compose(pairs, "medium")
    dirs = {run_dir_for(cfg) for _, _, cfg in composed}
    # the search's 12 rows x 6 points on the tuning seed, and the table's 12 rows x 3 seeds at each of the 6 points
    assert len(dirs) == len(composed) == 12 * 6 + 12 * 6 * 3
    own, grids, column = own_values(spec, "medium"), row_grids(spec, "medium"), "FashionMNIST Hetero"
    for i in range(6):  # as tune() returns the spec with its (resolved) choices, whichever point each row gets
        tuned = load_spec(PA3DFL)
        for k, row in enumerate(tuned["rows"]):
            row["tuned"] = {column: resolve(grids[row["name"]][(i + k) % 6], own[(row["name"], column)])}
        assert {run_dir_for(cell_config(c, tuned, "medium")) for c in expand(tuned, "medium")} <= dirs


def test_the_runs_fit_are_packed_and_the_table_then_reuses_every_one(tmp_path, capsys):
    spec_path = tmp_path / "toy.yaml"
    spec_path.write_text(SPEC)
    out_dir, pack = tmp_path / "runs", tmp_path / "out" / "runs.tar"
    pack.parent.mkdir()
    code = fit_rounds.main([str(spec_path), "--scale", "mini", "--budget-s", "200", "--workers", "2",
                            "--probe-rounds", "2", "--round-multiple", "1", "--max-rounds", "3",
                            "--out-dir", str(out_dir), "--pack", str(pack)])
    assert code == 0
    report = json.loads(pack.with_suffix(".json").read_text())
    rounds = report["rounds"]
    assert rounds == 3 and set(report["probe"]) == {"FedAvg", "Separate"}
    assert len(report["runs"]) == 8 and all(r["ok"] for r in report["runs"])  # (2 search + 2 final) x 2 rows
    with tarfile.open(pack) as tar:
        names = set(tar.getnames())
    assert {n.rsplit("/", 1)[1] for n in names} >= {"config.yaml", "rounds.jsonl", "summary.json"}
    assert not any(n.endswith(".pt") for n in names)  # records only, no checkpoints
    assert len({n.split("/summary.json")[0] for n in names if n.endswith("summary.json")}) == 8
    # the table at that many rounds finds every run finished: tuning, then the final cells
    spec_path.write_text(SPEC.replace("base: [rounds=1]", f"base: [rounds={rounds}]"))
    spec = tune(load_spec(spec_path), "mini", {"name": "inline"}, str(out_dir), results_dir=str(tmp_path / "results"))
    capsys.readouterr()
    run_cells(expand(spec, "mini", out_dir=str(out_dir)), spec=spec, scale="mini")
    assert "2 cells, 2 finished, 0 to run" in capsys.readouterr().out


def test_search_first_runs_the_tuned_rows_only_at_the_point_the_finished_search_picked(tmp_path, capsys):
    spec_path = tmp_path / "toy.yaml"
    spec_path.write_text(SPEC)
    out_dir, pack = tmp_path / "runs", tmp_path / "runs.tar"
    call = [str(spec_path), "--scale", "mini", "--budget-s", "300", "--workers", "2", "--rounds", "2",
            "--search-first", "--drop-checkpoints", "--out-dir", str(out_dir), "--pack", str(pack),
            "--", "checkpoint.every_rounds=1"]
    assert fit_rounds.main(call) == 0  # the search is not finished: its 2 points of each row
    first = json.loads(pack.with_suffix(".json").read_text())["runs"]
    assert sorted(r["row"] for r in first) == ["FedAvg [train.lr=0.001]", "FedAvg [train.lr=0.3]",
                                               "Separate [train.lr=0.001]", "Separate [train.lr=0.3]"]
    assert all(r["ok"] for r in first)
    assert not list(out_dir.rglob("*.pt"))  # each finished run's checkpoints deleted, its records kept
    assert len(list(out_dir.rglob("summary.json"))) == 4
    assert fit_rounds.main(call) == 0  # the search has finished: each row at its pick, nothing run twice
    second = json.loads(pack.with_suffix(".json").read_text())["runs"]
    assert sorted((r["row"], r["seed"], r["ok"]) for r in second) == [("FedAvg", 0, True), ("Separate", 0, True)]
    assert fit_rounds.main(call) == 0 and json.loads(pack.with_suffix(".json").read_text())["runs"] == []
    # the table at those rounds finds every run it needs finished
    spec_path.write_text(SPEC.replace("base: [rounds=1]", "base: [rounds=2]"))
    spec = tune(load_spec(spec_path), "mini", {"name": "inline"}, str(out_dir), results_dir=str(tmp_path / "results"))
    capsys.readouterr()
    run_cells(expand(spec, "mini", out_dir=str(out_dir)), spec=spec, scale="mini")
    assert "2 cells, 2 finished, 0 to run" in capsys.readouterr().out
