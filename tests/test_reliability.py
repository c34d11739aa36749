"""Fault injection: divergence, damaged records and checkpoints, altered caches and data files, killed tables,
and file modes. Nothing finished is lost, nothing wrong is reported as a result, every error names the file
or key and the fix. ``make reliability`` runs these with the bad-input table (tests/test_bad_inputs.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench.core.records import RecordsDamaged, RunDir
from bench.experiment.compose import to_container
from bench.experiment.run import RunDiverged, execute, run_dir_for
from common.verified_io import load_verified, save_verified
from tests.helpers import config
from tests.test_table import SPEC, spec_file

pytestmark = [pytest.mark.reliability, pytest.mark.slow]  # processes started, killed, restarted
ROOT = Path(__file__).resolve().parent.parent
NAN = ("imports=[tests.failing_method]", "method=fedavg", "method.name=nan_in_round", "+method.nan_round=2")


def finished(tmp_path: Path, *overrides: str) -> tuple[dict, RunDir, bytes]:
    """A finished 3-round run with a checkpoint every round: (summary, run dir, its records' bytes)."""
    cfg = config(tmp_path, "rounds=3", "checkpoint.every_rounds=1", *overrides)
    summary = execute(cfg)
    run = RunDir(run_dir_for(to_container(cfg)))
    return summary, run, run.rounds.read_bytes()


def rerun(tmp_path: Path, *overrides: str) -> dict:
    return execute(config(tmp_path, "rounds=3", "checkpoint.every_rounds=1", *overrides))


# ------------------------------------------------------------------------------------------- divergence
def test_a_nan_model_mid_run_stops_the_run_and_is_never_a_result(tmp_path):
    cfg = config(tmp_path, *NAN, "rounds=4")
    with pytest.raises(RunDiverged, match="round 2 on client 1: its trained model is nan"):
        execute(cfg)
    run = RunDir(run_dir_for(to_container(cfg)))
    assert run.summary_state() == "diverged" and not run.summary.exists()
    marker = json.loads(run.diverged.read_text())
    assert (marker["round"], marker["client"], marker["what"]) == (2, 1, "trained model")
    assert run.records()[-1]["kind"] == "diverged"
    with pytest.raises(RunDiverged, match="delete the run directory"):  # deterministic: not retried
        execute(cfg)


def test_a_learning_rate_that_explodes_fails_the_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.experiment.run", *[str(o) for o in config_args(tmp_path)],
                           "train.lr=1e8", "rounds=3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "diverged in round" in proc.stderr and "lower train.lr" in proc.stderr


def config_args(tmp_path: Path) -> list[str]:
    from tests.helpers import cli_args

    return cli_args(tmp_path, [])


def test_a_table_shows_a_diverged_cell_as_diverged_and_exits_non_zero(tmp_path):
    spec = SPEC.replace("  - {name: Separate,", "  - {name: Exploding, overrides: [method=fedavg, train.lr=1e8]}\n"
                                              "  - {name: Separate,")
    args = [sys.executable, "-m", "bench.experiment.table", str(spec_file(tmp_path, spec)), "--scale", "mini",
            "--launcher",
            "inline", "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    table = (tmp_path / "results" / "fedcac" / "table1.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| Exploding |"))
    assert "diverged" in row and not any(ch.isdigit() for ch in row.split("|")[2])
    assert "- diverged: Exploding | A | seed 0: diverged in round" in table
    assert "did not finish" in proc.stderr


# ---------------------------------------------------------------------------------- records and checkpoints
def test_a_torn_last_record_is_dropped_and_the_run_resumes_to_identical_records(tmp_path):
    summary, run, records = finished(tmp_path)
    run.summary.unlink()
    (run.path / "checkpoint.pt").unlink()  # as if killed while writing round 3's records, before its checkpoint
    run.rounds.write_bytes(records[: len(records) - 40])
    assert rerun(tmp_path)["results"] == summary["results"]
    assert run.rounds.read_bytes() == records


def test_damaged_records_that_a_checkpoint_covers_are_refused_with_the_path_and_the_fix(tmp_path):
    _, run, records = finished(tmp_path)
    run.summary.unlink()
    lines = records.decode().splitlines(keepends=True)
    lines[1] = lines[1].replace('"round": 1', '"round": 7')  # altered: the checksum no longer matches
    run.rounds.write_text("".join(lines))
    with pytest.raises(RecordsDamaged, match=r"rounds.jsonl is damaged at line 2.*delete the run directory"):
        rerun(tmp_path)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, damage):
    summary, run, records = finished(tmp_path)
    run.summary.unlink()
    data = bytearray(run.checkpoint.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[len(data) // 2:]
    run.checkpoint.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match=r"checkpoint.pt (is damaged|cannot be read)"):
        again = rerun(tmp_path)
    assert again["results"] == summary["results"] and run.rounds.read_bytes() == records


def test_both_checkpoints_damaged_start_afresh_and_give_the_same_records(tmp_path):
    summary, run, records = finished(tmp_path)
    run.summary.unlink()
    for path in (run.checkpoint, run.previous_checkpoint):
        path.write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning):
        again = rerun(tmp_path)
    assert again["results"] == summary["results"] and run.rounds.read_bytes() == records


def test_a_finished_run_with_damaged_records_is_rerun_and_the_damaged_files_are_kept(tmp_path):
    summary, run, records = finished(tmp_path)
    run.rounds.write_bytes(records.replace(b'"round": 2', b'"round": 9', 1))
    assert run.summary_state() == "damaged"
    with pytest.warns(RuntimeWarning, match="damaged"):
        again = rerun(tmp_path)
    assert again["results"] == summary["results"] and run.rounds.read_bytes() == records
    assert (run.path / "damaged-1" / "rounds.jsonl").exists()


def test_a_damaged_summary_is_written_again_from_the_records(tmp_path):
    summary, run, _ = finished(tmp_path)
    run.summary.write_text('{"complete": tru')
    assert run.summary_state() == "damaged"
    checkpoint = run.checkpoint.read_bytes()
    with pytest.warns(RuntimeWarning, match="written again from the run's records"):
        assert rerun(tmp_path)["results"] == summary["results"]
    assert run.checkpoint.read_bytes() == checkpoint  # re-summarised, nothing trained again
    assert not (run.path / "damaged-1").exists()


def test_a_checkpoint_write_cut_short_leaves_the_newest_checkpoint_and_its_predecessor(tmp_path, monkeypatch):
    import bench.core.records as records_module

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.save_checkpoint(1, {"w": torch.zeros(2)}, "h")
    run.save_checkpoint(2, {"w": torch.ones(2)}, "h")

    def killed_while_writing(path, obj):  # the process dies before the new checkpoint replaces the old one
        assert load_verified(run.checkpoint)["round"] == 2, "checkpoint.pt must exist while the next is written"
        raise KeyboardInterrupt

    monkeypatch.setattr(records_module, "save_verified", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        run.save_checkpoint(3, {"w": torch.full((2,), 3.0)}, "h")
    assert load_verified(run.checkpoint)["round"] == 2
    assert load_verified(run.previous_checkpoint)["round"] == 2
    assert not list(run.path.glob(".*.tmp"))


def test_a_sigkill_while_records_are_written_loses_nothing_finished(tmp_path):
    args = [sys.executable, "-m", "bench.experiment.run", *config_args(tmp_path), "rounds=30",
            "checkpoint.every_rounds=1",
            "train.epochs=2"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs").rglob("checkpoint.prev.pt")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run = RunDir(next((tmp_path / "runs").rglob("checkpoint.pt")).parent)
    assert not run.is_complete()
    assert subprocess.run(args, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    clean = tmp_path / "clean"
    subprocess.run([sys.executable, "-m", "bench.experiment.run", *config_args(clean), "rounds=30",
                    "train.epochs=2"], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    assert run.rounds.read_bytes() == next(clean.rglob("rounds.jsonl")).read_bytes()


# ------------------------------------------------------------------------------------------ caches and data
def test_an_altered_partition_cache_entry_is_detected_and_recomputed(tmp_path):
    from datasets.partition_cache import cached_partition
    from tests.test_partition import LABELS

    args = (tmp_path, "toy", "dirichlet", LABELS, 5, 3)
    original = cached_partition(*args, alpha=0.5, n_train=20, n_test=5)
    entry = next(tmp_path.rglob("*.pt"))
    state = load_verified(entry)
    state["clients"][0]["train"] = state["clients"][1]["train"]  # someone altered the indices ...
    data = bytearray(entry.read_bytes())
    save_verified(entry, state)
    tampered = bytearray(entry.read_bytes())
    tampered[8:40] = data[8:40]  # ... and kept the old checksum
    entry.write_bytes(bytes(tampered))
    with pytest.warns(RuntimeWarning, match=f"partition cache file {entry} is unusable"):
        again = cached_partition(*args, alpha=0.5, n_train=20, n_test=5)
    assert all(torch.equal(a.train, b.train) for a, b in zip(original.clients, again.clients, strict=True))


def test_a_corrupt_dataset_file_names_the_file(tmp_path):
    from datasets.sources import load_source

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch",
                 "batches.meta"):
        (folder / name).write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(ValueError, match=r"cifar-10-batches-py/\w+ is damaged or not a CIFAR python batch"):
        load_source("cifar10", "train", tmp_path)


# -------------------------------------------------------------------------------------------- tables
def test_a_table_with_a_failed_cell_exits_non_zero_after_writing_the_table(tmp_path):
    spec = SPEC.replace("  - {name: Separate,", "  - {name: Broken, overrides: ['imports=[tests.failing_method]', "
                                              "method=fedavg, method.name=fails_in_round, +method.fail_round=1]}\n"
                                              "  - {name: Separate,")
    args = [sys.executable, "-m", "bench.experiment.table", str(spec_file(tmp_path, spec)), "--scale", "mini",
            "--launcher",
            "inline", "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "- failed: Broken | A | seed 0" in (tmp_path / "results" / "fedcac" / "table1.md").read_text()


def test_killing_a_table_takes_its_local_jobs_down_and_a_rerun_completes_cleanly(tmp_path):
    spec = SPEC.replace("rounds=1]", "rounds=40]").replace("seeds: [0]", "seeds: [0, 1]")
    args = [sys.executable, "-m", "bench.experiment.table", str(spec_file(tmp_path, spec)), "--scale", "mini",
            "--launcher",
            "local", "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results"), "--",
            "launcher.runs_per_job=1", "launcher.max_concurrent=2"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not any(p.stat().st_size for p in (tmp_path / "runs").rglob("rounds.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, "the table ended before it could be killed"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    started = [p.parent for p in (tmp_path / "runs").rglob("rounds.jsonl")]
    time.sleep(3)  # the jobs notice that their table is gone within a second
    grown = {run: (run / "rounds.jsonl").stat().st_size for run in started}
    time.sleep(2)
    assert all((run / "rounds.jsonl").stat().st_size == size for run, size in grown.items()), "orphans still run"
    assert not any(RunDir(run).is_complete() for run in started)
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not list((tmp_path / "runs").rglob("error.txt"))


# ------------------------------------------------------------------------------------------ shared results
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_run_files_honour_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        _, run, _ = finished(tmp_path)
    finally:
        os.umask(old)
    for name in ("config.yaml", "rounds.jsonl", "summary.json", "checkpoint.pt"):
        assert (run.path / name).stat().st_mode & 0o777 == mode, name
