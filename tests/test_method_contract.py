"""The contract every registered method keeps (parametrised over ``methods.names()``, so a new method is covered by
registering it): it trains a small federation end to end to finite accuracies; a run interrupted after round 3 and
resumed by a new engine writes byte-identical records; a method with its own diagnostics writes them every round;
an unknown hyperparameter is refused by name before anything is written. Method-specific behaviour lives in each
method's own test file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import methods
from bench.builder import build_experiment
from bench.core.method import Method
from bench.experiment.compose import to_container
from tests.helpers import SETUP, config, interrupted_then_resumed


def test_every_setup_names_a_registered_method() -> None:
    assert set(SETUP) <= set(methods.names())


@pytest.mark.slow
@pytest.mark.parametrize("name", methods.names())
def test_trains_resumes_to_identical_records_and_writes_its_diagnostics(tmp_path: Path, name: str) -> None:
    whole, resumed = interrupted_then_resumed(tmp_path, f"method={name}", *SETUP.get(name, ()))
    assert whole == resumed
    rounds = [json.loads(line) for line in whole.splitlines()]
    evals = [r for r in rounds if r["kind"] == "eval" and r["round"] == 4]
    assert evals and all(math.isfinite(a) for r in evals for a in r["acc"])
    if methods.load(name).metrics is not Method.metrics:  # the method has diagnostics of its own
        assert sorted({r["round"] for r in rounds if r["kind"] == "method"}) == [1, 2, 3, 4]


@pytest.mark.parametrize("name", methods.names())
def test_refuses_an_unknown_hyperparameter_before_writing_anything(tmp_path: Path, name: str) -> None:
    cfg = to_container(config(tmp_path, f"method={name}", *SETUP.get(name, ()), "+method.no_such_knob=1"))
    with pytest.raises(ValueError, match="no_such_knob"):
        build_experiment(cfg)
    assert not (tmp_path / "runs").exists()
