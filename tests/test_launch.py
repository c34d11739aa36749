"""Launchers (inline, capped local processes), failure reporting, the collector CLI, plots and make targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import collect as collect_cli
from bench import plots
from bench.launch import load_launcher
from bench.table import cell_config, expand, load_spec, run_cells
from bench.table import collect as collect_table
from tests.test_table import SPEC, spec_file

ROOT = Path(__file__).resolve().parent.parent


def records(dirs):
    return {cell: ((d / "rounds.jsonl").read_bytes(), (d / "summary.json").read_bytes()) for cell, d in dirs.items()}


def test_launcher_settings_come_from_config_and_bad_ones_are_named():
    slurm = load_launcher("slurm", ["launcher.partition=gpu", "launcher.gpus_per_node=1", "launcher.mem_gb=16"])
    assert (slurm["partition"], slurm["gpus_per_node"], slurm["mem_gb"], slurm["cpus_per_task"]) == ("gpu", 1, 16, 1)
    with pytest.raises(ValueError, match="launcher.partitio is not a setting of the 'slurm' launcher"):
        load_launcher("slurm", ["launcher.partitio=gpu"])
    with pytest.raises(ValueError, match="launcher 'slurmm' is unknown: use one of"):
        load_launcher("slurmm")
    with pytest.raises(ValueError, match="launcher.cpus_per_task=0 is invalid"):
        load_launcher("local", ["launcher.cpus_per_task=0"])


def test_local_processes_give_the_records_of_an_inline_run(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "inline"))
    inline = run_cells(cells, launcher=load_launcher("inline"), spec=spec)
    cells = expand(spec, "paper", out_dir=str(tmp_path / "local"))
    local = run_cells(cells, launcher=load_launcher("local", ["launcher.runs_per_job=3"]), spec=spec)
    assert list(records(inline).values()) == list(records(local).values())
    timing = json.loads((next(iter(local.values())) / "timing.json").read_text())
    assert timing["threads"] == 1  # cpus_per_task of the launcher


def test_local_launcher_caps_concurrent_processes(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"), extra=["rounds=4"])
    dirs = run_cells(cells, launcher=load_launcher("local", ["launcher.max_concurrent=1", "launcher.runs_per_job=1"]))
    # each run writes config.yaml first and summary.json last: with a cap of 1 the intervals never overlap
    spans = sorted(((d / "config.yaml").stat().st_mtime, (d / "summary.json").stat().st_mtime) for d in dirs.values())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))


def test_a_failing_run_is_reported_with_its_log_and_the_table_still_completes(tmp_path, capsys):
    text = SPEC.replace("  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}\n",
                        "  - {name: Broken, overrides: [method=fedavg, dataset=cifar10, data_root=/nonexistent]}\n")
    spec = load_spec(spec_file(tmp_path, text))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"))
    dirs = run_cells(cells, launcher=load_launcher("local", ["launcher.runs_per_job=2"]), spec=spec)
    out = capsys.readouterr().out
    assert "4 runs finished, 2 failed" in out and "FAILED Broken | A | seed 0" in out and ".out" in out
    broken = [d for c, d in dirs.items() if c.row == "Broken"]
    assert all("cifar" in (d / "error.txt").read_text().lower() for d in broken)
    frame, problems = collect_table(spec, "paper", dirs)
    assert sum(p.startswith("failed: Broken | A") for p in problems) == 2
    assert frame.set_index("method").loc["FedAvg", "seeds"] == 2


def test_cells_carry_their_wandb_group_job_type_and_tags(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cell = expand(spec, "mini", out_dir=str(tmp_path / "runs"))[0]
    wandb = cell_config(cell, spec, "mini")["logger"]["wandb"]
    assert wandb["group"] == "fedcac/table1/A--FedAvg" and wandb["job_type"] == "FedAvg"
    assert {"scale:mini", "table:fedcac/table1", "cell:A--FedAvg"} <= set(wandb["tags"])


def test_collect_cli_writes_markdown_latex_csv_without_training(tmp_path):
    spec_path = spec_file(tmp_path)
    spec = load_spec(spec_path)
    run_cells(expand(spec, "mini", out_dir=str(tmp_path / "runs")))
    collect_cli.main([str(spec_path), "--scale", "mini", "--out-dir", str(tmp_path / "runs"),
                      "--results", str(tmp_path / "results")])
    out = tmp_path / "results" / "fedcac"
    md, tex = (out / "table1.md").read_text(), (out / "table1.tex").read_text()
    assert "| FedAvg |" in md and "mini-scale stand-in" in tex
    # nothing trained: with no runs, every cell is listed as missing
    collect_cli.main([str(spec_path), "--scale", "paper", "--out-dir", str(tmp_path / "none"),
                      "--results", str(tmp_path / "results")])
    assert "missing: FedAvg | A | seed 0" in (out / "paper-scale" / "table1.md").read_text()
    assert not (tmp_path / "none").exists()


def test_plots_draw_learning_curves_with_a_band_over_seeds(tmp_path):
    text = SPEC.replace("seeds: [0]", "seeds: [0, 1]")
    spec_path = spec_file(tmp_path, text)
    run_cells(expand(load_spec(spec_path), "mini", out_dir=str(tmp_path / "runs")))
    paths = plots.table_curves(spec_path, "mini", str(tmp_path / "runs"), str(tmp_path / "results"))
    assert sorted(p.name for p in paths) == ["table1_A.pdf", "table1_A.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_make_targets_exist_for_every_spec_and_pass_the_options():
    out = subprocess.run(["make", "-n", "table2", "SCALE=paper", "LAUNCHER=slurm", "SEEDS=0 1", "DATA_ROOT=/data",
                          "ARGS=device=cuda launcher.gpus_per_node=1"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    command = " ".join(out.replace("\\\n", " ").split())
    assert "-m bench.table conf/paper/fedcac/table2.yaml --scale paper --launcher slurm --seeds 0 1" in command
    assert "data_root=/data device=cuda launcher.gpus_per_node=1" in command
    specs = sorted(ROOT.glob("conf/paper/*/table*.yaml")) + sorted(ROOT.glob("conf/paper/*/fig*.yaml"))
    help_text = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for spec in specs:
        assert f"{spec.parent.name}-{spec.stem}" in help_text
    missing = subprocess.run(["make", "pa3dfl-table1"], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode != 0 and "not built in this repository yet" in missing.stdout


def test_table_cli_rejects_a_bad_launcher_setting_before_any_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.table", str(spec_file(tmp_path)), "--out-dir",
                           str(tmp_path / "runs"), "--", "launcher.max_concurent=2"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "launcher.max_concurent is not a setting" in proc.stderr
    assert not (tmp_path / "runs").exists()

