"""The dry run's cost estimate (bench.experiment.cost): the work a config implies, the calibration cache, the printed
lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.experiment.cost as cost
from bench.experiment.compose import compose_config, to_container
from bench.experiment.cost import Calibration, Work, cached_calibration, estimate_run, eval_rounds, participants, work
from bench.experiment.table import main as table_main

SIZES = {"train": [100, 64, 33, 1], "val": [0, 0, 0, 0], "test": [10, 20, 30, 40]}


def _cfg(method: str = "fedavg", **train: object) -> dict:
    return {"num_clients": 4, "participation": 0.5, "rounds": 10, "eval": {"every": 3},
            "train": {"batch_size": 32, "epochs": 2, "drop_last": False, **train}, "method": {"name": method}}


def test_work_counts_the_training_steps_and_evaluated_samples_of_a_config() -> None:
    cfg = _cfg()
    assert participants(cfg) == 2 and eval_rounds(10, 3) == 4  # rounds 3, 6, 9 and the last
    # batches per client ceil(n / 32) = 4, 2, 2, 1 (mean 2.25); 10 rounds x 2 participants x 2 epochs x 2.25
    # evaluation in 4 rounds: every client's 100 test samples at post, 2 participants' (mean 25) at pre
    assert work(cfg, SIZES) == Work(train_steps=90.0, eval_samples=4 * (100 + 2 * 25))
    assert work(_cfg(drop_last=True), SIZES).train_steps == 10 * 2 * 2 * (3 + 2 + 1 + 0) / 4
    assert work(_cfg("local"), SIZES).eval_samples == 4 * 100  # evaluated at post only


def test_an_estimate_is_the_work_times_the_calibrated_times(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {**_cfg(), "dataset": {"name": "digits", "source": "digits"}, "eval": {"every": 3, "batch_size": 100}}
    fake = Calibration(step_s=0.01, eval_sample_s=0.001, peak_bytes=1000, state_bytes=10, pool_bytes=4 * 64,
                       device="cpu", device_name="test cpu")
    monkeypatch.setattr(cost, "cached_calibration", lambda *args: fake)
    est = estimate_run(cfg, SIZES, threads=1, base_bytes=5000)
    assert est.seconds == pytest.approx(90 * 0.01 + 600 * 0.001)
    # peak: calibration's, with the run's pool (4 bytes x 8 x 8 pixels x 298 samples) for the calibration's and its
    # state scaled from 2 clients to 4, plus the process's resident set
    assert est.peak_bytes == 1000 - 256 + 4 * 64 * 298 + 10 * 1 + 5000


def _digits_config(tmp_path: Path, *extra: str) -> dict:
    return to_container(compose_config(["dataset=digits", "model=small_cnn", "num_clients=4", "rounds=2",
                                        f"cache_dir={tmp_path / 'cache'}", *extra]))


def test_a_calibration_is_cached_per_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _digits_config(tmp_path)
    first = cached_calibration(cfg, (1, 8, 10), 1, (40, 10))
    assert first.step_s > 0 and first.eval_sample_s > 0 and first.device == "cpu"
    (entry,) = (tmp_path / "cache" / "cost").glob("*.json")
    assert json.loads(entry.read_text())["key"]["model"]["name"] == "small_cnn"

    def no_calibration(*args: object) -> Calibration:
        raise AssertionError("calibrated again")

    monkeypatch.setattr(cost, "calibrate", no_calibration)
    assert cached_calibration(cfg, (1, 8, 10), 1, (40, 10)) == first  # read back, not measured again
    with pytest.raises(AssertionError, match="calibrated again"):  # another batch size is another setup
        cached_calibration(_digits_config(tmp_path, "train.batch_size=16"), (1, 8, 10), 1, (40, 10))


TOY = """
paper: fedcac
table: "9"
title: toy
protocol: {stage: post, selection: final, weighting: unweighted}
seeds: [0, 1]
base: [num_clients=4, rounds=3, quiet=true, partition.n_train=40, partition.n_test=10]
columns:
  - {name: digits, dataset: digits, model: small_cnn, overrides: [partition=dirichlet]}
rows:
  - {name: FedAvg, overrides: [method=fedavg]}
  - {name: Local, overrides: [method=local]}
"""


def test_the_dry_run_prints_the_cost_and_writes_no_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = tmp_path / "toy.yaml"
    spec.write_text(TOY)
    args = [str(spec), "--scale", "paper", "--dry-run", "--out-dir", str(tmp_path / "runs"), "--launcher", "slurm",
            "--", "launcher.runs_at_once=3", "launcher.runs_per_job=2", f"cache_dir={tmp_path / 'cache'}"]
    assert table_main(args) == 0
    out = capsys.readouterr().out
    assert "cost estimate (calibrated here on" in out
    assert "4 runs to launch of 4: " in out and "device-hours" in out
    for row in ("FedAvg", "Local"):
        assert f"  {row}: 2 runs, " in out and "peak memory" in out
    assert "slurm: runs_per_job=2, runs_at_once=3 -> 2 array tasks, 3 runs sharing a GPU" in out
    assert not (tmp_path / "runs").exists()  # a dry run launches nothing and writes no run directory
    assert len(list((tmp_path / "cache" / "cost").glob("*.json"))) == 2  # one calibration per method
    assert table_main([str(spec), "--scale", "paper", "--dry-run", "--no-cost", "--out-dir",
                       str(tmp_path / "runs")]) == 0
    assert "cost estimate" not in capsys.readouterr().out


def test_a_method_sized_by_the_runs_federation_is_calibrated_on_the_calibrations(tmp_path: Path) -> None:
    """Pa3dFL's R1 = p_min T comes from ``method.federation`` (the run's capacities): the calibration's 2 clients
    have another p_min, so it must describe the calibration's federation, not the run's."""
    cfg = _digits_config(tmp_path, "method=pa3dfl", "capacity.setting=hetero", "num_clients=20")
    cal = cached_calibration(cfg, (1, 8, 10), 1, (40, 10))
    assert cal.step_s > 0 and cal.eval_sample_s > 0
