"""Per-row evaluation protocols and the "did not train" state of runs and table cells."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.core.summary import chance_verdict, final_eval
from bench.experiment.spec import differing_protocols, expand, load_spec, row_protocol
from bench.experiment.table import main as table_main

ROOT = Path(__file__).resolve().parent.parent

# two rows on learnable data: FedAvg scored on its global model (stage post, its own protocol), and a FedAvg whose
# learning rate keeps it at chance
SPEC = """
paper: fedselect
table: "1"
title: toy
protocol: {stage: pre, selection: final, weighting: unweighted}
seeds: [0]
base: [rounds=2, num_clients=2, train.batch_size=16, train.lr=0.1, cache_dir=null, quiet=true,
       logger.wandb.mode=disabled]
columns:
  - {name: A, dataset: digits, model: small_cnn, overrides: [partition=iid]}
rows:
  - {name: FedAvg, overrides: [method=fedavg], protocol: {stage: post}}
  - {name: Frozen, overrides: [method=fedavg, train.lr=1e-9]}
"""


def spec_file(tmp_path: Path, text: str = SPEC) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return path


def record(acc: list[float], n: list[int], clients: list[int] | None = None) -> dict:
    correct = [a * k / 100 for a, k in zip(acc, n, strict=True)]
    return {"round": 5, "stage": "post", "clients": clients or list(range(len(acc))), "n": n, "acc": acc,
            "mean_acc": sum(acc) / len(acc), "weighted_acc": 100 * sum(correct) / sum(n)}


def test_chance_is_the_best_constant_prediction_with_a_binomial_margin():
    counts = {0: [80, 20], 1: [50, 50]}
    # unweighted: class 0 scores (0.8 + 0.5) / 2 = 0.65; its standard error sqrt((.16 + .25) / 4 / 100) = 0.032016
    verdict = chance_verdict(record([71.0, 71.0], [100, 100]), counts, "unweighted", z=2.0)
    assert verdict["chance"] == pytest.approx(65.0)
    assert verdict["threshold"] == pytest.approx(65.0 + 2 * 100 * math.sqrt(0.001025))
    assert verdict["verdict"] == "did not train"
    assert chance_verdict(record([72.0, 72.0], [100, 100]), counts, "unweighted", z=2.0)["verdict"] == "trained"
    # per client: against its own majority class rate (client 0: 80 % + 2 x 4 %)
    assert verdict["clients"]["0"]["threshold"] == pytest.approx(88.0)
    assert verdict["clients"]["0"]["verdict"] == "did not train"
    assert verdict["clients"]["1"]["verdict"] == "trained"  # 71 > 50 + 2 x 5


def test_weighted_chance_is_the_pooled_majority_rate_and_unweighted_weights_clients_equally():
    counts = {0: [90, 10], 1: [0, 300]}
    rec = record([50.0, 50.0], [100, 300])
    assert chance_verdict(rec, counts, "weighted", z=0.0)["chance"] == pytest.approx(100 * 310 / 400)
    assert chance_verdict(rec, counts, "unweighted", z=0.0)["chance"] == pytest.approx(100 * (0.1 + 1.0) / 2)
    # clients without test images do not count
    rec = record([50.0, 50.0, 0.0], [100, 300, 0])
    assert chance_verdict(rec, {**counts, 2: [0, 0]}, "weighted", z=0.0)["chance"] == pytest.approx(77.5)


def test_final_eval_is_the_last_round_of_the_stage_and_post_answers_pre_for_methods_without_pre():
    records = [{"kind": "eval", "split": "test", "stage": s, "round": t} for t in (1, 3, 2) for s in ("pre", "post")]
    assert final_eval(records, "pre")["round"] == 3
    only_post = [r for r in records if r["stage"] == "post"]
    assert final_eval(only_post, "pre")["stage"] == "post"
    assert final_eval([], "post") is None


def test_a_row_protocol_overrides_the_tables_and_is_validated(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    assert row_protocol(spec, "FedAvg") == {"stage": "post", "selection": "final", "weighting": "unweighted"}
    assert row_protocol(spec, "Frozen") == spec["protocol"]
    assert differing_protocols(spec) == {"FedAvg": row_protocol(spec, "FedAvg")}
    fedavg, frozen = expand(spec, "paper", out_dir=str(tmp_path / "runs"))
    assert "eval.primary.stage=post" in fedavg.overrides and "eval.primary.stage=pre" not in fedavg.overrides
    assert "eval.primary.stage=pre" in frozen.overrides
    for bad, message in (("{stag: post}", r"\['stag'\]"), ("{stage: mid}", "stage='mid' is invalid"),
                         ("post", "give a mapping")):
        text = SPEC.replace("protocol: {stage: post}", f"protocol: {bad}")
        with pytest.raises(ValueError, match=message):
            load_spec(spec_file(tmp_path, text))
    with pytest.raises(ValueError, match=r"needs"):
        load_spec(spec_file(tmp_path, SPEC.replace("selection: final, ", "")))


def test_rows_are_scored_by_their_protocol_and_a_run_at_chance_shows_as_did_not_train(tmp_path, capsys):
    args = [str(spec_file(tmp_path)), "--scale", "paper", "--launcher", "inline", "--quiet",
            "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    assert table_main(args) == 1  # a cell did not train: the command fails, like a failed or diverged run
    assert "did not train" in capsys.readouterr().err
    base = tmp_path / "results" / "fedselect" / "paper-scale" / "table1"
    md = base.with_suffix(".md").read_text()
    assert "| Frozen | did not train |" in md
    assert "- did not train: Frozen | A | seed 0: final accuracy" in md
    assert "Rows scored differently or after fine-tuning: FedAvg: stage=post" in md
    frame = json.loads(base.with_suffix(".stats.json").read_text())
    assert frame["row_protocols"]["FedAvg"].startswith("stage=post")
    # the FedAvg cell is its global model's final accuracy, and its run's summary says so
    fedavg = next((tmp_path / "runs").rglob("fedavg/digits-iid-s0-*/summary.json"))
    frozen = [p for p in (tmp_path / "runs").rglob("summary.json") if p != fedavg][0]
    summary = json.loads(fedavg.read_text())
    assert summary["protocol"]["stage"] == "post" and summary["trained"]["verdict"] == "trained"
    post_final = next(r for r in summary["results"] if (r["stage"], r["selection"], r["weighting"])
                      == ("post", "final", "unweighted"))
    assert f"| FedAvg | {post_final['acc']:.2f} |" in md
    assert json.loads(frozen.read_text())["trained"]["verdict"] == "did not train"
    csv = base.with_suffix(".csv").read_text()
    assert "did not train" in csv and "post/final/unweighted" in csv


def test_eval_chance_z_null_turns_the_verdict_off_and_the_table_says_how_many_runs_were_unchecked(tmp_path):
    text = SPEC.replace("logger.wandb.mode=disabled]", "logger.wandb.mode=disabled, eval.chance_z=null]")
    args = [str(spec_file(tmp_path, text)), "--scale", "paper", "--launcher", "inline", "--quiet",
            "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    assert table_main(args) == 0
    md = (tmp_path / "results" / "fedselect" / "paper-scale" / "table1.md").read_text()
    assert "did not train" not in md and "2 runs were not checked against chance" in md


PER_CLIENT_SPEC = """
paper: fedc2i
table: "1"
title: toy per-domain
protocol: {stage: pre, selection: final, weighting: unweighted}
seeds: [0]
columns:
  - name: Avg
    dataset: digits
    model: small_cnn
    overrides: [partition=iid]
    per_client: [{name: Easy}, {name: Hard}]
rows:
  - {name: Local, overrides: [method=local]}
"""


def fake_run(path: Path, acc: list[float], n: list[int], counts: list[list[int]] | None) -> Path:
    """A finished run directory with one final evaluation record (``post``: Local records no ``pre``) and, unless
    ``counts`` is None, its partition report's test counts."""
    from bench.core.records import RunDir
    from bench.core.summary import eval_record, summarize
    from common.verified_io import atomic_write_json

    run = RunDir(path)
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("eval: {chance_z: 2.33}\nimports: []\n")
    rec = eval_record(3, "post", "test", list(range(len(acc))), [a * k / 100 for a, k in zip(acc, n, strict=True)],
                      [0.0] * len(acc), n)
    run.append_records([rec])
    atomic_write_json(run.summary, {"complete": True, "results": summarize([rec], pre_is_post=True)})
    if counts is not None:
        (path / "partition").mkdir()
        header = "client,part," + ",".join(f"class_{c}" for c in range(len(counts[0]))) + ",total\n"
        (path / "partition" / "class_counts.csv").write_text(header + "".join(
            f"{k},{part},{','.join(map(str, row if part == 'test' else [0] * len(row)))},{sum(row)}\n"
            for k, row in enumerate(counts) for part in ("train", "test")))
    return path


def test_a_per_client_column_at_chance_is_did_not_train_while_the_mean_column_is_a_number(tmp_path):
    from bench.experiment.collect import collect
    from bench.experiment.render import wide_table

    spec = load_spec(spec_file(tmp_path, PER_CLIENT_SPEC))
    cell = expand(spec, "paper")[0]
    # client 0 at 90 % of 100 images (majority 10 %), client 1 at 12 % of 200 (majority 10 %, threshold ~14.9 %)
    run = fake_run(tmp_path / "run", [90.0, 12.0], [100, 200], [[10] * 10, [20] * 10])
    frame, problems = collect(spec, "paper", {cell: run})
    shown = wide_table(frame, "paper").map(lambda v: v.removesuffix(" ‡"))  # a hand-made run has no code identity
    assert shown.loc["Local", "Easy (ours)"] == "90.00" and shown.loc["Local", "Hard (ours)"] == "did not train"
    assert shown.loc["Local", "Avg (ours)"] == "51.00"  # the mean over clients is far above chance
    assert [p.split(":")[0] for p in problems] == ["did not train"] and "Local | Hard | seed 0" in problems[0]
    # a run without a partition report whose data cannot be rebuilt is counted as unchecked, not judged
    bare = fake_run(tmp_path / "bare", [90.0, 12.0], [100, 200], None)
    (bare / "config.yaml").write_text(f"eval: {{chance_z: 2.33}}\nimports: []\ndataset: {{name: cifar10, source: "
                                      f"cifar10}}\ndata_root: {tmp_path / 'empty'}\npartition: {{scheme: iid}}\n"
                                      "num_clients: 2\ndata_seed: 0\ncache_dir: null\n")
    frame, problems = collect(spec, "paper", {cell: bare})
    assert frame.attrs["unchecked_runs"] == 1 and not problems


def test_spec_notes_are_caption_lines_and_fedcac_names_its_code_over_text_choices(tmp_path):
    from bench.experiment.render import caption

    lines = caption(load_spec(ROOT / "conf" / "paper" / "fedcac" / "table2.yaml"), "paper")
    assert any(line.startswith("Code over text") and "bn_stats=critical" in line for line in lines)
    with pytest.raises(ValueError, match="notes"):
        load_spec(spec_file(tmp_path, SPEC + "notes: just one string\n"))


def test_a_spec_shows_the_methods_final_round_metrics_per_row_and_column(tmp_path):
    from bench.experiment.collect import collect
    from bench.experiment.render import render

    spec = load_spec(spec_file(tmp_path, PER_CLIENT_SPEC + "metrics: [personal_fraction]\n"))
    cells = expand(spec, "paper", seeds=[0, 1])
    dirs = {}
    for cell, share in zip(cells, (0.25, 0.75), strict=True):
        run = fake_run(tmp_path / f"run{cell.seed}", [90.0, 80.0], [100, 100], [[10] * 10, [10] * 10])
        summary = json.loads((run / "summary.json").read_text())
        (run / "summary.json").write_text(json.dumps({**summary, "final_metrics": {"personal_fraction": share}}))
        dirs[cell] = run
    frame, _ = collect(spec, "paper", dirs)
    assert frame.attrs["metrics"]["personal_fraction"] == [{"row": "Local", "column": "Avg", "mean": 0.5, "runs": 2}]
    md = render(spec, "paper", frame, [])
    assert "`personal_fraction` at the final round" in md and "| Local | 0.5 |" in md
    with pytest.raises(ValueError, match="metrics"):
        load_spec(spec_file(tmp_path, PER_CLIENT_SPEC + "metrics: personal_fraction\n"))
