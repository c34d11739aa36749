"""The local worker pool and runs at once (several runs of one job on one device): records equal to one run after
another in this process, real overlap, failures, dead and hung workers, Slurm's wiring (without a cluster)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.core.engine import METHODS, ClientRound
from bench.core.flat import FlatModel
from bench.experiment.launch import RunBatch, launch, load_launcher, run_pool, with_threads
from bench.experiment.run import run_dir_for, to_container
from methods.fedavg import FedAvg
from tests.helpers import config
from tests.test_table import SPEC, spec_file

pytestmark = pytest.mark.slow  # starts pool workers

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "imports=[tests.test_launch_pool]"  # loads the methods below into the workers


@dataclass(frozen=True)
class RoundHyper:
    round: int


if "dies_in_round" not in METHODS:  # registered once per process, whichever way this module is imported
    @METHODS.register("dies_in_round")
    class DiesInRound(FedAvg):
        """Its process is killed (SIGKILL, like the out-of-memory killer) in round ``method.round``."""

        Hyper = RoundHyper

        def train_client(self, task: ClientRound, model: FlatModel) -> float:
            if task.round == self.hp.round:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().train_client(task, model)

    @METHODS.register("hangs_in_round")
    class HangsInRound(FedAvg):
        """Never ends round ``method.round``."""

        Hyper = RoundHyper

        def train_client(self, task: ClientRound, model: FlatModel) -> float:
            if task.round == self.hp.round:
                time.sleep(3600)
            return super().train_client(task, model)


def tiny(out: Path, *overrides: str) -> dict:
    return to_container(config(out, *overrides))


def four_runs(out: Path, *extra: str) -> list[dict]:
    return [tiny(out, f"method={m}", f"seed={s}", *extra) for m in ("fedavg", "local") for s in (0, 1)]


def records(cfg: dict) -> tuple[bytes, bytes]:
    run = run_dir_for(cfg)
    return (run / "rounds.jsonl").read_bytes(), (run / "summary.json").read_bytes()


def span(cfg: dict) -> tuple[float, float]:
    """When a run wrote its config (after loading its data) and its summary (its last write)."""
    run = run_dir_for(cfg)
    return (run / "config.yaml").stat().st_mtime, (run / "summary.json").stat().st_mtime


def test_pool_workers_serve_several_runs_with_the_records_of_one_run_after_another(tmp_path):
    offline = "logger.wandb.mode=offline"  # a warm worker's second W&B run reuses its W&B service
    inline = four_runs(tmp_path / "inline", offline)
    pooled = four_runs(tmp_path / "pool", offline)
    assert all(o.ok for o in launch(inline, load_launcher("inline"), tmp_path / "logs"))
    seen = []
    outcomes = launch(pooled, load_launcher("local", ["launcher.max_concurrent=2"]), tmp_path / "logs",
                      on_outcome=seen.append)
    assert [o.index for o in outcomes] == [0, 1, 2, 3] and all(o.ok for o in outcomes), outcomes
    assert sorted(o.index for o in seen) == [0, 1, 2, 3]  # reported as each run ended
    served = Counter(o.worker for o in outcomes)
    assert len(served) == 2 and max(served.values()) >= 2  # two processes, at least one served several runs
    assert all(o.worker != os.getpid() for o in outcomes)
    for a, b in zip(inline, pooled, strict=True):
        assert records(a) == records(b)
        assert list((run_dir_for(b) / "wandb").glob("offline-run-*"))
    first = sorted(outcomes, key=lambda o: o.started)[:2]  # both workers got a run at once
    assert max(o.started for o in first) < min(o.ended for o in first)
    assert all(Path(o.log).read_text().startswith("--- ") for o in outcomes)  # each run's own log


def test_runs_at_once_overlap_in_one_job_and_give_the_records_of_sequential_runs(tmp_path):
    sequential = with_threads(four_runs(tmp_path / "sequential", "rounds=4")[:2], {"cpus_per_task": 1})
    together = with_threads(four_runs(tmp_path / "together", "rounds=4")[:2], {"cpus_per_task": 1})
    assert RunBatch(sequential, [0, 1])() == [(0, True, ""), (1, True, "")]
    assert RunBatch(together, [0, 1], runs_at_once=2)() == [(0, True, ""), (1, True, "")]
    for a, b in zip(sequential, together, strict=True):
        assert records(a) == records(b)
    (start_a, end_a), (start_b, end_b) = span(together[0]), span(together[1])
    assert max(start_a, start_b) < min(end_a, end_b)  # both were training at the same time
    (start_a, end_a), (start_b, end_b) = span(sequential[0]), span(sequential[1])
    assert end_a <= start_b  # the check can fail: one after another they do not overlap


def test_a_failing_a_killed_and_a_hung_run_fail_alone_with_their_logs(tmp_path):
    configs = with_threads([
        tiny(tmp_path, "seed=0"),
        tiny(tmp_path, "imports=[tests.failing_method]", "method.name=fails_in_round", "+method.fail_round=2"),
        tiny(tmp_path, PLUGIN, "method.name=dies_in_round", "+method.round=2"),
        tiny(tmp_path, "seed=1"),
        tiny(tmp_path, "seed=2"),
    ], {"cpus_per_task": 1})
    outcomes = {o.index: o for o in run_pool(configs, range(5), 2, log_dir=tmp_path / "logs")}
    assert sorted(outcomes) == [0, 1, 2, 3, 4]
    assert [outcomes[i].ok for i in range(5)] == [True, False, False, True, True]
    assert "deliberate failure in round 2" in outcomes[1].error
    assert "deliberate failure in round 2" in Path(outcomes[1].log).read_text()  # the traceback is in its log
    assert "died (exit code -9, signal 9)" in outcomes[2].error and outcomes[2].log.endswith(".log")
    assert (run_dir_for(configs[2]) / "rounds.jsonl").exists()  # it did run until it was killed
    hung = with_threads([tiny(tmp_path, PLUGIN, "method.name=hangs_in_round", "+method.round=1")],
                        {"cpus_per_task": 1})
    [outcome] = run_pool(hung, [0], 1, timeout_s=3)
    assert not outcome.ok and "timed out after 3 s (launcher.timeout_min)" in outcome.error


def test_slurm_tasks_get_cpus_for_all_their_runs_at_once_and_report_each_run(tmp_path, monkeypatch):
    import submitit

    params: dict = {}

    class Job:
        def __init__(self, batch: RunBatch) -> None:
            self.value, self.job_id = batch(), f"7_{len(jobs)}"
            self.paths = type("Paths", (), {"stdout": "task.out", "stderr": "task.err"})

        def done(self) -> bool:
            return True

        def result(self) -> list:
            return self.value

    class Executor:  # runs each array task here, at submission
        def __init__(self, **kwargs: object) -> None:
            pass

        def update_parameters(self, **kwargs: object) -> None:
            params.update(kwargs)

        def batch(self) -> contextlib.AbstractContextManager:
            return contextlib.nullcontext()

        def submit(self, batch: RunBatch) -> Job:
            jobs.append(Job(batch))
            return jobs[-1]

    jobs: list[Job] = []
    monkeypatch.setattr(submitit, "AutoExecutor", Executor)
    slurm = load_launcher("slurm", ["launcher.runs_per_job=4", "launcher.runs_at_once=2", "launcher.cpus_per_task=1"])
    seen = []
    outcomes = launch(four_runs(tmp_path / "slurm"), slurm, tmp_path / "logs", on_outcome=seen.append)
    assert params["cpus_per_task"] == 2 and len(jobs) == 1  # one task, 2 runs at once x 1 thread
    assert all(o.ok and o.log == "task.out / task.err" for o in outcomes) and len(seen) == 4
    launch(four_runs(tmp_path / "inline"), load_launcher("inline"), tmp_path / "logs")
    for a, b in zip(four_runs(tmp_path / "inline"), four_runs(tmp_path / "slurm"), strict=True):
        assert records(a) == records(b)


def test_bad_pool_settings_are_named():
    with pytest.raises(ValueError, match="launcher.runs_at_once=0 is invalid: it must be an integer >= 1"):
        load_launcher("slurm", ["launcher.runs_at_once=0"])
    with pytest.raises(ValueError, match="launcher.max_concurrent=0 is invalid: it must be an integer >= 1 or null"):
        load_launcher("local", ["launcher.max_concurrent=0"])
    assert load_launcher("local")["runs_per_job"] is None  # a worker serves runs until the queue is empty


def test_sigterm_cancels_a_local_table_its_workers_end_and_finished_runs_stay(tmp_path):
    spec = SPEC.replace("rounds=1]", "rounds=60]").replace("seeds: [0]", "seeds: [0, 1]")
    args = [sys.executable, "-m", "bench.experiment.table", str(spec_file(tmp_path, spec)), "--scale", "mini",
            "--launcher",
            "local", "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--",
            "launcher.max_concurrent=2"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not any(p.stat().st_size for p in (tmp_path / "runs").rglob("rounds.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, "the table ended before it could be stopped"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "interrupted: 2 running runs cancelled" in out, out[-2000:]
    started = [p.parent for p in (tmp_path / "runs").rglob("rounds.jsonl")]
    sizes = {run: (run / "rounds.jsonl").stat().st_size for run in started}
    time.sleep(2)
    assert all((run / "rounds.jsonl").stat().st_size == size for run, size in sizes.items()), "workers still run"
