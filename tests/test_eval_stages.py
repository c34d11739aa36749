"""Which stages a run evaluates (``eval.stages``): the default is the method's own stages with the identity and records
of a run from before the key; a list keeps only those stages, their records unchanged, and the summary says which;
the cost estimate follows it. Refused values are in ``tests/test_bad_inputs.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.experiment.compose import to_container
from bench.experiment.cost import work
from bench.experiment.run import config_hash, execute, run_dir_for
from tests.helpers import config

TWO_ROUNDS = ("rounds=2", "partition.val_fraction=0.25")


def evals(path: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (path / "rounds.jsonl").read_text().splitlines()) if r.get("kind") == "eval"]


def test_the_default_is_the_methods_stages_with_the_identity_of_a_run_from_before_the_key(tmp_path: Path) -> None:
    cfg = to_container(config(tmp_path, *TWO_ROUNDS))
    assert cfg["eval"]["stages"] is None
    older = {**cfg, "eval": {k: v for k, v in cfg["eval"].items() if k != "stages"}}
    assert config_hash(cfg) == config_hash(older)
    assert config_hash(to_container(config(tmp_path, *TWO_ROUNDS, "eval.stages=[post]"))) != config_hash(cfg)
    summary = execute(config(tmp_path, *TWO_ROUNDS))
    assert "eval_stages" not in summary
    # naming every stage evaluates what the default does: the same records, byte for byte
    every = execute(config(tmp_path, *TWO_ROUNDS, "eval.stages=[pre,post]"))
    assert every["eval_stages"] == ["pre", "post"]
    default_dir = run_dir_for(cfg)
    every_dir = run_dir_for(to_container(config(tmp_path, *TWO_ROUNDS, "eval.stages=[pre,post]")))
    assert default_dir != every_dir
    assert (every_dir / "rounds.jsonl").read_text() == (default_dir / "rounds.jsonl").read_text()
    assert {r["stage"] for r in evals(default_dir)} == {"pre", "post"}


def test_post_only_keeps_the_post_records_and_the_primary_result_and_records_no_pre(tmp_path: Path) -> None:
    default = execute(config(tmp_path, *TWO_ROUNDS))
    post = execute(config(tmp_path, *TWO_ROUNDS, "eval.stages=[post]"))
    assert post["eval_stages"] == ["post"]
    default_dir = run_dir_for(to_container(config(tmp_path, *TWO_ROUNDS)))
    post_dir = run_dir_for(to_container(config(tmp_path, *TWO_ROUNDS, "eval.stages=[post]")))
    assert evals(post_dir) == [r for r in evals(default_dir) if r["stage"] == "post"]
    assert {r["split"] for r in evals(post_dir)} == {"test", "val"} and len(evals(post_dir)) == 4  # 2 rounds
    assert post["primary"] == default["primary"]
    assert post["results"] == [r for r in default["results"] if r["stage"] == "post"]
    # the training records are the same too: evaluating draws no random numbers training uses
    trained = [line for line in (default_dir / "rounds.jsonl").read_text().splitlines() if '"eval"' not in line]
    assert [line for line in (post_dir / "rounds.jsonl").read_text().splitlines() if '"eval"' not in line] == trained


def test_pre_only_serves_a_pre_protocol(tmp_path: Path) -> None:
    pre = execute(config(tmp_path, *TWO_ROUNDS, "eval.stages=[pre]", "eval.primary.stage=pre"))
    assert pre["eval_stages"] == ["pre"] and {r["stage"] for r in pre["results"]} == {"pre"}


def test_local_records_only_post_which_answers_pre_so_post_serves_its_pre_protocol(tmp_path: Path) -> None:
    local = execute(config(tmp_path, *TWO_ROUNDS, "method=local", "eval.stages=[post]", "eval.primary.stage=pre"))
    assert local["eval_stages"] == ["post"] and local["primary"]["stage"] == "pre"


def test_the_cost_estimate_counts_only_the_evaluated_stages() -> None:
    sizes = {"train": [100, 64, 33, 1], "val": [0, 0, 0, 0], "test": [10, 20, 30, 40]}

    def cfg(stages: list[str] | None) -> dict[str, Any]:
        return {"num_clients": 4, "participation": 0.5, "rounds": 10, "eval": {"every": 3, "stages": stages},
                "train": {"batch_size": 32, "epochs": 2, "drop_last": False}, "method": {"name": "fedavg"}}

    # 4 evaluation rounds: every client's 100 test samples at post, 2 participants' (mean 25) at pre
    assert work(cfg(None), sizes).eval_samples == 4 * (100 + 2 * 25)
    assert work(cfg(["post"]), sizes).eval_samples == 4 * 100
    assert work(cfg(["pre"]), sizes).eval_samples == 4 * 2 * 25
    assert work(cfg(["post"]), sizes).train_steps == work(cfg(None), sizes).train_steps
