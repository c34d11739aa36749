"""The code hash of a run by the modules it executes (code identity version 2), and runs hashed by the older rule
(version 1, no ``version`` recorded) judged by that rule."""

from __future__ import annotations

from bench.experiment import provenance
from bench.experiment.provenance import ROOT, code_identity, is_stale, run_sources
from tests.test_provenance import tree  # noqa: F401  (the fixture: a committed copy of the code as the root)


def names(method: str) -> set[str]:
    return {str(p.relative_to(provenance.ROOT)) for p in run_sources(method)}


def test_a_runs_sources_are_the_modules_it_imports_and_its_own_method_only():
    fedavg = names("fedavg")
    assert {"bench/experiment/run.py", "bench/core/engine.py", "bench/core/aggregate.py", "datasets/partition.py",
            "methods/fedavg.py", "bench/core/__init__.py"} <= fedavg
    # not the registry (every method), another method, the dry run's label counts or the experiment layer
    assert not {"methods/__init__.py", "methods/fedcac.py", "datasets/label_counts.py",
                "bench/experiment/validation.py",
                "bench/experiment/identity.py", "bench/experiment/provenance.py"} & fedavg
    assert {"methods/fedselect.py", "methods/_masked.py"} <= names("fedselect_cvpr")  # through its imports
    assert all((ROOT / name).is_file() for name in fedavg)


def test_a_summary_is_judged_by_the_code_identity_version_it_records():
    v1, v2 = code_identity((), "fedavg", 1), code_identity((), "fedavg")
    assert "version" not in v1 and v2["version"] == 2 and v1["hash"] != v2["hash"]
    assert not is_stale({"method": "fedavg", "code": v1})  # a run from before the version: still current
    assert not is_stale({"method": "fedavg", "code": v2})
    assert is_stale({"method": "fedavg", "code": {**v2, "version": 1}})
    assert is_stale({"method": "fedavg", "code": {"hash": v1["hash"], "version": 2}})


def test_an_edit_outside_a_runs_modules_leaves_it_current_by_version_2_only(tree):  # noqa: F811
    before = {version: code_identity((), "fedavg", version)["hash"] for version in (1, 2)}
    counts = tree / "datasets" / "label_counts.py"
    counts.write_text(counts.read_text() + "# an edit\n")
    code_identity.cache_clear()
    assert code_identity((), "fedavg", 2)["hash"] == before[2]
    assert code_identity((), "fedavg", 1)["hash"] != before[1]
    engine = tree / "bench" / "core" / "engine.py"
    engine.write_text(engine.read_text() + "# an edit\n")
    code_identity.cache_clear()
    assert code_identity((), "fedavg", 2)["hash"] != before[2]
