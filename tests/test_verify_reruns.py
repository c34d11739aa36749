"""scripts/verify_reruns.py: stored runs executed again compare equal, and an altered record is caught."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from bench.run import execute
from tests.helpers import config

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("verify_reruns", ROOT / "scripts" / "verify_reruns.py")
verify_reruns = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(verify_reruns)  # type: ignore[union-attr]


def test_a_rerun_matches_its_stored_run_and_an_altered_record_does_not(tmp_path):
    execute(config(tmp_path, "rounds=2", "logger.wandb.mode=disabled"))
    execute(config(tmp_path, "rounds=2", "method=local", "logger.wandb.mode=disabled"))
    runs = verify_reruns.sample_runs([tmp_path / "runs"], per_method=1, seed=0)
    assert len(runs) == 2  # one per method
    out = tmp_path / "verified.md"
    assert verify_reruns.main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert out.read_text().count("| identical |") == 2
    records = runs[0] / "rounds.jsonl"
    lines = records.read_text().splitlines()
    first = json.loads(lines[0])
    first["mean_loss"] += 1e-9  # the smallest change still counts
    records.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert verify_reruns.main([str(tmp_path / "runs"), "--out", str(out)]) == 1
    assert "DIFFERENT" in out.read_text()
