"""User plug-ins without editing the package (docs/plugins.md): the worked example of docs/examples/plugin/,
copied to a temporary folder outside the repository, runs end to end with the documented command, its table
spec validates, and a misspelt name stops the run before anything is written, with an error naming it."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "plugin"
#: the command of docs/plugins.md, after ``python -m bench.experiment.run``
DOCUMENTED = ("--config-dir", "conf", "imports=[my_plugin]", "method=my_fedavgm", "dataset=my_stripes",
              "model=my_mlp", "partition=my_groups", "num_clients=4", "rounds=2")
#: the same with the search path given as a Hydra override (as table specs give it)
SEARCHPATH = ("hydra.searchpath=[file://conf]", *DOCUMENTED[2:])
#: test settings: no progress bar, no W&B, no partition cache
QUIET = ("quiet=true", "logger.wandb.mode=disabled", "cache_dir=null")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The user's folder: a copy of the example, outside the repository."""
    target = tmp_path / "my_research"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def run(folder: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m <module> <args>`` in ``folder``, with the folder and the repository on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), "OMP_NUM_THREADS": "1",
           "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=180)


def test_the_documented_command_runs_the_plugin_end_to_end(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = run(folder, "bench.experiment.run", *DOCUMENTED, *QUIET, f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr
    (summary_file,) = out.rglob("summary.json")
    run_dir = summary_file.parent
    assert run_dir.parent == out / "default" / "my_fedavgm" and run_dir.name.startswith("my_stripes-my_groups-s0-")
    summary = json.loads(summary_file.read_text())
    assert summary["complete"] is True
    assert (summary["method"], summary["dataset"], summary["partition"]) == ("my_fedavgm", "my_stripes", "my_groups")
    assert (summary["rounds"], summary["num_clients"]) == (2, 4)
    assert summary["code"]["hash"] and summary["primary"]["round"] in (1, 2)
    protocols = {(r["stage"], r["selection"], r["weighting"]) for r in summary["results"]}
    assert len(protocols) == 8 and ("post", "best", "unweighted") in protocols
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    assert config["model"] == {"name": "my_mlp", "width": 1.0, "options": {"hidden": 64}}  # not in summary.json
    assert config["method"] == {"name": "my_fedavgm", "server_lr": 1.0, "momentum": 0.9}
    # the plug-in's method ran its hooks: metrics() every round
    records = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    method_records = [r for r in records if r["kind"] == "method"]
    assert [r["round"] for r in method_records] == [1, 2] and all(r["velocity_norm"] > 0 for r in method_records)
    # the plug-in's partition: 2 groups of the 4 classes, client i holds group i % 2
    with open(run_dir / "partition" / "class_counts.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["part"] in ("train", "test")]
    for row in rows:
        held = {c for c in range(4) if int(row[f"class_{c}"])}
        assert held == {int(row["client"]) % 2, int(row["client"]) % 2 + 2}, row


def test_the_documented_table_spec_validates_every_cell(folder: Path, tmp_path: Path) -> None:
    proc = run(folder, "bench.experiment.table", "my_table.yaml", "--scale", "paper", "--dry-run", "--out-dir",
               str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr
    assert "4 cells, 0 finished, 4 to run" in proc.stdout


@pytest.mark.parametrize(("typo", "expected"), [
    # a config file name: Hydra lists the options it found, the plug-in's among them (the search path works)
    ("method=my_fedavmg", ["Could not find 'method/my_fedavmg'", ", my_fedavgm", "file://conf"]),
    # a registered name: the registry lists every registered name, the plug-in's among them (the import works)
    ("partition.scheme=my_grups", ["unknown partition scheme 'my_grups'", "my_groups"]),
])
def test_a_misspelt_plugin_name_stops_the_run_naming_it(folder: Path, tmp_path: Path, typo: str,
                                                        expected: list[str]) -> None:
    key = typo.partition("=")[0]
    args = [a for a in SEARCHPATH if not a.startswith(f"{key}=")]
    proc = run(folder, "bench.experiment.run", *args, typo, *QUIET, f"out_dir={tmp_path / 'runs'}")
    assert proc.returncode != 0
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written
