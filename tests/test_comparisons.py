"""What every table states beyond mean ± std: per-client columns, sample sizes, the paired difference of the
spec's ``compare`` row against the best other row, and Kendall's tau against the paper's ordering."""

from __future__ import annotations

import json
import math

import pytest

from bench.experiment.cells import run_cells
from bench.experiment.collect import collect, eval_at, kendall_tau, paired_differences
from bench.experiment.render import render, write_table
from bench.experiment.spec import expand, load_spec, output_columns, paper_numbers, unmeasured_columns
from tests.test_table import SPEC, spec_file

PER_CLIENT = SPEC.replace(
    "paper: {dataset: cifar10, setting: pathological-2}}",
    "paper: {dataset: cifar10, setting: pathological-2},\n     per_client: [{name: first}, {name: second}]}",
).replace("seeds: [0, 1]\n", "seeds: [0, 1]\ncompare: FedAvg\n", 1)


def test_kendall_tau_by_hand():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)  # one discordant pair of six
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))


def test_paired_difference_is_over_the_seeds_both_rows_have():
    values = {("A", "c"): {0: 80.0, 1: 82.0, 2: 90.0}, ("B", "c"): {0: 79.0, 1: 85.0}, ("C", "c"): {0: 70.0}}
    best, other = paired_differences("A", values, ["c"], ["A", "B", "C"])
    assert best["other"] == best["best_other"] == "B" and best["seeds"] == 2  # seed 2 has no B run: not paired
    assert best["mean_diff"] == pytest.approx(-1.0) and best["std_diff"] == pytest.approx(math.sqrt(8))
    assert best["higher_in"] == 1
    half = 12.7062047361747 * math.sqrt(8) / math.sqrt(2)  # t(0.975, 1 dof) * sd / sqrt(n)
    assert (best["ci_low"], best["ci_high"]) == (pytest.approx(-1.0 - half), pytest.approx(-1.0 + half))
    assert other["other"] == "C" and other["best_other"] is None and other["seeds"] == 1
    assert math.isnan(other["ci_low"]) and not other["contradicts"]
    assert paired_differences(None, values, ["c"], ["A", "B"]) == []
    with pytest.raises(ValueError, match="compare='Z'"):
        paired_differences("Z", values, ["c"], ["A", "B"])


def test_paired_difference_has_the_papers_sign_or_contradicts_it_beyond_noise():
    values = {("A", "c"): {0: 80.0, 1: 81.0, 2: 82.0}, ("B", "c"): {0: 85.0, 1: 86.5, 2: 86.5},
              ("C", "c"): {0: 79.0, 1: 81.5, 2: 81.0}}
    paper = {("A", "c"): (90.0, None, ""), ("B", "c"): (88.0, None, ""), ("C", "c"): (91.0, None, "")}
    by_other = {p["other"]: p for p in paired_differences("A", values, ["c"], ["A", "B", "C"], paper)}
    b, c = by_other["B"], by_other["C"]
    assert b["paper_diff"] == 2.0 and b["mean_diff"] == pytest.approx(-5.0)
    assert b["agrees"] is False and b["contradicts"] is True  # A below B in every seed, the paper has A above
    assert c["paper_diff"] == -1.0 and c["mean_diff"] == pytest.approx(0.5)
    assert c["agrees"] is False and c["contradicts"] is False  # opposite sign, but within noise


def test_spec_checks_compare_and_per_client_names(tmp_path):
    with pytest.raises(ValueError, match="compare='Nobody' is not a row"):
        load_spec(spec_file(tmp_path, PER_CLIENT.replace("compare: FedAvg", "compare: Nobody")))
    with pytest.raises(ValueError, match="needs a name"):
        load_spec(spec_file(tmp_path, PER_CLIENT.replace("{name: second}", "{setting: x}")))
    with pytest.raises(ValueError, match="column names repeat"):
        load_spec(spec_file(tmp_path, PER_CLIENT.replace("{name: second}", "{name: A}")))
    spec = load_spec(spec_file(tmp_path, PER_CLIENT))
    assert [(c.name, c.client) for c in output_columns(spec)] == [("first", 0), ("second", 1), ("A", None)]


def test_per_client_columns_sample_sizes_and_comparisons_in_the_written_table(tmp_path):
    spec = load_spec(spec_file(tmp_path, PER_CLIENT))
    dirs = run_cells(expand(spec, "paper", out_dir=str(tmp_path / "runs")))
    frame, problems = collect(spec, "paper", dirs)
    assert not problems[1:]  # only the unavailable row
    for name, client in (("first", 0), ("second", 1)):  # each client's accuracy in the protocol's record
        accs = [eval_at(p, "post", json.loads((p / "summary.json").read_text())["primary"]["round"])["acc"][client]
                for c, p in dirs.items() if c.row == "FedAvg"]
        got = frame[(frame["method"] == "FedAvg") & (frame["column"] == name)].iloc[0]
        assert got["seeds"] == 2 and got["mean"] == pytest.approx(sum(accs) / 2)
    assert frame.attrs["seeds"] == [2] and frame.attrs["test_images"][0] > 0
    assert {p["column"] for p in frame.attrs["paired"]} == {"first", "second", "A"}
    assert all(p["other"] == p["best_other"] == "Separate" and p["seeds"] == 2 for p in frame.attrs["paired"])
    text = render(spec, "paper", frame, problems)
    assert "| method | first (ours) | second (ours) | A (ours) | A (paper) |" in text
    assert "Each cell: 2 seeds;" in text and "test images per client" in text
    assert "- A: FedAvg − Separate = " in text and "| FedAvg minus | first | second | A |" in text
    md = write_table(spec, "paper", frame, problems, tmp_path / "results")
    stats = json.loads(md.with_suffix(".stats.json").read_text())
    assert stats["seeds"] == [2] and len(stats["paired"]) == 3


TWO_DATASETS = PER_CLIENT.replace(
    "rows:\n",
    "  - {name: B, dataset: synthetic, model: small_cnn, overrides: [partition=pathological],\n"
    "     paper: {dataset: cifar100, setting: pathological-2}}\nrows:\n", 1,
).replace("columns:\n  - {name: A, dataset: synthetic,", "columns:\n  - {name: A, dataset: cifar10,", 1).replace(
    "  - {name: B, dataset: synthetic,", "  - {name: B, dataset: cifar100,", 1,
).replace("    base: [rounds=1]\n", "    base: [rounds=1]\n    datasets: {cifar10: synthetic, cifar100: synthetic}\n"
          "    measures_paper: [cifar10]\n", 1)


def test_only_columns_whose_stand_in_measures_the_paper_are_compared_with_it(tmp_path):
    """scales.<scale>.measures_paper: a column whose stand-in is not declared (B) shows our numbers only: no paper
    number, sign mark or tau; the caption says which are compared."""
    spec = load_spec(spec_file(tmp_path, TWO_DATASETS))
    assert unmeasured_columns(spec, "mini") == ["B"]
    assert unmeasured_columns(spec, "paper") == []  # the paper's own data measures its question
    assert {column for _, column in paper_numbers(spec, "mini")} == {"A"}
    assert {column for _, column in paper_numbers(spec, "paper")} == {"A", "B"}
    dirs = run_cells(expand(spec, "mini", out_dir=str(tmp_path / "runs")))
    frame, problems = collect(spec, "mini", dirs)
    paired = {p["column"]: p for p in frame.attrs["paired"]}
    assert paired["A"]["paper_diff"] == pytest.approx(54.33 - 85.85)
    assert "stand-in" not in paired["A"]["untestable"]  # declared; one round is too few to test (unconverged)
    assert "unconverged" in paired["A"]["untestable"] and paired["A"]["agrees"] is None
    assert math.isnan(paired["B"]["paper_diff"]) and paired["B"]["agrees"] is None
    assert paired["B"]["untestable"].startswith("stand-in: synthetic for the paper's cifar100")
    assert frame[frame["column"] == "B"]["paper_mean"].isna().all()
    text = render(spec, "mini", frame, problems)
    assert "A (paper)" in text and "B (paper)" not in text
    assert ("Compared with the paper (its numbers, Kendall's τ, ✓/✗) only where the stand-in is declared to measure "
            "the paper's question (the spec's scales.mini.measures_paper): cifar10 (stand-in synthetic). Our numbers "
            "only, not compared: B.") in text
    undeclared = load_spec(spec_file(tmp_path, TWO_DATASETS.replace("    measures_paper: [cifar10]\n", "")))
    assert unmeasured_columns(undeclared, "mini") == [] and "Compared with the paper" not in render(
        undeclared, "mini", collect(undeclared, "mini", dirs)[0], problems)
    with pytest.raises(ValueError, match=r"measures_paper is \['svhn'\]"):
        load_spec(spec_file(tmp_path, TWO_DATASETS.replace("measures_paper: [cifar10]", "measures_paper: [svhn]")))
