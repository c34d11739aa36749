"""A run's identity (``bench.experiment.identity``): every config key classified, every committed run keeping its hash
and directory, and a new key unable to move an existing run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.experiment import identity
from bench.experiment.identity import UnclassifiedKey, config_hash, run_dir_for, semantic_config, unlisted_group_keys

ROOT = Path(__file__).resolve().parent.parent


def committed_runs() -> list[tuple[Path, dict[str, Any], str]]:
    """(directory, config, recorded config hash) of every run committed under runs/."""
    listed = subprocess.run(["git", "ls-files", "runs"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    dirs = sorted({(ROOT / name).parent for name in listed.splitlines() if name.endswith("/summary.json")})
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [(run, yaml.load((run / "config.yaml").read_text(), Loader=loader),
             json.loads((run / "summary.json").read_text())["config_hash"]) for run in dirs]


@pytest.fixture(scope="module")
def runs() -> list[tuple[Path, dict[str, Any], str]]:
    found = committed_runs()
    assert len(found) >= 78, "the committed runs under runs/ are missing"
    return found


def test_every_committed_run_keeps_its_config_hash_and_directory(runs):
    moved = [run for run, cfg, recorded in runs
             if config_hash(cfg) != recorded or run_dir_for({**cfg, "out_dir": "runs"}).name != run.name]
    assert moved == []


def test_every_key_of_the_base_config_is_classified():
    base = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    base.pop("defaults")
    semantic_config(base)  # raises UnclassifiedKey naming the first key in no list


def test_every_config_group_file_lists_its_keys():
    assert unlisted_group_keys(ROOT / "conf") == []


def test_a_new_hyperparameter_or_method_is_refused_until_classified(tmp_path, monkeypatch):
    (tmp_path / "method").mkdir()
    fedavg = tmp_path / "method" / "fedavg.yaml"
    fedavg.write_text((ROOT / "conf" / "method" / "fedavg.yaml").read_text() + "new_knob: 3\n")
    (tmp_path / "method" / "brand_new.yaml").write_text("name: brand_new\nrate: 0.1\n")
    assert unlisted_group_keys(tmp_path) == [f"{tmp_path / 'method' / 'brand_new.yaml'}: {key}"
                                             for key in ("name", "rate")] + [f"{fedavg}: new_knob"]
    monkeypatch.setitem(identity.ADDED, "method.new_knob", lambda value: value == 3)
    monkeypatch.setitem(identity.GROUP_KEYS, "method/brand_new", "name rate")
    assert unlisted_group_keys(tmp_path) == []


@pytest.mark.parametrize("where", ["", "train.", "eval."])
def test_a_new_key_with_a_default_moves_no_committed_run(runs, monkeypatch, where):
    """A key added to the config is refused until classified; declared with the value at which it changes nothing,
    every committed run keeps its hash; only a run with another value gets a hash of its own."""
    section = where.rstrip(".")

    def with_key(cfg: dict[str, Any], value: Any) -> dict[str, Any]:
        out = json.loads(json.dumps(cfg))
        (out[section] if section else out)["brand_new_key"] = value
        return out

    _, cfg, recorded = runs[0]
    with pytest.raises(UnclassifiedKey, match=f"'{where}brand_new_key' is not classified"):
        config_hash(with_key(cfg, 0.5))
    monkeypatch.setitem(identity.ADDED, f"{where}brand_new_key", lambda value: value == 0.5)
    assert all(config_hash(with_key(c, 0.5)) == h for _, c, h in runs)
    assert config_hash(with_key(cfg, 0.7)) != recorded


def with_value(cfg: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``cfg`` with the dotted ``key`` set to ``value``."""
    out = json.loads(json.dumps(cfg))
    *path, leaf = key.split(".")
    node = out
    for part in path:
        node = node[part]
    node[leaf] = value
    return out


def test_added_keys_leave_the_hash_at_their_neutral_value_only(runs):
    _, cfg, recorded = runs[0]
    for key, neutral, other in (("compile", False, True), ("train.norm_mode", "train", "eval"),
                                ("train.batched_clients", False, True), ("eval.early_stop", None, 5)):
        assert config_hash(with_value(cfg, key, neutral)) == recorded, key
        assert config_hash(with_value(cfg, key, other)) != recorded, key
    hetero = with_value(cfg, "capacity.setting", "hetero")  # the block counts once a client is not at full width
    assert config_hash(hetero) != recorded
    assert config_hash(with_value(hetero, "capacity.width_rule", "method")) == config_hash(hetero)
    assert config_hash(with_value(hetero, "capacity.width_rule", "multiple")) != config_hash(hetero)


def test_non_semantic_keys_and_open_sections(runs):
    _, cfg, recorded = runs[0]
    moved = json.loads(json.dumps(cfg))
    moved.update(out_dir="elsewhere", device="cuda", threads=4, quiet=True, cache_dir=None)
    moved["eval"]["chance_z"] = None
    moved["dataset"]["root"] = "/data"
    assert config_hash(moved) == recorded
    moved["method"]["some_hyperparameter"] = 1  # a method's declared hyperparameters enter whole
    assert config_hash(moved) != recorded
    with pytest.raises(ValueError, match="identity version 2 is unknown"):
        config_hash(cfg, version=2)


def test_identity_needs_neither_torch_nor_the_methods():
    code = ("import sys, bench.experiment.identity; bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'methods', 'hydra', 'omegaconf')); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_run_config_with_an_unclassified_key_is_a_configuration_error(monkeypatch, tmp_path):
    from bench.experiment.compose import to_container
    from bench.experiment.errors import ConfigError, config_phase
    from bench.experiment.run import validate
    from tests.helpers import config

    cfg = to_container(config(tmp_path, "rounds=1"))
    monkeypatch.setattr(identity, "SEMANTIC", identity.SEMANTIC - {"participation"})
    with pytest.raises(ConfigError, match="'participation' is not classified"), config_phase():
        validate(cfg)
