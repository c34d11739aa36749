"""The command line as users run it: single runs, Hydra multirun, SIGKILL + resume, W&B offline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.experiment.run import execute, run_dir_for, to_container
from common.verified_io import load_verified
from tests.helpers import cli_args, config, wandb_records

pytestmark = pytest.mark.slow  # runs the command line in new processes

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}


def cli(tmp_path: Path, *overrides: str, multirun: bool = False) -> subprocess.Popen:
    args = [sys.executable, "-m", "bench.experiment.run", *(["-m"] if multirun else []), *cli_args(tmp_path, overrides)]
    return subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    return out


def checkpoint_round(path: Path) -> int:
    try:
        return int(load_verified(path)["round"])
    except Exception:  # noqa: BLE001 - not there yet
        return 0


SLOW_RUN = ("rounds=12", "train.epochs=3", "checkpoint.every_rounds=1", "method=fedprox")


def test_sigkill_then_rerun_resumes_to_identical_records(tmp_path):
    reference = run_dir_for(to_container(config(tmp_path / "ref", *SLOW_RUN)))
    execute(config(tmp_path / "ref", *SLOW_RUN))
    killed = run_dir_for(to_container(config(tmp_path / "kill", *SLOW_RUN)))
    for kill_after in (2, 7):  # kill twice, at different points, then let it finish
        proc = cli(tmp_path / "kill", *SLOW_RUN)
        deadline = time.time() + 180
        while checkpoint_round(killed / "checkpoint.pt") < kill_after and proc.poll() is None:
            assert time.time() < deadline, "run made no progress"
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed; make it slower"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (killed / "summary.json").exists()
    assert checkpoint_round(killed / "checkpoint.pt") < 12
    finish(cli(tmp_path / "kill", *SLOW_RUN))
    assert (killed / "rounds.jsonl").read_bytes() == (reference / "rounds.jsonl").read_bytes()
    assert (killed / "summary.json").read_bytes() == (reference / "summary.json").read_bytes()


def test_multirun_over_seeds_and_methods_matches_direct_runs(tmp_path):
    out = finish(cli(tmp_path, "method=fedavg,local", "seed=0,1", "rounds=2", multirun=True))
    summaries = sorted((tmp_path / "runs").rglob("summary.json"))
    assert len(summaries) == 4, out
    direct = run_dir_for(to_container(config(tmp_path / "direct", "method=local", "seed=1", "rounds=2")))
    execute(config(tmp_path / "direct", "method=local", "seed=1", "rounds=2"))
    via_multirun = run_dir_for(to_container(config(tmp_path, "method=local", "seed=1", "rounds=2")))
    assert (via_multirun / "rounds.jsonl").read_bytes() == (direct / "rounds.jsonl").read_bytes()


def test_cli_prints_the_primary_result_and_quiet_hides_the_progress_bar(tmp_path):
    proc = cli(tmp_path, "rounds=2", "quiet=false")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "fedavg seed=0:" in out and "post, best round" in out
    assert "2/2" in err  # tqdm writes to stderr
    quiet = cli(tmp_path / "q", "rounds=2")
    out_q, err_q = quiet.communicate(timeout=120)
    assert quiet.returncode == 0 and "2/2" not in err_q and out_q == ""


def test_cli_rejects_a_bad_value_with_a_clear_message(tmp_path):
    proc = cli(tmp_path, "participation=1.5")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "participation=1.5 is invalid: it must be in (0, 1]" in err


def test_wandb_offline_run_can_be_read_back(tmp_path):
    summary = execute(config(tmp_path, "rounds=3", "logger.wandb.mode=offline", "logger.wandb.tags=[unit]"))
    run_dir = run_dir_for(to_container(config(tmp_path, "rounds=3", "logger.wandb.mode=offline",
                                              "logger.wandb.tags=[unit]")))
    records = wandb_records(run_dir)
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["job_type"] == "fedavg" and run["run_group"] == "default"
    assert {"unit", "dataset:synthetic", "partition:pathological", "seed:0"} <= set(run["tags"])
    assert run["config"]["update"]["method"] == {"name": "fedavg"}
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [h["_step"] for h in history] == [1, 2, 3]
    final_post = next(r for r in summary["results"] if (r["selection"], r["stage"], r["weighting"])
                      == ("final", "post", "unweighted"))
    assert history[-1]["post/test/mean_acc"] == final_post["acc"]
    summaries = {}
    for r in records:
        if r["type"] == "summary":
            summaries.update(r["summary"]["update"])
    assert summaries["primary/acc"] == summary["primary"]["acc"]


def test_a_run_directory_in_use_by_another_process_is_left_alone(tmp_path):
    from bench.core.records import RunDir

    cfg = to_container(config(tmp_path))
    run = RunDir(run_dir_for(cfg))
    run.path.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
         "f.write('pid of the holder'); f.flush(); print('locked', flush=True); time.sleep(120)",
         str(run.path / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RuntimeError, match="is being run by another process \\(pid of the holder\\)"):
            execute(cfg)
        assert not run.rounds.exists() and not run.config.exists()
    finally:
        holder.kill()
        holder.wait()
    assert execute(cfg)["complete"]  # the lock dies with its holder
