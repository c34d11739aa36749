"""Paper tables as W&B runs (bench.experiment.wandb_tables): logged offline, then read back from the run's files on
disk.

The offline run is read with ``wandb leet inspect --json`` (W&B's own reader of the ``.wandb`` transaction log:
run record, config, summary) and through the files it points to (``files/media/table/*.table.json``,
``files/media/images/...``); the values are checked against the table's CSV and ``.stats.json`` read here with
the standard library only."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.experiment import table as table_cli
from bench.experiment import wandb_tables
from bench.experiment.cells import run_cells
from bench.experiment.claims import precondition_names
from bench.experiment.spec import expand, load_spec
from tests.helpers import wandb_records

ROOT = Path(__file__).resolve().parent.parent

TOY = """
paper: fedcac
table: "1"
title: toy
protocol: {stage: post, selection: best, weighting: unweighted}
seeds: [0, 1]
base: [rounds=1, num_clients=4, train.batch_size=10, cache_dir=null, quiet=true, logger.wandb.mode=disabled,
       partition.n_train=40, partition.n_test=20]
columns:
  - {name: A, dataset: synthetic, model: small_cnn, overrides: [partition=pathological],
     paper: {dataset: cifar10, setting: pathological-2}}
rows:
  - {name: FedAvg, paper: FedAvg, overrides: [method=fedavg]}
  - {name: Local, paper: Local, overrides: [method=local]}
  - {name: pFedGate, unavailable: not in this toy}
scales:
  mini:
    seeds: [0]
"""


def read_back(wandb_dir: Path) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(run record, merged summary, the run's ``files`` folder) of the one offline run under ``wandb_dir``."""
    records = wandb_records(wandb_dir)
    run = next(r["run"] for r in records if r["type"] == "run")
    summary: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    files = next((wandb_dir / "wandb").glob("offline-run-*")) / "files"
    return run, summary, files


def logged_table(summary: dict[str, Any], files: Path, key: str) -> list[dict[str, Any]]:
    """The lines of the ``wandb.Table`` logged as ``key``, read from the file its summary entry names."""
    assert summary[f"{key}._type"] == "table-file"
    data = json.loads((files / summary[f"{key}.path"]).read_text())
    return [dict(zip(data["columns"], line, strict=True)) for line in data["data"]]


def number(text: str) -> float | None:
    return None if text == "" or math.isnan(float(text)) else float(text)


def assert_rows_match_csv(rows: list[dict[str, Any]], csv_path: Path) -> None:
    with csv_path.open() as f:
        expected = list(csv.DictReader(f))
    assert len(rows) == len(expected) > 0
    for got, want in zip(rows, expected, strict=True):
        assert (got["row"], got["column"], got["n_seeds"]) == (want["method"], want["column"], int(want["seeds"]))
        for ours, theirs in (("ours_mean", "mean"), ("ours_std", "std"), ("paper", "paper_mean"),
                             ("paper_std", "paper_std"), ("difference", "diff")):
            assert got[ours] == pytest.approx(number(want[theirs])), (got, want, ours)


def test_a_committed_table_is_logged_offline_and_reads_back_as_its_csv(tmp_path):
    source = ROOT / "results" / "fedc2i"
    results = tmp_path / "results" / "fedc2i"
    results.mkdir(parents=True)
    for suffix in (".csv", ".stats.json", ".md"):
        shutil.copy(source / f"table1{suffix}", results / f"table1{suffix}")
    pngs = [source / "figures" / "fig3_digit5.png", source / "figures" / "curves" / "table1_Digit-5_Avg.png"]
    for png in pngs:
        (results / png.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(png, results / png.relative_to(source))
    assert wandb_tables.main(["--results", str(tmp_path / "results"), "--dir", str(tmp_path / "wb"),
                              "fedc2i/table1"]) == 0

    run, summary, files = read_back(tmp_path / "wb")
    assert (run["run_group"], run["job_type"], run["display_name"]) == ("fedc2i", "table", "fedc2i/table1/mini")
    assert {"paper:fedc2i", "scale:mini", "table:fedc2i/table1"} <= set(run["tags"])
    config = run["config"]["update"]
    spec = load_spec(ROOT / "conf" / "paper" / "fedc2i" / "table1.yaml")
    assert config["spec"] == "conf/paper/fedc2i/table1.yaml" and config["scale"] == "mini"
    assert config["seeds"] == spec["scales"]["mini"]["seeds"] and config["compare"] == "FedC2I"
    with (results / "table1.csv").open() as f:
        spec_columns = {c["name"] for c in spec["columns"]}
        assert config["runs"] == sum(int(r["seeds"]) for r in csv.DictReader(f) if r["column"] in spec_columns)
    assert "commit" in config

    rows = logged_table(summary, files, "table")
    assert_rows_match_csv(rows, results / "table1.csv")
    stats = json.loads((results / "table1.stats.json").read_text())
    by_cell = {(r["row"], r["column"]): r for r in rows}
    flags = {(True, False): "✓", (False, False): "✗", (False, True): "✗!", (None, False): ""}  # None: a zero difference
    assert stats["paired"]
    for p in stats["paired"]:
        got = by_cell[(p["other"], p["column"])]
        assert got["paired_diff"] == pytest.approx(p["mean_diff"])
        assert (got["paired_ci_low"], got["paired_ci_high"]) == pytest.approx((p["ci_low"], p["ci_high"]))
        assert got["paper_paired_diff"] == pytest.approx(p["paper_diff"])
        if p.get("untestable"):  # the mark names the failed preconditions instead of a sign
            assert got["sign"] == f"(cannot test: {precondition_names(p['untestable'])})"
        elif p.get("magnitude") == "sign only":
            assert got["sign"] == "(sign only)"
        else:
            assert got["sign"] == flags[(p["agrees"], p["contradicts"])]
    assert all(r["paired_diff"] is None and r["sign"] == "" for r in rows if r["row"] == "FedC2I")
    assert {k: v for k, v in summary.items() if k.startswith("kendall_tau/")} == pytest.approx(
        {f"kendall_tau/{o['column']}": o["tau"] for o in stats["ordering"] if not o.get("untestable")})
    assert [r["column"] for r in logged_table(summary, files, "ordering")] == [o["column"] for o in stats["ordering"]]

    for png in pngs:
        key = "figures/" + png.relative_to(source / "figures").with_suffix("").as_posix()
        assert summary[f"{key}._type"] == "image-file"
        logged = files / summary[f"{key}.path"]
        assert hashlib.sha256(logged.read_bytes()).digest() == hashlib.sha256(png.read_bytes()).digest()


def test_only_paper_tables_are_found_and_an_unknown_table_is_refused(tmp_path, capsys):
    header = "method,column,mean,std,seeds,paper_mean,paper_std,paper_source,diff,beyond_2std\n"
    (tmp_path / "p" / "paper-scale").mkdir(parents=True)
    (tmp_path / "p" / "table2.csv").write_text(header)
    (tmp_path / "p" / "paper-scale" / "fig3.csv").write_text(header)
    (tmp_path / "p" / "efficiency.csv").write_text("row,method,params\n")
    assert wandb_tables.find_tables(tmp_path) == [("p", "table2", "mini"), ("p", "fig3", "paper")]
    assert wandb_tables.find_tables(tmp_path, ["paper"]) == [("p", "fig3", "paper")]
    with pytest.raises(SystemExit):
        wandb_tables.main(["--results", str(tmp_path), "--dir", str(tmp_path / "wb"), "p/table9"])
    assert "no table ['p/table9']" in capsys.readouterr().err
    assert not (tmp_path / "wb").exists()


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """A toy table spec whose two mini cells have run (W&B disabled for the runs themselves)."""
    root = tmp_path_factory.mktemp("toy")
    (root / "toy.yaml").write_text(TOY)
    run_cells(expand(load_spec(root / "toy.yaml"), "mini", out_dir=str(root / "runs")))
    return root


def table_command(root: Path, *overrides: str) -> int:
    return table_cli.main([str(root / "toy.yaml"), "--scale", "mini", "--launcher", "inline", "--no-precheck",
                           "--out-dir", str(root / "runs"), "--results", str(root / "results"), "--", *overrides])


def test_the_table_command_logs_its_table_with_the_runs_wandb_settings(toy):
    assert table_command(toy, f"logger.wandb.dir={toy / 'off'}") == 0  # the spec disables W&B: no table run
    assert not (toy / "off").exists() and (toy / "results" / "fedcac" / "table1.csv").exists()

    assert table_command(toy, "logger.wandb.mode=offline", "logger.wandb.project=toyproject") == 0
    run, summary, files = read_back(toy / "runs" / "wandb-tables")  # no logger.wandb.dir: under --out-dir
    assert (run["run_group"], run["job_type"], run["display_name"]) == ("fedcac", "table", "fedcac/table1/mini")
    assert run["project"] == "toyproject"
    config = run["config"]["update"]
    assert config["spec"] == str(toy / "toy.yaml") and config["seeds"] == [0] and config["runs"] == 2
    rows = logged_table(summary, files, "table")
    assert_rows_match_csv(rows, toy / "results" / "fedcac" / "table1.csv")
    assert next(r for r in rows if r["row"] == "pFedGate")["ours_mean"] is None  # NaN in the CSV: empty here


def test_a_wandb_failure_warns_and_the_table_is_still_written(toy, monkeypatch):
    import wandb

    def down(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb, "init", down)
    written = toy / "results" / "fedcac" / "table1.md"
    written.unlink(missing_ok=True)
    with pytest.warns(RuntimeWarning, match=r"W&B logging of table fedcac/table1 \(mini\) failed, the table itself "
                                            r"is written: RuntimeError: W&B is down\. Log it later with"):
        assert table_command(toy, "logger.wandb.mode=offline", f"logger.wandb.dir={toy / 'down'}") == 0
    assert "| FedAvg |" in written.read_text()
