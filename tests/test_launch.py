"""Launchers (inline, the local worker pool), failure reporting, the collector CLI, plots and make targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.experiment import collect as collect_cli
from bench.experiment import plots
from bench.experiment.cells import run_cells
from bench.experiment.collect import collect as collect_table
from bench.experiment.launch import load_launcher
from bench.experiment.spec import cell_config, expand, load_spec
from tests.test_table import SPEC, spec_file

pytestmark = pytest.mark.slow  # launches runs as processes

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


def test_a_direct_run_uses_one_thread_unless_told_otherwise(tmp_path, monkeypatch):
    import torch

    from bench.experiment.run import execute, run_dir_for, run_threads, to_container
    from tests.helpers import config

    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert run_threads({"threads": None}) == 1 and run_threads({"threads": 3}) == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert run_threads({"threads": None}) == 4
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    torch.set_num_threads(2)  # what torch's default would be on this machine
    try:
        cfg = config(tmp_path, "rounds=1")
        execute(cfg)
        assert json.loads((run_dir_for(to_container(cfg)) / "timing.json").read_text())["threads"] == 1
    finally:
        torch.set_num_threads(1)


def test_local_launcher_caps_concurrent_processes(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"), extra=["rounds=4"])
    dirs = run_cells(cells, launcher=load_launcher("local", ["launcher.max_concurrent=1", "launcher.runs_per_job=1"]))
    # each run writes config.yaml first and summary.json last: with a cap of 1 the intervals never overlap
    spans = sorted(((d / "config.yaml").stat().st_mtime, (d / "summary.json").stat().st_mtime) for d in dirs.values())
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))


def test_a_failing_run_is_reported_with_its_log_and_the_table_still_completes(tmp_path, capsys):
    text = SPEC.replace("  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}\n",
                        "  - {name: Broken, overrides: ['imports=[tests.failing_method]', method=fedavg, "
                        "method.name=fails_in_round, +method.fail_round=2]}\n")
    spec = load_spec(spec_file(tmp_path, text))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"))
    dirs = run_cells(cells, launcher=load_launcher("local", ["launcher.runs_per_job=2"]), spec=spec)
    out = capsys.readouterr().out
    assert "4 runs finished, 2 failed" in out and "FAILED Broken | A | seed 0" in out and ".log):" in out
    broken = [d for c, d in dirs.items() if c.row == "Broken"]
    assert all("deliberate failure in round 2" in (d / "error.txt").read_text() for d in broken)
    logs = [(d / "error.txt").read_text().rsplit("log: ", 1)[1].strip() for d in broken]
    assert all("deliberate failure in round 2" in Path(log).read_text() for log in logs)  # the run's own log
    assert all((d / "rounds.jsonl").exists() for d in broken)  # it did start: round 1 is recorded
    frame, problems = collect_table(spec, "paper", dirs)
    assert sum(p.startswith("failed: Broken | A") for p in problems) == 2
    assert frame.set_index("method").loc["FedAvg", "seeds"] == 2


def test_missing_data_or_an_impossible_partition_fails_before_any_launch(tmp_path):
    text = SPEC.replace("  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}\n",
                        "  - {name: NoData, overrides: [method=fedavg, dataset=cifar10, data_root=/nonexistent]}\n"
                        "  - {name: TooMany, overrides: [method=fedavg, partition.classes_per_client=50]}\n")
    spec = load_spec(spec_file(tmp_path, text))
    with pytest.raises(ValueError, match="4 cells cannot run \\(nothing was launched\\)") as err:
        run_cells(expand(spec, "paper", out_dir=str(tmp_path / "runs")), launcher=load_launcher("local"))
    message = str(err.value)
    assert "NoData | A | seed 0" in message and "cifar-10-batches-py" in message
    assert "TooMany | A | seed 1" in message and "classes_per_client" in message
    assert not (tmp_path / "runs").exists()


def test_cells_carry_their_wandb_group_job_type_and_tags(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cell = expand(spec, "mini", out_dir=str(tmp_path / "runs"))[0]
    wandb = cell_config(cell, spec, "mini")["logger"]["wandb"]
    assert wandb["group"] == "fedcac/table1/A--FedAvg" and wandb["job_type"] == "FedAvg"
    assert {"scale:mini", "table:fedcac/table1", "cell:A--FedAvg"} <= set(wandb["tags"])


def test_long_cell_names_fit_wandbs_limits_and_stay_distinct():
    from bench.experiment.wandb_logger import WANDB_LIMITS, wandb_safe

    long = "cell:CIFAR-10_s_2--FedSelect-CVPR_e_1_our_reading_of_FedSelectv2_e_1"  # 68 characters: W&B refuses it
    other = long.replace("e_1", "e_3")
    assert len(wandb_safe(long, "tag")) == WANDB_LIMITS["tag"] and wandb_safe(long, "tag") != wandb_safe(other, "tag")
    assert wandb_safe("cell:A--FedAvg", "tag") == "cell:A--FedAvg"
    assert len(wandb_safe("g" * 300, "group")) == 128


def test_a_table_cell_logs_to_wandb_as_its_group_and_reads_back(tmp_path):
    from tests.helpers import wandb_records

    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "mini", out_dir=str(tmp_path / "runs"), extra=["logger.wandb.mode=offline"])
    dirs = run_cells(cells[:1], spec=spec, scale="mini")
    records = wandb_records(next(iter(dirs.values())))
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_group"] == "fedcac/table1/A--FedAvg" and run["job_type"] == "FedAvg"
    assert {"scale:mini", "table:fedcac/table1", "dataset:synthetic", "seed:0"} <= set(run["tags"])
    assert [r["history"]["item"]["_step"] for r in records if r["type"] == "history"] == [1]


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
    assert sorted(p.name for p in paths) == ["table1_A.pdf", "table1_A.png"] and paths[0].parent.name == "curves"
    assert all(p.stat().st_size > 1000 for p in paths)


def test_plots_draw_each_rows_mechanism_diagnostic_per_round(tmp_path):
    """Rows whose method declares a mechanism diagnostic (conf/claims.yaml) get a per-round panel: FedCAC's
    collaborators per client, FedAMP's top partner's share of the attention; FedAvg declares none."""
    text = (SPEC.replace("seeds: [0]", "seeds: [0, 1]").replace("base: [rounds=1]", "base: [rounds=3]")
            .replace("  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}\n",
                     "  - {name: FedCAC, overrides: [method=fedcac, method.beta=3]}\n"
                     "  - {name: FedAMP, overrides: [method=fedamp, method.attention=cosine]}\n"))
    spec_path = spec_file(tmp_path, text)
    run_cells(expand(load_spec(spec_path), "mini", out_dir=str(tmp_path / "runs")))
    paths = plots.table_curves(spec_path, "mini", str(tmp_path / "runs"), str(tmp_path / "results"))
    assert sorted(p.name for p in paths) == ["table1_A.pdf", "table1_A.png", "table1_A_mechanisms.pdf",
                                             "table1_A_mechanisms.png"]
    runs = sorted((tmp_path / "runs").glob("**/fedcac/*/rounds.jsonl"))
    assert len(runs) == 2
    frame = plots.diagnostic_frame([r.parent for r in runs], "collaborators_mean")
    assert sorted(frame["round"].unique().tolist()) == [1, 2, 3]
    from bench.experiment.claims import thresholds

    rules = thresholds()["mechanisms"]
    assert set(plots.mechanism_metrics({"FedCAC": [runs[0].parent]}, rules)) == {"FedCAC"}


def test_plots_skip_a_table_without_the_scale_and_draw_the_others(tmp_path, capsys):
    """``make plots SCALE=medium`` runs over every spec, and FedC2I's tables have no medium scale."""
    spec_path = spec_file(tmp_path)  # its scales: mini only
    plots.main([str(spec_path), "--scale", "medium", "--out-dir", str(tmp_path / "runs"),
                "--results", str(tmp_path / "results")])
    assert capsys.readouterr().out == f"{spec_path}: no medium scale\n"
    plots.main([str(spec_path), "--scale", "mini", "--out-dir", str(tmp_path / "runs"),
                "--results", str(tmp_path / "results")])
    assert capsys.readouterr().out == f"{spec_path}: 0 figures (no finished runs yet)\n"


def test_plots_save_the_same_figure_as_the_same_bytes(tmp_path):
    import matplotlib.pyplot as plt

    def draw(name: str) -> list[Path]:
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        return plots.save(fig, tmp_path / name)

    first, second = draw("a"), draw("b")
    assert [p.suffix for p in first] == [".png", ".pdf"]
    assert b"CreationDate" not in first[1].read_bytes()  # the only thing that changed from one save to the next
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes()


def test_make_targets_exist_for_every_spec_and_pass_the_options():
    out = subprocess.run(["make", "-n", "table2", "SCALE=paper", "LAUNCHER=slurm", "SEEDS=0 1", "DATA_ROOT=/data",
                          "ARGS=device=cuda launcher.gpus_per_node=1"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    command = " ".join(out.replace("\\\n", " ").split())
    assert ("-m bench.experiment.table conf/paper/fedcac/table2.yaml --scale paper --launcher slurm --seeds 0 1"
            in command)
    assert "data_root=/data device=cuda launcher.gpus_per_node=1" in command
    specs = sorted(ROOT.glob("conf/paper/*/table*.yaml")) + sorted(ROOT.glob("conf/paper/*/fig*.yaml"))
    help_text = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for spec in specs:
        assert f"{spec.parent.name}-{spec.stem}" in help_text
    missing = subprocess.run(["make", "pa3dfl-table7"], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode != 0 and "not built in this repository yet" in missing.stdout


def test_table_cli_rejects_a_bad_launcher_setting_before_any_run(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.experiment.table", str(spec_file(tmp_path)), "--out-dir",
                           str(tmp_path / "runs"), "--", "launcher.max_concurent=2"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "launcher.max_concurent is not a setting" in proc.stderr
    assert not (tmp_path / "runs").exists()



def test_hydra_capped_local_launcher_runs_in_waves_with_the_records_of_direct_runs(tmp_path):
    from bench.experiment.run import execute, run_dir_for, to_container
    from tests.helpers import cli_args, config

    proc = subprocess.run([sys.executable, "-m", "bench.experiment.run", "-m", "hydra/launcher=capped_local",
                           "hydra.launcher.max_concurrent=1", *cli_args(tmp_path / "hydra", ["rounds=2"]), "seed=0,1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spans = []
    for seed in (0, 1):
        swept = run_dir_for(to_container(config(tmp_path / "hydra", "rounds=2", f"seed={seed}")))
        spans.append(((swept / "config.yaml").stat().st_mtime, (swept / "summary.json").stat().st_mtime))
        direct = to_container(config(tmp_path / "direct", "rounds=2", f"seed={seed}"))
        execute({**direct, "threads": 1})  # the launcher's default cpus_per_task
        for name in ("rounds.jsonl", "summary.json"):
            assert (swept / name).read_bytes() == (run_dir_for(direct) / name).read_bytes()
    spans.sort()
    assert spans[0][1] <= spans[1][0]  # max_concurrent=1: the second job started after the first ended


def test_killing_a_table_midway_keeps_finished_cells_and_a_rerun_completes_it(tmp_path):
    import os
    import signal
    import time

    spec_path = spec_file(tmp_path, SPEC.replace("rounds=2", "rounds=6"))
    args = [sys.executable, "-m", "bench.experiment.table", str(spec_path), "--scale", "paper", "--launcher", "inline",
            "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list((tmp_path / "runs").rglob("summary.json")):
        assert proc.poll() is None and time.monotonic() < deadline, "the table ended before it could be killed"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = {p.parent: p.read_bytes() for p in (tmp_path / "runs").rglob("summary.json")}
    assert len(finished) < 4, "every run had finished before the kill: the test did not kill a table midway"
    rerun = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"4 cells, {len(finished)} finished, {4 - len(finished)} to run" in rerun.stdout
    assert all(run.joinpath("summary.json").read_bytes() == data for run, data in finished.items())
    table = (tmp_path / "results" / "fedcac" / "paper-scale" / "table1.md").read_text()
    assert "- partial:" not in table and "- missing:" not in table


def test_a_gpu_table_can_be_submitted_from_a_machine_without_a_gpu(tmp_path):
    import torch

    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "paper", out_dir=str(tmp_path / "runs"), extra=["device=cuda"])
    run_cells(cells, dry_run=True, launcher=load_launcher("slurm"))  # validated; the job checks the GPU
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda' but CUDA is not available here"):
            run_cells(cells, dry_run=True, launcher=load_launcher("local"))
    with pytest.raises(ValueError, match="device='gpu' is invalid"):
        run_cells(expand(spec, "paper", extra=["device=gpu"]), dry_run=True, launcher=load_launcher("slurm"))
