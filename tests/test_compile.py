"""``compile=true`` (torch.compile of the model's body) against eager training.

(a) ``compile=false`` is the run as it was before the key existed: same run directory, same config hash,
byte-identical records. (b) A compiled run reaches the accuracy of its eager twin (same seeds) within the
spread that the training seed alone causes, and is a run of its own (another directory).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.experiment.compose import to_container
from bench.experiment.run import config_hash, execute, run_dir_for
from tests.helpers import config

pytestmark = pytest.mark.slow  # compiles and trains

#: a small run that learns: the small CNN on embedded digits, 6 clients, Dirichlet(0.5), 8 rounds of 2 epochs.
#: ``data_seed`` is fixed so that the seeds below change only the training randomness (init, shuffles), which
#: is what a different rounding order (compiled kernels) can perturb; the partition stays the same.
LEARNING_RUN = ["dataset=digits", "partition=dirichlet", "partition.alpha=0.5", "num_clients=6", "rounds=8",
                "train.epochs=2", "train.batch_size=20", "train.lr=0.1", "train.momentum=0.5", "data_seed=0"]
EAGER_SEEDS = (0, 1, 2)


def records(run_dir: Path) -> bytes:
    return (run_dir / "rounds.jsonl").read_bytes()


def config_lines(run_dir: Path) -> list[str]:
    return (run_dir / "config.yaml").read_text().splitlines()


def test_compile_false_is_the_run_without_the_key(tmp_path: Path) -> None:
    with_key = to_container(config(tmp_path / "with", "compile=false", "rounds=2"))
    without = to_container(config(tmp_path / "without", "rounds=2"))
    without.pop("compile")
    assert "compile" not in without and with_key["compile"] is False
    assert config_hash(with_key) == config_hash(without)
    dir_with, dir_without = run_dir_for(with_key), run_dir_for(without)
    assert dir_with.relative_to(tmp_path / "with") == dir_without.relative_to(tmp_path / "without")
    summary_with, summary_without = execute(with_key), execute(without)
    assert summary_with == summary_without  # results, config hash and code identity
    assert records(dir_with) == records(dir_without)
    # the key only shows in the written config (as `compile: false`)
    assert "compile: false" in config_lines(dir_with) and not any(
        line.startswith("compile:") for line in config_lines(dir_without))


def mean_acc(summary: dict[str, Any]) -> float:
    return float(summary["primary"]["acc"])


def resolution(summary: dict[str, Any], run_dir: Path) -> float:
    """The smallest change of the primary accuracy (unweighted mean over clients): one test sample of the client
    with the most test samples flipping."""
    evals = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    sizes = next(r["n"] for r in evals if r["kind"] == "eval")
    return 100.0 / max(sizes) / len(sizes)


@pytest.fixture
def fresh_dynamo() -> Any:
    """Compiled code stays in this process otherwise (guards, caches): reset Dynamo before and after."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_run_matches_eager_within_seed_noise(tmp_path: Path, fresh_dynamo: Any) -> None:
    eager = {}
    for seed in EAGER_SEEDS:
        cfg = config(tmp_path, *LEARNING_RUN, f"seed={seed}")
        eager[seed] = (execute(cfg), run_dir_for(to_container(cfg)))
    compiled_cfg = config(tmp_path, *LEARNING_RUN, f"seed={EAGER_SEEDS[0]}", "compile=true")
    compiled = execute(compiled_cfg)
    compiled_dir = run_dir_for(to_container(compiled_cfg))
    twin, twin_dir = eager[EAGER_SEEDS[0]]

    # a run of its own: another identity and directory, nothing of the eager run reused
    assert compiled_dir != twin_dir and compiled["config_hash"] != twin["config_hash"]
    assert (compiled_dir / "rounds.jsonl").exists() and "compile: true" in config_lines(compiled_dir)

    # The bound. Compiled kernels compute the same model and the same gradients with another rounding order,
    # with the same init, client data and shuffles (same seed). Such a perturbation can move the training
    # trajectory at most as far as drawing another training seed does, so the compiled run must be no further
    # from its eager twin than the eager runs of different training seeds are from each other: the range of
    # the eager accuracies over EAGER_SEEDS. That range can be 0 on a coarse metric, so the bound is at least
    # the metric's resolution (one test sample of one client). A compile that broke training (weights not
    # updated, wrong gradients, a stale model) lands far outside: checked below, the bound excludes chance level.
    accs = [mean_acc(summary) for summary, _ in eager.values()]
    spread = max(abs(a - b) for a, b in itertools.combinations(accs, 2))
    bound = max(spread, resolution(twin, twin_dir))
    chance = 100.0 / 10  # digits has 10 classes
    assert mean_acc(twin) - bound > chance, (accs, bound)  # the test can tell a model that did not learn
    gap = abs(mean_acc(compiled) - mean_acc(twin))
    assert gap <= bound, (f"compiled {mean_acc(compiled):.2f}% vs eager {mean_acc(twin):.2f}% (same seed): gap "
                          f"{gap:.2f} > bound {bound:.2f} (eager over seeds {EAGER_SEEDS}: {accs})")
    # the same kinds of records for the same rounds
    shape = [(r["kind"], r["round"], r.get("stage")) for r in map(json.loads, records(twin_dir).splitlines())]
    assert [(r["kind"], r["round"], r.get("stage"))
            for r in map(json.loads, records(compiled_dir).splitlines())] == shape
