"""Tuning blocks of the real table specs: every grid point composes and validates, the scale blocks' per-row
overrides reach the grid points, the LG-FedAvg splits exist in the model, and bad blocks fail with a clear error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from bench.core.flat import FlatModel
from bench.core.models import build_model
from bench.experiment.run import validate
from bench.experiment.spec import Cell, cell_config, load_spec
from bench.experiment.tuning import grid_points, point_name, score_selection, settings
from bench.experiment.tuning import search_cells as tuning_cells
from methods.lgfedavg import local_layers_mask

FEDSELECT = Path(__file__).resolve().parent.parent / "conf" / "paper" / "fedselect" / "table1.yaml"
PA3DFL = Path(__file__).resolve().parent.parent / "conf" / "paper" / "pa3dfl" / "table1.yaml"


def search_cells(spec: dict[str, Any], scale: str) -> list[Cell]:
    """The cells ``bench.experiment.tuning.tune`` runs (without running them)."""
    return tuning_cells(spec, scale)[1]


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_fedselect_grid_points_compose_validate_and_fit_the_model(scale):
    spec = load_spec(FEDSELECT)
    tuning = settings(spec, scale)
    cells = search_cells(spec, scale)
    points = sum(len(grid_points(g)) for g in tuning["grid"].values())
    assert len(cells) == points * len(spec["columns"]) * len(tuning["seeds"])
    assert {"LG-FedAvg", "LotteryFL", "Ditto"} <= set(tuning["grid"]) and ("FedRep" in tuning["grid"]) == (
        scale == "paper")  # mini: 2 local epochs leave one FedRep split (1 + 1)
    models: dict[str, FlatModel] = {}
    for cell in cells:
        cfg = cell_config(cell)
        validate(cfg, check_device=False)
        assert cfg["partition"]["val_fraction"] == tuning["val_fraction"] and cfg["seed"] in tuning["seeds"]
        row = cell.row.split(" [")[0]
        if row != "LG-FedAvg":
            continue
        name = cfg["model"]["name"]
        if name not in models:  # every split leaves a local layer and exists in the model (4 or 21 layers)
            options = {**cfg["model"].get("options", {}), "width": 1.0}
            models[name] = FlatModel(build_model(name, num_classes=10, in_channels=1 if scale == "mini" else 3,
                                                 image_size=28 if scale == "mini" else 32, **options))
        assert local_layers_mask(models[name], cfg["method"]["global_layers"]).any()
    assert set(models) == {"small_cnn" if scale == "mini" else "resnet18"}


@pytest.mark.parametrize(("scale", "steps"), [("mini", {0.001, 0.01, 0.1, 1.0}), ("paper", None)])
def test_pa3dfl_hypernetwork_grid_composes_on_the_scales_columns_and_overrides_table_5(scale, steps):
    spec = load_spec(PA3DFL)
    cells = search_cells(spec, scale)
    columns = spec["scales"]["mini"]["columns"] if scale == "mini" else [c["name"] for c in spec["columns"]]
    assert {c.column for c in cells} == set(columns) and {c.row.split(" [")[0] for c in cells} == {"Pa3dFL"}
    seen = set()
    for cell in cells:
        method = cell_config(cell)["method"]
        validate(cell_config(cell), check_device=False)
        seen.add((method["hn_lr"], method["hn_momentum"]))
    if steps is None:  # paper scale: Table 5's step per column is kept, only the momentum is searched
        assert {m for _, m in seen} == {0.0, 0.9} and {lr for lr, _ in seen} == {0.001, 1.0, 0.1}
    else:
        assert seen == {(lr, m) for lr in steps for m in (0.0, 0.9)}


def test_the_scale_rows_reach_the_grid_points_and_the_point_comes_last():
    spec = load_spec(FEDSELECT)
    cells = search_cells(spec, "mini")
    ditto = [c for c in cells if c.row.startswith("Ditto [")]
    assert len(ditto) == 4 * len(spec["columns"])
    for cell in ditto:  # scales.mini.rows.Ditto (2 personal epochs like the table's), then the point's lambda
        point = cell.row.split("[")[1].rstrip("]")
        assert cell.overrides.index("method.personal_epochs=2") < cell.overrides.index(point)
        assert cell_config(cell)["method"]["personal_epochs"] == 2
    paper = {c.row: c for c in search_cells(spec, "paper") if c.row.startswith("FedRep [")}
    split = point_name("FedRep", ["method.head_epochs=1", "method.body_epochs=4"])
    method = cell_config(paper[split])["method"]  # the point overrides the row's 4 + 1
    assert (method["head_epochs"], method["body_epochs"]) == (1, 4) and len(paper) == 4


def test_grid_points_of_a_mapping_and_of_a_list():
    assert grid_points({"a": [1, 2], "b": [3]}) == [["a=1", "b=3"], ["a=2", "b=3"]]
    assert grid_points([{"a": 4, "b": 1}, {"a": 1, "b": 4}]) == [["a=4", "b=1"], ["a=1", "b=4"]]
    assert score_selection({"selection": "final"}) == "final"  # FedSelect: the final round's validation accuracy
    assert score_selection({"selection": "best"}) == "best_val"


@pytest.mark.parametrize(("scale", "where", "value", "message"), [
    ("paper", "grid", {"Nope": {"method.lam": [1]}}, r"tuning.grid names rows \['Nope'\]"),
    ("mini", "mini", {"Nope": {"method.lam": [1]}}, r"tuning.grid names rows \['Nope'\]"),
    ("paper", "grid", {"Ditto": {}}, r"tuning.grid of row 'Ditto' \(paper scale\): tuning.grid entry \{\}"),
    ("paper", "grid", {"Ditto": {"method.lam": []}}, r"row 'Ditto' .*'method.lam' is \[\]: it must be a non-empty"),
    ("mini", "mini", {"Ditto": []}, r"row 'Ditto' \(mini scale\): .*a list of points must be non-empty"),
    ("paper", "grid", {"FedRep": [{"method.head_epochs": 4}, {}]}, r"each a non-empty mapping"),
])
def test_a_bad_tuning_block_is_refused_with_its_row_and_fix(scale, where, value, message):
    spec = copy.deepcopy(load_spec(FEDSELECT))
    if where == "grid":
        spec["tuning"]["grid"] = value
    else:
        spec["scales"]["mini"]["tuning"]["grid"] = value
    with pytest.raises(ValueError, match=message):
        settings(spec, scale)
