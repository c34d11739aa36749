"""Client capacities and widths (Pa3dFL's Ideal / Hetero settings): drawing, quantisation, the weakest width for
capacity-unaware methods, one width rule shared by every method or each method's own, records, and validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.builder import build_experiment
from bench.core.capacity import client_capacities, weakest_width, widths_for
from bench.experiment.compose import to_container
from bench.experiment.run import config_hash, execute, run_dir_for
from bench.experiment.spec import expand, load_spec
from tests.helpers import config

ROOT = Path(__file__).resolve().parent.parent
HETERO = {"setting": "hetero", "low": 0.01, "high": 1.0}


def test_ideal_hetero_and_grid_capacities():
    assert client_capacities({"setting": "ideal", "low": 0.01, "high": 1.0}, 5, 0).tolist() == [1.0] * 5
    a, b = client_capacities(HETERO, 100, 3), client_capacities(HETERO, 100, 3)
    assert torch.equal(a, b) and not torch.equal(a, client_capacities(HETERO, 100, 4))  # the data seed decides
    assert float(a.min()) >= 0.01 and float(a.max()) <= 1.0 and a.std() > 0.2
    grid = client_capacities({"setting": "grid", "low": 0.25, "high": 1.0}, 4, 0)
    assert grid.tolist() == [0.25, 0.5, 0.75, 1.0]


def test_widths_fit_capacities_in_multiples_of_the_weakest_width_or_in_halving_levels():
    r = torch.tensor([1.0, 0.3, 0.05, 0.004], dtype=torch.float64)
    assert weakest_width(r) == 0.0625  # 1/16: (1/16)^2 = 0.0039 <= 0.004 < (1/8)^2
    widths = widths_for(r, "multiple")
    assert all(p * p <= float(c) for p, c in zip(widths, r, strict=True))
    assert widths == [1.0, 0.5, 0.1875, 0.0625]  # largest multiples of 1/16 with p^2 <= r
    assert widths_for(r, "multiple", step=0.25) == [1.0, 0.5, 0.25, 0.25]  # the step's floor: one step
    assert widths_for(r, "levels") == [1.0, 0.5, 0.125, 0.0625]  # 0.5^k


def test_a_capacity_unaware_method_runs_the_weakest_clients_width_and_records_every_client(tmp_path):
    overrides = ("capacity.setting=grid", "capacity.low=0.25", "capacity.high=1.0")
    experiment = build_experiment(to_container(config(tmp_path, *overrides)))
    full = build_experiment(to_container(config(tmp_path)))
    assert experiment.fed.worker.size < full.fed.worker.size  # the model is built at width 1/2 for everyone
    summary = execute(config(tmp_path, *overrides))
    assert summary["capacity"] == {"setting": "grid", "capacity": [0.25, 0.5, 0.75, 1.0], "width": [0.5] * 4,
                                   "cost": [0.25] * 4,
                                   "rule": "the weakest client's width on every client (capacity-unaware)"}
    csv = (run_dir_for(to_container(config(tmp_path, *overrides))) / "partition" / "capacities.csv").read_text()
    assert csv.splitlines() == ["client,capacity,width", "0,0.25,0.5", "1,0.5,0.5", "2,0.75,0.5", "3,1.0,0.5"]


def test_the_ideal_setting_leaves_a_runs_identity_as_before_capacities_existed(tmp_path):
    cfg = to_container(config(tmp_path))
    without = {k: v for k, v in cfg.items() if k != "capacity"}
    assert config_hash(cfg) == config_hash(without)
    assert config_hash(to_container(config(tmp_path, "capacity.setting=hetero"))) != config_hash(cfg)


@pytest.mark.parametrize(("override", "message"), [("capacity.setting=weird", "capacity.setting='weird'"),
                                                   ("capacity.low=0", "capacity.low=0"),
                                                   ("capacity.low=0.0001", "raise capacity.low"),
                                                   ("capacity.width_rule=weird", "capacity.width_rule='weird'"),
                                                   ("capacity.width_step=2", "capacity.width_step=2"),
                                                   ("capacity.width_step=0.25", "width_rule=multiple only")])
def test_bad_capacity_settings_are_refused_before_anything_runs(tmp_path, override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        execute(config(tmp_path, override))
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------- one width rule for every method
GRID = ("capacity.setting=grid", "capacity.low=0.0625")  # r = 1/16, 3/8, 11/16, 1
WIDTH_METHODS = ("heterofl", "fjord", "fedrolex", "flanc", "tailorfl", "pa3dfl")


def widths_of(tmp_path, name: str, *overrides: str) -> list[float]:
    """Each client's width relative to the zoo's full model, as the method sizes it."""
    exp = build_experiment(to_container(config(tmp_path, f"method={name}", *GRID, *overrides)))
    base = float(exp.config["model"].get("width", 1.0))
    return [base * exp.method.client_width(c) for c in range(exp.fed.num_clients)]


def test_one_width_rule_gives_every_method_the_same_widths_with_p_squared_within_capacity(tmp_path):
    r = client_capacities({"setting": "grid", "low": 0.0625, "high": 1.0}, 4, 0).tolist()
    shared = {name: widths_of(tmp_path, name, "capacity.width_rule=multiple") for name in WIDTH_METHODS}
    assert set(map(tuple, shared.values())) == {(0.25, 0.5, 0.75, 1.0)}  # multiples of p_min = 1/4, p^2 <= r
    assert all(p * p <= c + 1e-12 and (p / 0.25).is_integer() for p, c in zip(shared["heterofl"], r, strict=True))
    assert widths_of(tmp_path, "fedavg", "capacity.width_rule=multiple") == [0.25] * 4  # unaware: the weakest's
    finer = ("capacity.width_rule=multiple", "capacity.width_step=0.0625")
    assert {tuple(widths_of(tmp_path, n, *finer)) for n in WIDTH_METHODS if n != "pa3dfl"} == {
        (0.25, 0.5625, 0.8125, 1.0)}
    assert {tuple(widths_of(tmp_path, n, "capacity.width_rule=levels")) for n in WIDTH_METHODS} == {
        (0.25, 0.5, 0.5, 1.0)}


def test_each_methods_own_width_rule_is_the_neutral_default(tmp_path):
    assert widths_of(tmp_path, "heterofl") == widths_of(tmp_path, "fjord") == [0.25, 0.5, 0.5, 1.0]  # 0.5^k
    assert widths_of(tmp_path, "fedrolex") == widths_of(tmp_path, "tailorfl") == [0.25, 0.5625, 0.8125, 1.0]
    assert widths_of(tmp_path, "heterofl", "capacity.width_rule=multiple") == [0.25, 0.5, 0.75, 1.0]
    for name in ("heterofl", "pa3dfl"):  # Pa3dFL's config carries the capacity config too (method.federation)
        cfg = to_container(config(tmp_path, f"method={name}", *GRID))
        assert cfg["capacity"]["width_rule"] == "method" and cfg["capacity"]["width_step"] is None
        older = {**cfg, "capacity": {k: v for k, v in cfg["capacity"].items() if not k.startswith("width_")}}
        if name == "pa3dfl":
            older["method"] = {**cfg["method"], "federation": {**cfg["method"]["federation"],
                                                               "capacity": older["capacity"]}}
        assert config_hash(cfg) == config_hash(older)
        assert config_hash(to_container(config(tmp_path, f"method={name}", *GRID, "capacity.width_rule=multiple"))) \
            != config_hash(cfg)


def test_a_runs_summary_records_each_clients_cost_and_the_rule(tmp_path):
    summary = execute(config(tmp_path, "method=heterofl", *GRID, "capacity.width_rule=multiple", "rounds=1"))
    assert summary["capacity"]["width"] == [0.25, 0.5, 0.75, 1.0]
    assert summary["capacity"]["cost"] == [0.0625, 0.25, 0.5625, 1.0]
    assert summary["capacity"]["rule"] == "the largest multiple p of p_min with p² ≤ r"
    gate = build_experiment(to_container(config(tmp_path, "method=pfedgate", *GRID)))
    assert [gate.method.client_cost(c) for c in range(4)] == [0.0625, 0.375, 0.6875, 1.0]  # its sparsity s_i = r_i


def _pa3dfl_tables_and_scales() -> list[tuple[Path, str]]:
    """Every Pa3dFL table spec with each scale it defines (paper scale always exists)."""
    pairs = []
    for path in sorted((ROOT / "conf" / "paper" / "pa3dfl").glob("table*.yaml")):
        scales = set(load_spec(path).get("scales", {})) | {"paper"}
        pairs += [(path, scale) for scale in ("mini", "medium", "paper") if scale in scales]
    return pairs


@pytest.mark.parametrize(("path", "scale"), _pa3dfl_tables_and_scales())
def test_every_row_of_a_pa3dfl_table_follows_one_width_rule(path, scale):
    spec = load_spec(path)
    per_cell: dict[tuple[str, int], set] = {}
    for cell in expand(spec, scale):
        settings = {}
        for override in cell.overrides:  # the last value of each capacity key wins, as in Hydra
            key, _, value = override.partition("=")
            if key.startswith("capacity."):
                settings[key] = value
        assert settings.get("capacity.width_rule") == "multiple", (cell.row, cell.column)
        per_cell.setdefault((cell.column, cell.seed), set()).add(tuple(sorted(settings.items())))
    assert all(len(settings) == 1 for settings in per_cell.values())  # the same capacities and rule for every row
