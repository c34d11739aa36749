"""scripts/verify_reruns.py: stored runs executed again compare equal, and an altered record is caught."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from bench.experiment.run import execute
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


def test_a_difference_names_the_kernels_when_the_stored_run_used_other_ones(tmp_path):
    """A run stored by another machine (AVX2 vs AVX-512) differs for that reason alone: the report says so."""
    execute(config(tmp_path, "rounds=1", "logger.wandb.mode=disabled"))
    (run,) = verify_reruns.sample_runs([tmp_path / "runs"], per_method=1, seed=0)
    assert verify_reruns.kernels_hint(run) == ""  # same kernels as this machine
    timing = json.loads((run / "timing.json").read_text())
    (run / "timing.json").write_text(json.dumps({**timing, "cpu_capability": "OTHER"}))
    assert "stored with OTHER kernels" in verify_reruns.kernels_hint(run)
    (run / "timing.json").write_text(json.dumps({"wall_seconds": 1.0}))  # a run from before kernels were recorded
    hint = verify_reruns.kernels_hint(run)
    assert "unrecorded" in hint and "ONEDNN_MAX_CPU_ISA=AVX2" in hint


def test_a_config_written_before_a_key_was_added_reruns_with_its_neutral_value(tmp_path):
    """A stored config that lacks keys added since (``identity.ADDED``) gets today's default, the neutral value;
    the rerun then equals the stored run."""
    import yaml

    execute(config(tmp_path, "rounds=1", "method=pfedgate", "logger.wandb.mode=disabled"))
    (run,) = verify_reruns.sample_runs([tmp_path / "runs"], per_method=1, seed=0)
    stored = yaml.safe_load((run / "config.yaml").read_text())
    for key in ("gate_momentum", "relu_logits"):
        del stored["method"][key]
    del stored["train"]["keep_optimizer_state"]
    (run / "config.yaml").write_text(yaml.safe_dump(stored))
    filled = verify_reruns.with_added_keys(yaml.safe_load((run / "config.yaml").read_text()))
    assert filled["method"]["gate_momentum"] == 0.0 and filled["method"]["relu_logits"] is False
    assert filled["train"]["keep_optimizer_state"] is False
    assert verify_reruns.main([str(tmp_path / "runs"), "--out", str(tmp_path / "v.md")]) == 0
