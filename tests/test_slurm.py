"""On a real Slurm cluster (``scripts/slurm/up.sh``): a table as a job array with the records of a local run,
requeue after preemption with identical records, and Hydra's ``submitit_slurm`` launcher.

When no cluster answers, the tests start one with ``scripts/slurm/up.sh`` (root only, idempotent, ~15 s);
if that is impossible they fail with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.core.records import RunDir
from bench.experiment.cells import run_cells
from bench.experiment.launch import RunBatch, load_launcher, with_threads
from bench.experiment.run import execute, run_dir_for, to_container
from bench.experiment.spec import expand, load_spec
from tests.helpers import cli_args, config
from tests.test_table import SPEC, spec_file

pytestmark = pytest.mark.slow  # submits jobs to the Slurm cluster

ROOT = Path(__file__).resolve().parent.parent


def _cluster_problem() -> str | None:
    if shutil.which("sinfo") is None:
        return "no Slurm client on PATH (scripts/slurm/up.sh installs and starts a one-node cluster)"
    state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if state.returncode != 0 or not state.stdout.strip():
        return f"sinfo finds no cluster: {state.stderr.strip()} (run scripts/slurm/up.sh as root)"
    if shutil.which("sacct") is None or subprocess.run(["sacct", "-n"], capture_output=True, timeout=30).returncode:
        return "sacct does not work: submitit needs Slurm accounting (slurmdbd) to see job states"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    problem = _cluster_problem()
    if problem and os.geteuid() == 0:
        up = subprocess.run([str(ROOT / "scripts" / "slurm" / "up.sh")], capture_output=True, text=True, timeout=900)
        problem = _cluster_problem() if up.returncode == 0 else f"scripts/slurm/up.sh failed: {up.stderr[-2000:]}"
    if problem:
        pytest.fail(f"no usable Slurm cluster: {problem}. Run scripts/slurm/up.sh as root (Debian 12) first.")


def _files(run: Path) -> tuple[bytes, bytes]:
    return (run / "rounds.jsonl").read_bytes(), (run / "summary.json").read_bytes()


def test_a_mini_paper_table_as_a_slurm_job_array_equals_the_local_records(slurm, tmp_path, capsys):
    spec = load_spec(ROOT / "conf" / "paper" / "fedcac" / "table3.yaml")
    launcher = load_launcher("slurm", ["launcher.timeout_min=20", "launcher.mem_gb=2"])
    on_slurm = run_cells(expand(spec, "mini", [0], out_dir=str(tmp_path / "slurm"), extra=["cache_dir=null"]),
                         spec=spec, scale="mini", launcher=launcher)
    out = capsys.readouterr().out
    assert "submitted Slurm array" in out and "with 6 tasks" in out and "6 runs finished, 0 failed" in out
    local = run_cells(expand(spec, "mini", [0], out_dir=str(tmp_path / "local"), extra=["cache_dir=null"]),
                      spec=spec, scale="mini", launcher=load_launcher("inline"))
    for (cell, run), reference in zip(on_slurm.items(), local.values(), strict=True):
        assert _files(run) == _files(reference), cell


def test_a_failing_slurm_task_is_reported_with_its_log_and_the_rest_completes(slurm, tmp_path, capsys):
    text = SPEC.replace("  - {name: pFedGate, unavailable: waits for the capacity-heterogeneity work}\n",
                        "  - {name: Broken, overrides: ['imports=[tests.failing_method]', method=fedavg, "
                        "method.name=fails_in_round, +method.fail_round=2]}\n")
    spec = load_spec(spec_file(tmp_path, text))
    dirs = run_cells(expand(spec, "paper", out_dir=str(tmp_path / "slurm")), spec=spec,
                     launcher=load_launcher("slurm", ["launcher.timeout_min=10", "launcher.mem_gb=2"]))
    out = capsys.readouterr().out
    assert "with 6 tasks" in out and "4 runs finished, 2 failed" in out
    failure = next(line for line in out.splitlines() if line.startswith("FAILED Broken | A | seed 1"))
    assert "_log.out" in failure
    assert all(RunDir(d).is_complete() for c, d in dirs.items() if c.row != "Broken")


def _wait(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {seconds:.0f} s waiting for {what}")
        time.sleep(0.2)


def _squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          timeout=30).stdout.strip()


def _sacct_states(job_id: str) -> list[str]:
    """Every state Slurm accounting recorded for the job, one per run of it (requeues included)."""
    return subprocess.run(["sacct", "-j", job_id, "-D", "-n", "-X", "-o", "State"], capture_output=True, text=True,
                          timeout=30).stdout.split()


def _history(job_id: str) -> str:
    """The job's recorded states and what slurmctld logged about it, for a failure message."""
    log = Path("/var/log/slurm/slurmctld.log")
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line for line in text.splitlines() if re.search(rf"JobId={job_id}\b", line) and "update_job" not in line]
    return f"sacct states {_sacct_states(job_id)}; slurmctld.log: " + " | ".join(lines[-12:])


def _submit_and_interrupt(tmp_path: Path, interrupt) -> tuple[Any, Path]:
    """Submit one long run, interrupt it once it has a checkpoint, wait for the end; returns (job, run dir)."""
    import submitit

    cfg = with_threads([to_container(config(tmp_path / "slurm", *LONG))], load_launcher("slurm"))[0]
    run = run_dir_for(cfg)
    executor = submitit.AutoExecutor(folder=str(tmp_path / "logs" / "%j"), cluster="slurm")
    executor.update_parameters(timeout_min=10, cpus_per_task=1, mem_gb=2, name="pfl-requeue-test")
    job = executor.submit(RunBatch([cfg], [0]))

    def checkpointed() -> bool:
        if job.done():
            raise AssertionError("the job ended before it could be interrupted: give it more rounds")
        return (run / "checkpoint.pt").exists()

    _wait(checkpointed, 240, "the job's first checkpoint")
    interrupt(job)

    # Slurm holds a requeued job for ~2 minutes (until the killed run's job credential has expired) before it may
    # start again. Waive most of that, once: a restart within the second of the kill is refused by slurmd ("Killing
    # non-startable batch job: Job credential revoked") and ends the job FAILED, so start it 2 s from now.
    waived = False

    def done() -> bool:
        nonlocal waived
        if not waived and _squeue_state(job.job_id) == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now+2"], capture_output=True,
                           timeout=30)
            waived = True
        return job.done()

    _wait(done, 300, "the requeued job to finish")
    try:
        result = job.result()
    except Exception as err:
        raise AssertionError(f"the requeued job left no result: {_history(job.job_id)}") from err
    assert result == [(0, True, "")]
    return job, run


LONG = ("rounds=300", "checkpoint.every_rounds=2", "num_clients=4")  # ~10 s; interrupted after round 2-4


def _reference(tmp_path: Path) -> Path:
    direct = to_container(config(tmp_path / "direct", *LONG))
    execute({**direct, "threads": 1})
    return run_dir_for(direct)


def test_a_timed_out_job_checkpoints_is_requeued_and_ends_with_identical_records(slurm, tmp_path):
    # what Slurm does signal_delay_s before the time limit: USR2 -> RunBatch.checkpoint -> scontrol requeue
    job, run = _submit_and_interrupt(tmp_path, lambda job: job._interrupt(timeout=True))
    log = Path(job.paths.stdout).read_text() + Path(job.paths.stderr).read_text()
    assert "Calling checkpoint method" in log and "Requeued" in log
    assert _files(run) == _files(_reference(tmp_path))


def test_a_preempted_job_is_requeued_by_slurm_and_ends_with_identical_records(slurm, tmp_path):
    # preemption with PreemptMode=REQUEUE: the scheduler kills the job and starts the same batch script again
    def preempt(job: Any) -> None:
        subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=30)

    job, run = _submit_and_interrupt(tmp_path, preempt)
    _wait(lambda: _sacct_states(job.job_id)[-1:] == ["COMPLETED"], 60, "sacct to record the end of the job")
    assert "REQUEUED" in _sacct_states(job.job_id)
    assert _files(run) == _files(_reference(tmp_path))


def test_hydra_multirun_with_submitit_slurm_equals_direct_runs(slurm, tmp_path):
    args = cli_args(tmp_path / "hydra", ["rounds=2"])
    proc = subprocess.run([sys.executable, "-m", "bench.experiment.run", "-m", "hydra/launcher=submitit_slurm",
                           "hydra.launcher.timeout_min=5", "hydra.launcher.cpus_per_task=1", *args, "seed=0,1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for seed in (0, 1):
        on_slurm = run_dir_for(to_container(config(tmp_path / "hydra", "rounds=2", f"seed={seed}")))
        direct_cfg = to_container(config(tmp_path / "direct", "rounds=2", f"seed={seed}"))
        execute({**direct_cfg, "threads": 1})
        assert _files(on_slurm) == _files(run_dir_for(direct_cfg))
