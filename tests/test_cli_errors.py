"""Configuration errors on the command line (``bench.experiment.errors``): every bad input of
``tests/test_bad_inputs.py``, Hydra's own override and config-group errors, and bad table specs, launchers and run
directories give exit status 2 and a message of a few lines naming the key on stderr, without a traceback;
``PFL_DEBUG=1`` (``HYDRA_FULL_ERROR=1``) shows it, and a crash inside training keeps its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench.experiment.run import to_container
from tests.helpers import cli_args, config
from tests.test_bad_inputs import BAD_INPUTS

pytestmark = [pytest.mark.reliability, pytest.mark.slow]  # processes started, killed, restarted

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("PFL_DEBUG", "HYDRA_FULL_ERROR")}
ENV.update(WANDB_MODE="offline", PYTHONPATH=str(ROOT))
SPEC = "conf/paper/fedcac/table2.yaml"

#: (overrides, a piece of the message): Hydra's own errors, before any config exists
HYDRA_INPUTS = [
    (["method=nosuch"], "Could not find 'method/nosuch'; use one of: ditto, fedalt"),
    (["dataset=nosuch"], "Could not find 'dataset/nosuch'; use one of:"),
    (["train.lr=["], "cannot parse the override 'train.lr=['"),
    (["nosuchkey=1"], "Could not override 'nosuchkey'"),
    (["seed=0,1"], "Ambiguous value for argument 'seed=0,1'"),
]
#: (arguments of bench.experiment.table, a piece of the message)
TABLE_INPUTS = [
    (["conf/paper/nosuch/table9.yaml"], "table spec conf/paper/nosuch/table9.yaml does not exist"),
    ([SPEC, "--dry-run", "--", "train.lr=0"], "train.lr=0 is invalid"),
    ([SPEC, "--dry-run", "--", "method=nosuch"], "Could not find 'method/nosuch'"),
    ([SPEC, "--dry-run", "--", "train.lr=["], "cannot parse the override 'train.lr=['"),
    ([SPEC, "--dry-run", "--launcher", "nosuch"], "launcher 'nosuch' is unknown"),
    ([SPEC, "--dry-run", "--", "launcher.bogus=1"], "launcher.bogus is not a setting"),
    (["conf/paper/fedselect/table1.yaml", "--dry-run", "--", "eval.stages=[post]"],  # its rows score pre
     "eval.stages=['post'] does not evaluate stage 'pre', which eval.primary.stage=pre scores"),
]


def command(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env or ENV, capture_output=True,
                          text=True, timeout=300)


def assert_short_error(proc: subprocess.CompletedProcess, message: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) <= 5, proc.stderr


@pytest.mark.parametrize(("overrides", "message"), BAD_INPUTS + HYDRA_INPUTS,
                         ids=[" ".join(o) for o, _ in BAD_INPUTS + HYDRA_INPUTS])
def test_bench_run_refuses_a_bad_input_in_a_few_lines(tmp_path: Path, overrides: list[str], message: str):
    proc = command("bench.experiment.run", *cli_args(tmp_path, [f"cache_dir={tmp_path / 'cache'}", *overrides]))
    assert_short_error(proc, message)
    assert proc.stderr.startswith("error: ")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(("args", "message"), TABLE_INPUTS, ids=[" ".join(a) for a, _ in TABLE_INPUTS])
def test_bench_table_refuses_a_bad_input_in_a_few_lines(tmp_path: Path, args: list[str], message: str):
    out = ["--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    split = args.index("--") if "--" in args else len(args)
    proc = command("bench.experiment.table", *args[:split], *out, *args[split:])
    assert_short_error(proc, message)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def test_bench_partition_refuses_a_missing_or_impossible_run_in_a_few_lines(tmp_path: Path):
    assert_short_error(command("bench.experiment.partition", "export", str(tmp_path / "nosuch")),
                       "config.yaml does not exist")
    run = tmp_path / "run"
    run.mkdir()
    conf = to_container(config(tmp_path, "dataset=digits", "num_clients=100000"))
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(conf)))
    assert_short_error(command("bench.experiment.partition", "export", str(run)), "num_clients=100000 is invalid")


def test_a_hundred_thousand_clients_on_digits_are_refused_within_seconds(tmp_path: Path):
    started = time.monotonic()
    proc = command("bench.experiment.run", *cli_args(tmp_path, ["dataset=digits", "num_clients=100000"]))
    assert_short_error(proc, "num_clients=100000 is invalid: only 1442 training samples")
    assert time.monotonic() - started < 60  # about 5 s: the interpreter, the config and digits are loaded


@pytest.mark.parametrize("switch", ["PFL_DEBUG", "HYDRA_FULL_ERROR"])
def test_the_debug_switch_shows_the_traceback(tmp_path: Path, switch: str):
    proc = command("bench.experiment.run", *cli_args(tmp_path, ["train.batch_size=0"]), env={**ENV, switch: "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "train.batch_size=0" in proc.stderr


def test_the_debug_switch_shows_the_traceback_of_a_table(tmp_path: Path):
    proc = command("bench.experiment.table", "conf/paper/nosuch/table9.yaml", env={**ENV, "PFL_DEBUG": "1"})
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "does not exist" in proc.stderr


def test_a_crash_inside_training_keeps_its_traceback(tmp_path: Path):
    proc = command("bench.experiment.run", *cli_args(tmp_path, ["imports=[tests.failing_method]",
                                                                "method.name=fails_in_round",
                                                     "+method.fail_round=1"]))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" in proc.stderr and "deliberate failure in round 1" in proc.stderr


def test_a_multirun_runs_its_good_jobs_and_reports_a_bad_one_in_a_few_lines(tmp_path: Path):
    proc = command("bench.experiment.run", "-m", *cli_args(tmp_path, ["rounds=1", "train.lr=0.1,0"]))
    assert_short_error(proc, "train.lr=0 is invalid")
    assert len(list((tmp_path / "runs").rglob("summary.json"))) == 1
