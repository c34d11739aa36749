"""A table's manifest (``bench.experiment.manifest``): written by a table run, read by collect and the plots instead of
composing each cell's config, and ignored for a cell whose overrides changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.experiment import manifest
from bench.experiment.manifest import cell_dirs, manifest_path, write_manifest
from bench.experiment.spec import Cell

SPEC = {"paper": "fedcac", "table": "1", "rows": [{"name": "FedAvg"}, {"name": "Local"}], "columns": [{"name": "A"}]}


def cell(row: str, seed: int, out_dir: Path, *extra: str) -> Cell:
    return Cell(row, "A", seed, (f"method={row.lower()}", f"out_dir={out_dir}", *extra, f"seed={seed}"))


def finished(path: Path, config_hash: str, code_hash: str) -> Path:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"complete": True, "config_hash": config_hash,
                                                   "code": {"hash": code_hash}}))
    return path


@pytest.fixture
def composed(monkeypatch):
    """Cells composed instead of read from the manifest (the composition itself is replaced by a stand-in)."""
    seen: list[Cell] = []

    def compose(c: Cell) -> Path:
        seen.append(c)
        return Path("composed") / c.row / str(c.seed)

    monkeypatch.setattr(manifest, "composed_dir", compose)
    return seen


def test_listed_cells_are_read_and_others_composed(tmp_path, composed):
    runs = tmp_path / "runs"
    a = cell("FedAvg", 0, runs)
    run = finished(runs / "fedcac/table1/mini/fedavg/x-s0-0123456789", "ab" * 32, "cd" * 32)
    path = write_manifest(SPEC, "mini", {a: run}, tmp_path / "results")
    assert path == manifest_path(SPEC, "mini", tmp_path / "results") == tmp_path / "results/fedcac/table1.manifest.json"
    written = json.loads(path.read_text())
    assert written["identity_version"] == 1 and written["scale"] == "mini"
    assert written["cells"] == [{"row": "FedAvg", "column": "A", "seed": 0, "overrides": manifest.overrides_digest(a),
                                 "run_dir": "fedcac/table1/mini/fedavg/x-s0-0123456789",
                                 "config_hash": "ab" * 32, "code_hash": "cd" * 32}]
    b = cell("Local", 0, runs)
    changed = cell("FedAvg", 0, runs, "train.lr=0.1")  # the spec gave this cell another override since
    dirs = cell_dirs(SPEC, "mini", [a, b, changed], tmp_path / "results")
    assert dirs[a] == run and composed == [b, changed]
    elsewhere = cell("FedAvg", 0, tmp_path / "moved")  # the same runs under another out_dir
    assert cell_dirs(SPEC, "mini", [elsewhere], tmp_path / "results")[elsewhere] == (
        tmp_path / "moved/fedcac/table1/mini/fedavg/x-s0-0123456789")


def test_a_later_run_updates_its_cells_and_keeps_the_others(tmp_path, composed):
    runs = tmp_path / "runs"
    s0, s1 = cell("FedAvg", 0, runs), cell("FedAvg", 1, runs)
    write_manifest(SPEC, "mini", {s0: runs / "r0", s1: runs / "r1"}, tmp_path)
    write_manifest(SPEC, "mini", {s1: runs / "r1b"}, tmp_path)  # e.g. --seeds 1 after a change of that cell
    assert cell_dirs(SPEC, "mini", [s0, s1], tmp_path) == {s0: runs / "r0", s1: runs / "r1b"} and not composed
    unfinished = json.loads(manifest_path(SPEC, "mini", tmp_path).read_text())["cells"]
    assert [(e["seed"], e["config_hash"]) for e in unfinished] == [(0, None), (1, None)]


def test_a_manifest_of_another_identity_version_is_not_read(tmp_path, composed, monkeypatch):
    s0 = cell("FedAvg", 0, tmp_path)
    write_manifest(SPEC, "mini", {s0: tmp_path / "r0"}, tmp_path)
    monkeypatch.setattr(manifest, "IDENTITY_VERSION", 2)
    assert cell_dirs(SPEC, "mini", [s0], tmp_path)[s0] == Path("composed/FedAvg/0") and composed == [s0]


def test_a_table_run_writes_the_manifest_that_collect_reads(tmp_path, monkeypatch):
    from bench.experiment.collect import main as collect_main
    from bench.experiment.table import main as table_main
    from tests.test_table import spec_file

    spec_path = spec_file(tmp_path)
    options = ["--scale", "mini", "--out-dir", str(tmp_path / "runs"), "--results", str(tmp_path / "results")]
    assert table_main([str(spec_path), *options, "--launcher", "inline", "--quiet"]) == 0
    written = json.loads((tmp_path / "results/fedcac/table1.manifest.json").read_text())
    assert [(e["row"], e["seed"]) for e in written["cells"]] == [("FedAvg", 0), ("Separate", 0)]
    for entry in written["cells"]:
        summary = json.loads((tmp_path / "runs" / entry["run_dir"] / "summary.json").read_text())
        assert (entry["config_hash"], entry["code_hash"]) == (summary["config_hash"], summary["code"]["hash"])
    table = (tmp_path / "results/fedcac/table1.md").read_bytes()

    def refuse(c: Cell) -> Path:
        raise AssertionError(f"{c} was composed although the manifest lists it")

    monkeypatch.setattr(manifest, "composed_dir", refuse)
    collect_main([str(spec_path), *options])
    assert (tmp_path / "results/fedcac/table1.md").read_bytes() == table


def test_reading_a_manifest_needs_neither_torch_nor_the_methods():
    import subprocess
    import sys

    code = ("import sys, bench.experiment.manifest; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'methods')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent, check=True)
