"""Code identity: every summary names the code that computed it; tables mark cells computed by other code and
``--rerun-stale`` reruns exactly those, keeping the old runs aside."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from bench.experiment import provenance
from bench.experiment.cells import run_cells
from bench.experiment.collect import collect
from bench.experiment.provenance import CODE_PATHS, ROOT, code_identity, method_sources
from bench.experiment.render import render
from bench.experiment.run import execute
from bench.experiment.spec import expand, load_spec
from tests.helpers import config
from tests.test_table import spec_file


def test_every_summary_records_the_commit_the_dirty_flag_and_the_code_hash(tmp_path):
    summary = execute(config(tmp_path))
    code = summary["code"]
    code_identity.cache_clear()  # computed again from the files and git, not the object the run was given
    assert code == code_identity((), summary["method"])
    assert re.fullmatch(r"[0-9a-f]{64}", code["hash"])
    assert code["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", code["commit"])
    assert code["dirty"] in (None, True, False)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A git checkout of this tree's code (its CODE_PATHS' Python files and a README), committed, as the root."""
    for rel in CODE_PATHS:
        source = ROOT / rel
        for path in ([source] if source.is_file() else sorted(source.rglob("*.py"))):
            if "__pycache__" not in path.parts:
                target = tmp_path / path.relative_to(ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    (tmp_path / "README.md").write_text("notes\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "code"], check=True)
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    code_identity.cache_clear()
    yield tmp_path
    code_identity.cache_clear()


def identity() -> dict:
    code_identity.cache_clear()
    return code_identity()


def test_a_clean_checkout_names_its_commit_and_an_edit_to_the_code_makes_it_dirty_and_moves_the_hash(tree):
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    clean = identity()
    assert clean["commit"] == head and clean["dirty"] is False
    fedavg = tree / "methods" / "fedavg.py"
    original = fedavg.read_text()
    fedavg.write_text(original + "# an edit\n")
    edited = identity()
    assert edited["commit"] == head and edited["dirty"] is True and edited["hash"] != clean["hash"]
    fedavg.write_text(original)  # the same bytes again: the same hash, clean again
    assert identity() == clean
    (tree / "bench" / "core" / "new_module.py").write_text("X = 1\n")  # an untracked source file counts too
    added = identity()
    assert added["dirty"] is True and added["hash"] not in (clean["hash"], edited["hash"])
    (tree / "bench" / "core" / "new_module.py").unlink()
    (tree / "README.md").write_text("other notes\n")  # outside the code that computes results: no change
    assert identity() == clean


def test_outside_a_git_checkout_the_hash_alone_identifies_the_code(tree):
    clean = identity()
    shutil.rmtree(tree / ".git")
    assert identity() == {"commit": None, "dirty": None, "hash": clean["hash"]}


def test_a_config_import_is_part_of_the_code_identity():
    assert code_identity(("tests.failing_method",))["hash"] != code_identity()["hash"]


def test_a_runs_code_identity_covers_its_method_and_the_methods_modules_it_imports_only():
    names = lambda method: {p.name for p in method_sources(method)}  # noqa: E731
    assert names("fedavg") == {"fedavg.py"}
    assert names("fedselect_cvpr") == {"fedselect_cvpr.py", "fedselect.py", "_masked.py"}  # transitively
    assert "_partial.py" in names("fedrep") and "fedselect.py" not in names("fedrep")
    # so editing FedSelect leaves FedAvg's runs current, but not FedSelect-CVPR's
    assert code_identity((), "fedavg")["hash"] != code_identity((), "fedselect_cvpr")["hash"]
    assert code_identity((), "fedavg")["hash"] != code_identity()["hash"]


def test_tables_mark_cells_from_other_code_and_rerun_stale_reruns_exactly_those(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    cells = expand(spec, "mini", out_dir=str(tmp_path / "runs"))
    dirs = run_cells(cells, spec=spec, scale="mini")
    fedavg = next(c for c in cells if c.row == "FedAvg")
    path = dirs[fedavg] / "summary.json"
    summary = json.loads(path.read_text())
    original = summary["results"]
    path.write_text(json.dumps({**summary, "code": {**summary["code"], "hash": "0" * 64}}))  # "older code"

    frame, _ = collect(spec, "mini", dirs)
    assert frame.attrs["stale_cells"] == [["FedAvg", "A"]]
    text = render(spec, "mini", frame, [])
    assert "‡" in next(line for line in text.splitlines() if line.startswith("| FedAvg |"))
    assert "‡" not in next(line for line in text.splitlines() if line.startswith("| Separate |"))

    run_cells(cells, spec=spec, scale="mini")  # reused by default
    assert json.loads(path.read_text())["code"]["hash"] == "0" * 64

    run_cells(cells, spec=spec, scale="mini", rerun_stale=True)
    rerun = json.loads(path.read_text())
    assert rerun["code"] == code_identity((), "fedavg") and rerun["results"] == original
    kept = list((tmp_path / "runs" / ".stale").rglob("summary.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["code"]["hash"] == "0" * 64
    frame, _ = collect(spec, "mini", dirs)
    assert frame.attrs["stale_cells"] == []


def test_timing_names_the_cpu_kernels_a_run_used_and_any_isa_cap(tmp_path, monkeypatch):
    """Records depend on the instruction set the CPU kernels dispatch to (AVX2 vs AVX-512 sum in different
    orders): every run's timing.json says which it was, and the caps a user set to reproduce another machine."""
    import torch

    from bench.experiment.provenance import ISA_CAPS
    from bench.experiment.run import run_dir_for, to_container

    for name in ISA_CAPS:
        monkeypatch.delenv(name, raising=False)
    cfg = config(tmp_path / "plain", "rounds=1")
    execute(cfg)
    timing = json.loads((run_dir_for(to_container(cfg)) / "timing.json").read_text())
    assert timing["torch"] == torch.__version__
    assert timing["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and timing["cpu_capability"]
    assert timing["cpu"] and "isa_caps" not in timing
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    cfg = config(tmp_path / "capped", "rounds=1")
    execute(cfg)
    timing = json.loads((run_dir_for(to_container(cfg)) / "timing.json").read_text())
    assert timing["isa_caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def test_collect_reads_a_runs_imports_as_its_config_wrote_them(tmp_path):
    """``run_imports`` reads the ``imports`` a run's config.yaml lists (written by OmegaConf, as runs write it), so
    a run of a plug-in method is checked against the plug-in's source too; no list, or no key, is none."""
    from omegaconf import OmegaConf

    from bench.experiment.collect import run_config, run_imports

    for i, (cfg, expected) in enumerate([({"imports": ["tests.failing_method", "tests.toy_methods"], "seed": 1},
                                          ("tests.failing_method", "tests.toy_methods")),
                                         ({"imports": [], "lr": 1e-3}, ()), ({"seed": 0}, ()), ({}, ())]):
        run = tmp_path / str(i)
        run.mkdir()
        (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
        assert run_imports(run_config(run)) == expected
