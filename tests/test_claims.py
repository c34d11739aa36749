"""The claims ledger (bench/experiment/claims.py): the claims files, each precondition, each verdict, the files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bench.experiment import claims as ledger
from bench.experiment.spec import Cell
from common.verified_io import encode_record

CONF = ledger.thresholds()
def read_ledger(paper: str, scale: str, results: Path) -> list | None:
    from bench.experiment.spec import output_base

    path = output_base(paper, "claims", scale, results).with_suffix(".json")
    return json.loads(path.read_text()) if path.is_file() else None


MINIMUM = {"fedcac": 12, "pa3dfl": 8, "fedc2i": 8, "fedselect": 8}


@pytest.mark.parametrize("paper", ledger.PAPERS)
def test_every_paper_has_enough_valid_claims(paper: str) -> None:
    found = ledger.load_claims(paper)
    assert len(found) >= MINIMUM[paper]
    assert all(c.get("spec") is not None or c.get("untestable") for c in found)


def _write_claims(tmp_path: Path, claim: dict) -> Path:
    path = tmp_path / "fedcac" / "claims.yaml"
    path.parent.mkdir(exist_ok=True)
    base = {"id": "t1-x", "quote": "FedCAC outperforms", "section": "4.3", "spec": "table1",
            "kind": "outperforms", "row": "FedCAC", "others": ["FedAvg"], "columns": ["CIFAR-10"]}
    path.write_text(yaml.safe_dump({"paper": "fedcac", "claims": [{**base, **claim}]}))
    return path


@pytest.mark.parametrize(("change", "named"), [
    ({"id": "Bad Id"}, "id must be"),
    ({"kind": "beats"}, "'beats'"),
    ({"row": "FedCACX"}, "'FedCACX' is not a row"),
    ({"others": ["Nobody"]}, "'Nobody' is not a row"),
    ({"columns": ["CIFAR-11"]}, "'CIFAR-11' is not a column"),
    ({"spec": "table9"}, "spec='table9'"),
    ({"spec": None}, "untestable"),
    ({"kind": "trend", "along": "rows", "rows": ["FedCAC"], "shape": "increasing"}, "at least two rows"),
    ({"kind": "trend", "along": "rows", "rows": ["FedCAC", "FedAvg"], "shape": "up"}, "shape='up'"),
])
def test_a_bad_claim_is_named_with_its_fix(tmp_path: Path, change: dict, named: str) -> None:
    with pytest.raises(ledger.ClaimsError, match="t1-x|Bad Id") as error:
        ledger.load_claims("fedcac", _write_claims(tmp_path, change))
    assert named in str(error.value)


def test_repeated_ids_are_refused(tmp_path: Path) -> None:
    path = _write_claims(tmp_path, {})
    data = yaml.safe_load(path.read_text())
    data["claims"] *= 2
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ledger.ClaimsError, match="repeats"):
        ledger.load_claims("fedcac", path)


# ------------------------------------------------------------------------------------------------ verdicts

def test_judge_supported_contradicted_not_resolved() -> None:
    assert ledger.judge([2.0, 2.5, 3.0], 0.0, None, CONF)["verdict"] == "supported"
    assert ledger.judge([-2.0, -2.5, -3.0], 0.0, 1.0, CONF)["verdict"] == "contradicted"
    unresolved = ledger.judge([-1.0, 2.0, 0.5], 0.0, 1.0, CONF)
    assert unresolved["verdict"] == "not resolved" and "resolve differences beyond" in unresolved["reason"]
    assert ledger.judge([1.0], 0.0, 1.0, CONF)["verdict"] == "not resolved"  # one seed: no interval


def test_competitive_uses_the_margin() -> None:
    assert ledger.judge([-0.5, -0.4, -0.6], -1.0, None, CONF)["verdict"] == "supported"
    assert ledger.judge([-3.0, -3.2, -2.8], -1.0, None, CONF)["verdict"] == "contradicted"


@pytest.mark.parametrize(("paper", "size"), [(2.5, "inside"), (5.0, "comparable"), (0.1, "sign only"),
                                             (None, "no paper number")])
def test_agreement_needs_magnitude(paper: float | None, size: str) -> None:
    out = ledger.judge([2.0, 2.5, 3.0], 0.0, paper, CONF)
    assert out["verdict"] == "supported" and out["magnitude"] == size


def test_flat_trend_within_its_margin() -> None:
    assert ledger.judge([0.1, -0.1, 0.05], 0.0, None, CONF, flat=1.0)["verdict"] == "supported"
    assert ledger.judge([3.0, 3.2, 2.9], 0.0, None, CONF, flat=1.0)["verdict"] == "contradicted"


def test_fitted_change_of_a_line() -> None:
    assert ledger.fitted_change([1.0, 2.0, 3.0, 4.0]) == pytest.approx(3.0)
    assert ledger.fitted_change([5.0, 5.0, 5.0]) == pytest.approx(0.0)


def test_convergence() -> None:
    conv = CONF["convergence"]
    rising = [(r, 50.0 + r) for r in range(1, 21)]
    assert "gains" in ledger.convergence(rising, conv)
    flat = [(r, 80.0 + (0.3 if r % 2 else 0.0)) for r in range(1, 21)]
    assert ledger.convergence(flat, conv) is None
    peak = flat[:-1] + [(20, 80.5)]
    assert "peaks at its last round" in ledger.convergence(peak, conv)


def test_combine() -> None:
    sup, con, unr = ({"verdict": v, "failed": []} for v in ("supported", "contradicted", "not resolved"))
    cannot = {"verdict": "cannot test", "failed": ["headroom: x"], "reason": "headroom: x"}
    assert ledger.combine([sup, sup, cannot])[0] == "supported"
    assert ledger.combine([sup, con])[0] == "contradicted"
    assert ledger.combine([sup, unr])[0] == "not resolved"
    verdict, reason = ledger.combine([cannot, cannot])
    assert verdict == "cannot test" and "headroom" in reason


# ------------------------------------------------------------------------------------------------ preconditions

SPEC = {"paper": "toy", "table": "1", "protocol": {"stage": "post", "selection": "best", "weighting": "unweighted"},
        "rows": [{"name": "A"}, {"name": "B"}, {"name": "Local"}, {"name": "FedAvg"}],
        "columns": [{"name": "C", "dataset": "cifar10", "paper": {"dataset": "cifar10", "setting": "s"}}],
        "scales": {"mini": {"datasets": {"cifar10": "digits"}}, "medium": {"seeds": [0]}}}
METHOD = {"A": "fedcac", "B": "fedamp", "Local": "local", "FedAvg": "fedavg"}


def _run(path: Path, curve: list[float], method: str, diagnostics: list[dict] | None = None) -> Path:
    path.mkdir(parents=True)
    lines = [encode_record({"kind": "eval", "round": r + 1, "stage": "post", "split": "test", "mean_acc": v,
                            "acc": [v], "clients": [0]}) for r, v in enumerate(curve)]
    lines += [encode_record({"kind": "method", "round": r + 1, **d}) for r, d in enumerate(diagnostics or [])]
    (path / "rounds.jsonl").write_text("".join(lines))
    (path / "summary.json").write_text(json.dumps({"complete": True}))
    (path / "config.yaml").write_text(yaml.safe_dump({"num_clients": 20, "method": {
        "name": method, "alpha_k": 1.0, "sigma": 100.0}}))
    return path


def _evidence(tmp_path: Path, finals: dict[str, list[float]], scale: str = "medium", rising: str | None = None,
              diagnostics: dict[str, dict] | None = None, state: dict[str, str] | None = None) -> ledger.Evidence:
    dirs, values = {}, {}
    for row, accs in finals.items():
        for seed, acc in enumerate(accs):
            curve = [acc - 10 + r for r in range(10)] if row == rising else [acc - 5] + [acc] * 9
            diag = [diagnostics[row]] * 10 if diagnostics and row in diagnostics else None
            dirs[Cell(row, "C", seed, ())] = _run(tmp_path / f"{row}-{seed}", curve, METHOD[row], diag)
            values.setdefault((row, "C"), {})[seed] = acc
    frame = pd.DataFrame([{"method": r, "column": "C", "state": (state or {}).get(r, "")} for r in finals])
    return ledger.Evidence(SPEC, scale, values, frame, dirs, {r: METHOD[r] for r in finals})


def test_all_preconditions_hold(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91, 92], "B": [85, 86, 86], "Local": [70, 71, 70], "FedAvg": [80, 80, 81]},
                   diagnostics={"A": {"collaborators_mean": 3.0}, "B": {"xi_top_share": 0.2, "self_weight_mean": 0.3}})
    assert ledger.preconditions(ev, "C", ["A", "B"], ["B"], ["A"], CONF) == []


def test_stand_in_not_declared(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "Local": [70, 70]}, scale="mini")
    failed = ledger.preconditions(ev, "C", ["A"], [], [], CONF)
    assert any(f.startswith("stand-in: digits") for f in failed)


def test_headroom(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "Local": [89, 90]})
    assert any(f.startswith("headroom: Local") for f in ledger.preconditions(ev, "C", ["A"], [], [], CONF))


def test_unconverged_row(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "Local": [70, 70]}, rising="A")
    assert any(f.startswith("unconverged: A") for f in ledger.preconditions(ev, "C", ["A"], [], [], CONF))


def test_inert_mechanism_and_inert_baseline(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "B": [85, 85], "Local": [70, 70]},
                   diagnostics={"A": {"collaborators_mean": 0.0},
                                "B": {"xi_top_share": 1 / 19, "self_weight_mean": 0.81}})
    failed = ledger.preconditions(ev, "C", ["A", "B"], ["B"], ["A"], CONF)
    assert any(f.startswith("inert: A: collaborators per client 0.000") for f in failed)
    assert any(f.startswith("baseline suspect (inert): B") and "1.000 x uniform" in f for f in failed)


def test_baseline_below_fedavg_where_the_paper_has_it_above(tmp_path: Path, monkeypatch) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "B": [60, 61], "Local": [50, 50], "FedAvg": [80, 81]},
                   diagnostics={"B": {"xi_top_share": 0.2, "self_weight_mean": 0.3}})
    monkeypatch.setattr("bench.experiment.spec.paper_numbers",
                        lambda spec, scale: {("B", "C"): (70.0, None, ""), ("FedAvg", "C"): (60.0, None, "")})
    failed = ledger.preconditions(ev, "C", ["A", "B"], ["B"], [], CONF)
    assert any(f.startswith("baseline suspect: B is 20.00 below FedAvg") for f in failed)


def test_unequal_tuning_budget(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "B": [85, 85], "Local": [70, 70]},
                   diagnostics={"A": {"collaborators_mean": 3.0}, "B": {"xi_top_share": 0.2, "self_weight_mean": 0.3}})
    assert ledger.tuning_budget(ev, ["A", "B"]) is None  # no search: every row the same (none)
    # the search the records come from (<table>.tuning.json, read into each row's "searched" by with_tuned)
    ev.spec = {**SPEC, "rows": [{**r, "searched": 2} if r["name"] == "B" else r for r in SPEC["rows"]]}
    assert ledger.tuning_budget(ev, ["A", "B"]) == "tuning budget: A searched over 1 point, B searched over 2 points"
    failed = ledger.preconditions(ev, "C", ["A", "B"], ["B"], [], CONF)
    assert any(f.startswith("tuning budget: A searched over 1 point") for f in failed)


def test_baseline_that_did_not_train(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91], "Local": [50, 50]}, state={"Local": "did not train"})
    ev.values.pop(("Local", "C"))
    failed = ledger.preconditions(ev, "C", ["A", "Local"], ["Local"], [], CONF)
    assert "baseline suspect: Local did not train" in failed


def test_a_comparison_that_fails_a_precondition_is_cannot_test(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [90, 91, 92], "FedAvg": [80, 80, 81], "Local": [89, 90, 91]})
    claim = {"spec": "table1", "kind": "outperforms", "row": "A", "others": ["FedAvg"], "columns": ["C"]}
    (cell,) = ledger.comparisons(claim, ev, CONF)
    assert cell["verdict"] == "cannot test" and cell["reason"].startswith("headroom")
    assert cell["mean_diff"] == pytest.approx(10.667, abs=1e-3)  # the difference is still shown, unmarked


def test_trend_along_rows(tmp_path: Path) -> None:
    ev = _evidence(tmp_path, {"A": [80, 81, 80], "B": [85, 86, 86], "FedAvg": [90, 90, 91]})
    claim = {"spec": "t", "kind": "trend", "along": "rows", "rows": ["A", "B", "FedAvg"], "columns": ["C"],
             "shape": "increasing"}
    (cell,) = ledger.comparisons(claim, ev, CONF)
    assert cell["verdict"] == "supported" and cell["mean_diff"] == pytest.approx(10.0, abs=0.5)
    assert ledger.comparisons({**claim, "shape": "decreasing"}, ev, CONF)[0]["verdict"] == "contradicted"


def test_the_ledger_files(tmp_path: Path) -> None:
    entries = [{"id": "a", "quote": "q", "section": "1", "scale": "medium", "verdict": "supported",
                "reason": "r", "cells": [{"spec": "t", "row": "A", "other": "B", "column": "C",
                                          "verdict": "supported", "reason": "r", "mean_diff": math.nan}]},
               {"id": "b", "quote": "q", "section": "1", "scale": "medium", "verdict": "cannot test",
                "reason": "headroom", "cells": []}]
    path = ledger.write_ledger("fedcac", "medium", entries, tmp_path)
    assert path == tmp_path / "fedcac" / "medium" / "claims.json"
    back = read_ledger("fedcac", "medium", tmp_path)
    assert [e["verdict"] for e in back] == ["supported", "cannot test"] and back[0]["cells"][0]["mean_diff"] is None
    text = path.with_suffix(".md").read_text()
    assert "fedcac: 1 supported, 0 contradicted, 0 not resolved, 1 cannot test at medium" in text


@pytest.mark.parametrize("paper", ledger.PAPERS)
def test_committed_ledgers_are_well_formed(paper: str) -> None:
    from bench.experiment.spec import SCALES

    for scale in SCALES:
        found = read_ledger(paper, scale, Path(__file__).resolve().parents[1] / "results")
        if found is None:
            continue
        assert {e["id"] for e in found} == {c["id"] for c in ledger.load_claims(paper)}
        for entry in found:
            assert entry["verdict"] in ledger.VERDICTS and entry["scale"] == scale
            assert set(entry) >= {"id", "quote", "section", "scale", "verdict", "reason", "cells"}
            if entry["verdict"] == "cannot test":
                assert entry["reason"]  # names the failed precondition
