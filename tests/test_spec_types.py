"""Typed table specs: unknown keys refused with the allowed ones, one override precedence, ``--explain``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.experiment.errors import CONFIG_EXIT, run_cli
from bench.experiment.spec import TableSpec, cell_overrides, expand, load_spec
from bench.experiment.table import main as table_main

SPEC = """
paper: demo
table: toy
protocol: {stage: post, selection: best, weighting: unweighted}
seeds: [0, 1]
base: [rounds=2, num_clients=4, quiet=true, train.epochs=1]
_anchor: &lr {A: [train.epochs=7]}
columns:
  - {name: A, dataset: synthetic, model: small_cnn, overrides: [partition=iid, train.epochs=5]}
rows:
  - {name: FedAvg, overrides: [method=fedavg, train.epochs=8], by_dataset: {synthetic: [train.epochs=9]},
     by_column: *lr, protocol: {stage: pre}}
  - {name: Gone, unavailable: not here}
scales:
  mini:
    seeds: [3]
    base: [train.epochs=2]
    datasets: {synthetic: digits}
    dataset_overrides: {digits: [train.epochs=3]}
    model: small_cnn
    by_dataset: {synthetic: [train.epochs=4]}
    column_overrides: {A: [train.epochs=6]}
    rows: {FedAvg: [train.epochs=10]}
    rows_by_dataset: {FedAvg: {synthetic: [train.epochs=11]}}
    rows_by_column: {FedAvg: {A: [train.epochs=12]}}
"""


def write(tmp_path: Path, text: str = SPEC, name: str = "toy.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(("old", "new", "where", "key"), [
    ("columns:", "colums:", "table spec", "colums"),
    ("overrides: [partition=iid", "overides: [partition=iid", "column 'A'", "overides"),
    ("by_dataset: {synthetic: [train.epochs=9]}", "by_datset: {synthetic: [train.epochs=9]}", "row 'FedAvg'",
     "by_datset"),
    ("    column_overrides:", "    column_override:", "scales.mini", "column_override"),
    ("  mini:", "  minni:", "scales", "minni"),
])
def test_a_misspelt_key_is_refused_naming_it_and_the_allowed_keys(tmp_path, old, new, where, key):
    assert old in SPEC
    path = write(tmp_path, SPEC.replace(old, new, 1))
    with pytest.raises(ValueError, match=rf"{where}.*has the key '{key}'.*allowed keys are \["):
        load_spec(path)


def test_a_misspelt_key_fails_the_dry_run_with_status_2(tmp_path, capsys):
    path = write(tmp_path, SPEC.replace("columns:", "colums:"))
    assert run_cli(lambda: table_main([str(path), "--dry-run"])) == CONFIG_EXIT
    err = capsys.readouterr().err
    assert "'colums'" in err and "'columns'" in err


def test_a_value_of_the_wrong_kind_and_a_missing_key_are_refused(tmp_path):
    with pytest.raises(ValueError, match="row 'FedAvg'.*overrides is 'method=fedavg': give a list of strings"):
        load_spec(write(tmp_path, SPEC.replace("[method=fedavg, train.epochs=8]", "method=fedavg")))
    with pytest.raises(ValueError, match="lacks the key 'model'"):
        load_spec(write(tmp_path, SPEC.replace(" model: small_cnn, overrides: [partition", " overrides: [partition")))


def test_every_source_of_a_cell_applies_in_the_one_documented_order(tmp_path):
    """Each source sets train.epochs to its rank: the cell's overrides list them in that order, the last wins."""
    spec = load_spec(write(tmp_path))
    spec["rows"][0]["tuned"] = {"A": ["train.epochs=13"]}
    typed = TableSpec.parse(spec)
    overrides = cell_overrides(typed, "mini", typed.rows[0], typed.columns[0], 3, "out", ["train.epochs=14"])
    epochs = [(o.text, o.where()) for o in overrides if o.key() == "train.epochs"]
    assert epochs == [
        ("train.epochs=1", "base"), ("train.epochs=2", "scales.mini.base"),
        ("train.epochs=3", "scales.mini.dataset_overrides.digits"), ("train.epochs=5", "columns.A.overrides"),
        ("train.epochs=4", "scales.mini.by_dataset.synthetic"), ("train.epochs=6", "scales.mini.column_overrides.A"),
        ("train.epochs=8", "rows.FedAvg.overrides"), ("train.epochs=9", "rows.FedAvg.by_dataset.synthetic"),
        ("train.epochs=7", "rows.FedAvg.by_column.A"), ("train.epochs=10", "scales.mini.rows.FedAvg"),
        ("train.epochs=11", "scales.mini.rows_by_dataset.FedAvg.synthetic"),
        ("train.epochs=12", "scales.mini.rows_by_column.FedAvg.A"),
        ("train.epochs=13", "(tuning: the grid point chosen on validation data)"),
        ("train.epochs=14", "(command line)")]
    where = {o.text: o.where() for o in overrides}
    assert where["eval.primary.stage=pre"] == "rows.FedAvg.protocol.stage"  # the row's protocol key over the table's
    assert where["eval.primary.selection=best"] == "protocol.selection"
    assert where["dataset=digits"] == "scales.mini.datasets.synthetic" and where["seed=3"] == "(seed)"
    cells = expand(spec, "mini", out_dir="out", extra=["train.epochs=14"])  # expand uses the same function
    assert [(c.row, c.seed) for c in cells] == [("FedAvg", 3)]
    assert cells[0].overrides == tuple(o.text for o in overrides)


def test_explain_names_each_override_its_source_file_and_what_replaces_it(tmp_path, capsys):
    base = "base: [rounds=2, num_clients=4, quiet=true, train.epochs=1]\n"
    write(tmp_path, base, "_setup.yaml")
    path = write(tmp_path, "include: _setup.yaml\n" + SPEC.replace(base, ""))
    assert table_main([str(path), "--explain", "FedAvg | A", "--out-dir", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "row 'FedAvg', column 'A', seed 3" in lines[0]
    line = next(x for x in lines if x.strip().startswith("train.epochs=1 "))
    assert "base  [_setup.yaml]" in line and "(replaced by train.epochs=2, scales.mini.base)" in line
    line = next(x for x in lines if x.strip().startswith("train.epochs=12 "))
    assert "scales.mini.rows_by_column.FedAvg.A  [toy.yaml]" in line and "replaced" not in line
    assert lines[-1].startswith(f"run directory: {tmp_path / 'runs' / 'demo' / 'toy' / 'mini'}")
    assert not (tmp_path / "runs").exists()  # nothing run
    assert run_cli(lambda: table_main([str(path), "--explain", "FedAvg | B"])) == CONFIG_EXIT
    assert "names no cell" in capsys.readouterr().err
