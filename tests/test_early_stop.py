"""Early stopping on the validation accuracy (``eval.early_stop``): the rule, a run that stops and records why,
resume after an interruption and after the stop, the neutral default, and refused settings."""

from __future__ import annotations

import json

import pytest

from bench.builder import build_experiment
from bench.core.records import RunDir
from bench.core.summary import early_stop
from bench.experiment.compose import to_container
from bench.experiment.run import config_hash, execute, run_dir_for
from tests.helpers import StopAfter, config, records

VAL = ("partition.val_fraction=0.25", "eval.primary.selection=best_val")


def val_record(round_: int, acc: float, stage: str = "post") -> dict:
    return {"kind": "eval", "round": round_, "stage": stage, "split": "val", "mean_acc": acc, "weighted_acc": 100 - acc}


def test_the_run_stops_after_more_than_patience_rounds_without_a_better_validation_accuracy():
    recs = [val_record(t, a) for t, a in enumerate([50, 60, 59, 60, 58, 61, 40], start=1)]
    # the best is round 2 (round 4 ties it: no gain); round 5 is 3 > 2 rounds after it
    assert early_stop(recs, 2, "post", "unweighted") == {
        "patience": 2, "stage": "post", "weighting": "unweighted", "best_round": 2, "best_val_acc": 60,
        "stopped_round": 5}
    assert early_stop(recs, 3, "post", "unweighted")["stopped_round"] is None  # round 6 improves first
    assert early_stop(recs, 2, "post", "weighted")["best_round"] == 1  # weighted: 50, 40, 41, ... falls
    assert early_stop(recs, 2, "pre", "unweighted")["best_round"] is None  # no validation records of that stage
    sparse = [val_record(t, a) for t, a in [(4, 50), (8, 49), (12, 49)]]  # evaluated every 4 rounds: patience counts
    assert early_stop(sparse, 5, "post", "unweighted")["stopped_round"] == 12  # rounds, not evaluations


def test_a_run_stops_early_records_why_and_resumes_to_identical_records(tmp_path):
    # lr 1e-12: the float32 weights do not move and the validation accuracy never changes, so round 1 stays the best
    # and round 3 is 2 > 1 rounds after it
    overrides = ("train.lr=1e-12", *VAL, "eval.early_stop=1", "rounds=8", "checkpoint.every_rounds=1")
    summary = execute(config(tmp_path, *overrides))
    assert summary["early_stop"] == {"patience": 1, "stage": "post", "weighting": "unweighted", "best_round": 1,
                                     "best_val_acc": summary["early_stop"]["best_val_acc"], "stopped_round": 3}
    path = run_dir_for(to_container(config(tmp_path, *overrides)))
    whole = records(path)
    assert max(json.loads(line)["round"] for line in whole.splitlines()) == 3
    assert {r["round"] for r in summary["results"] if r["selection"] == "final"} == {3}
    cfg = to_container(config(tmp_path, *overrides))
    build_experiment(cfg).engine(RunDir(path), config_hash(cfg)).run()  # resumed after it stopped: nothing more
    assert records(path) == whole
    broken = RunDir(tmp_path / "broken")
    with pytest.raises(KeyboardInterrupt):
        build_experiment(cfg).engine(broken, config_hash(cfg), [StopAfter(2)]).run()
    build_experiment(cfg).engine(broken, config_hash(cfg)).run()
    assert records(broken.path) == whole


def test_early_stopping_is_off_by_default_and_leaves_a_runs_identity_as_before(tmp_path):
    cfg = to_container(config(tmp_path, *VAL))
    assert cfg["eval"]["early_stop"] is None
    older = {**cfg, "eval": {k: v for k, v in cfg["eval"].items() if k != "early_stop"}}
    assert config_hash(cfg) == config_hash(older)
    assert config_hash(to_container(config(tmp_path, *VAL, "eval.early_stop=5"))) != config_hash(cfg)
    summary = execute(config(tmp_path, *VAL, "train.lr=1e-12", "rounds=4"))
    assert "early_stop" not in summary and max(r["round"] for r in summary["results"]) == 4


@pytest.mark.parametrize(("overrides", "message"), [
    (("eval.early_stop=0", *VAL), "eval.early_stop=0 is invalid"),
    (("eval.early_stop=true", *VAL), "eval.early_stop=True is invalid"),
    (("eval.early_stop=3", "partition.val_fraction=0"), "needs a validation split")])
def test_bad_early_stopping_settings_are_refused_before_anything_runs(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        execute(config(tmp_path, *overrides))
    assert not (tmp_path / "runs").exists()
