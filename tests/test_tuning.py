"""Tuning blocks of the real table specs: every row gets the same budget (every spec, every scale), every grid point
composes and validates, relative values resolve against each cell's own value, the scale blocks' per-row overrides
reach the grid points, the LG-FedAvg splits exist in the model, and bad blocks fail with a clear error."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from bench.core.flat import FlatModel
from bench.core.models import build_model
from bench.experiment.run import validate
from bench.experiment.spec import Cell, cell_config, load_spec
from bench.experiment.tuning import grid_points, point_name, resolve, row_grids, score_selection, settings
from bench.experiment.tuning import search_cells as tuning_cells
from methods.lgfedavg import local_layers_mask

FEDSELECT = Path(__file__).resolve().parent.parent / "conf" / "paper" / "fedselect" / "table1.yaml"
PA3DFL = Path(__file__).resolve().parent.parent / "conf" / "paper" / "pa3dfl" / "table1.yaml"


def search_cells(spec: dict[str, Any], scale: str) -> list[Cell]:
    """The cells ``bench.experiment.tuning.tune`` runs (without running them)."""
    return tuning_cells(spec, scale)[1]


PAPER_SPECS = sorted((Path(__file__).resolve().parent.parent / "conf" / "paper").glob("*/*.yaml"))


@pytest.mark.parametrize("path", [p for p in PAPER_SPECS if not p.name.startswith("_") and p.name != "claims.yaml"],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_table_that_searches_gives_every_row_the_same_budget(path):
    """Issue 55: a table that searches gives every row, the paper's method included, the same number of points at
    every scale it has (the tables searched Pa3dFL alone, or the baselines' open choices alone)."""
    spec = load_spec(path)
    if not spec.get("tuning"):
        return
    for scale in ("paper", *spec.get("scales", {})):
        grids = row_grids(spec, scale)
        available = {r["name"] for r in spec["rows"] if not r.get("unavailable")}
        assert not grids or (set(grids) == available and len({len(p) for p in grids.values()}) == 1), (scale, grids)


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_fedselect_grid_points_compose_validate_and_fit_the_model(scale):
    spec = load_spec(FEDSELECT)
    tuning = settings(spec, scale)
    cells = search_cells(spec, scale)
    rows = [r["name"] for r in spec["rows"]]
    assert len(cells) == 6 * len(rows) * len(spec["columns"]) * len(tuning["seeds"])  # 6 points a row
    assert {"LG-FedAvg", "LotteryFL", "Ditto"} <= {r for r, g in tuning["grid"].items() if g} and (
        bool(tuning["grid"]["FedRep"]) == (scale == "paper"))  # mini: 2 local epochs leave one FedRep split (1 + 1)
    models: dict[str, FlatModel] = {}
    steps: dict[str, set[float]] = {}
    for cell in cells:
        cfg = cell_config(cell)
        validate(cfg, check_device=False)
        assert cfg["partition"]["val_fraction"] == tuning["val_fraction"] and cfg["seed"] in tuning["seeds"]
        row = cell.row.split(" [")[0]
        steps.setdefault(row, set()).add(cfg["train"]["lr"])
        if row != "LG-FedAvg":
            continue
        name = cfg["model"]["name"]
        if name not in models:  # every split leaves a local layer and exists in the model (4 or 21 layers)
            options = {**cfg["model"].get("options", {}), "width": 1.0}
            models[name] = FlatModel(build_model(name, num_classes=10, in_channels=1 if scale == "mini" else 3,
                                                 image_size=28 if scale == "mini" else 32, **options))
        assert local_layers_mask(models[name], cfg["method"]["global_layers"]).any()
    assert set(models) == {"small_cnn" if scale == "mini" else "resnet18"}
    # the steps around the official code's 0.05: x {1, 0.5, 2} with a key, x 6 factors without
    assert steps["Ditto"] == {0.05, 0.025, 0.1} and steps["FedSelect(0.50)"] == {0.05, 0.035, 0.07, 0.025, 0.1, 0.0175}


@pytest.mark.parametrize("scale", ["mini", "paper"])
def test_pa3dfl_hypernetwork_points_around_table_5(scale):
    """Pa3dFL's two points share one effective hypernetwork step (plain, or a tenth with momentum 0.9): at the paper
    scale Table 5's step of each column (relative, ``×``), at mini scale 1.0 in every column."""
    spec = load_spec(PA3DFL)
    cells = [c for c in search_cells(spec, scale) if c.row.startswith("Pa3dFL [")]
    columns = spec["scales"]["mini"]["columns"] if scale == "mini" else [c["name"] for c in spec["columns"]]
    assert {c.column for c in cells} == set(columns) and len(cells) == 6 * len(columns)
    table5 = {c: next(float(o.split("=")[1]) for o in spec["rows"][-1]["by_column"][c] if o.startswith("method.hn_lr"))
              for c in columns}
    for cell in cells:
        cfg = cell_config(cell)
        validate(cfg, check_device=False)
        step, momentum = cfg["method"]["hn_lr"], cfg["method"]["hn_momentum"]
        effective = step / (1 - momentum)
        assert momentum in (0.0, 0.9)
        assert effective == pytest.approx(table5[cell.column] if scale == "paper" else 1.0)


def test_a_relative_value_resolves_against_the_cells_own():
    assert resolve(["train.lr=×0.5", "method.lam=1", "method.hn_lr=×0.1"], {"train.lr": 0.1, "method.hn_lr": 0.5}) == [
        "train.lr=0.05", "method.lam=1", "method.hn_lr=0.05"]
    with pytest.raises(ValueError, match="a relative value is ×<number>"):
        resolve(["train.lr=×half"], {"train.lr": 0.1})


def test_the_scale_rows_reach_the_grid_points_and_the_point_comes_last():
    spec = load_spec(FEDSELECT)
    cells = search_cells(spec, "mini")
    ditto = [c for c in cells if c.row.startswith("Ditto [")]
    assert len(ditto) == 6 * len(spec["columns"])
    for cell in ditto:  # scales.mini.rows.Ditto (2 personal epochs like the table's), then the point's lambda
        lam = next(o for o in cell.overrides[::-1] if o.startswith("method.lam="))
        assert cell.overrides.index("method.personal_epochs=2") < cell.overrides.index(lam)
        assert cell_config(cell)["method"]["personal_epochs"] == 2
    paper = {c.row: c for c in search_cells(spec, "paper") if c.row.startswith("FedRep [")}
    split = point_name("FedRep", ["train.lr=×1", "method.head_epochs=1", "method.body_epochs=4"])
    method = cell_config(paper[split])["method"]  # the point overrides the row's 4 + 1
    assert (method["head_epochs"], method["body_epochs"]) == (1, 4) and len(paper) == 6


def test_grid_points_of_a_mapping_and_of_a_list():
    assert grid_points({"a": [1, 2], "b": [3]}) == [["a=1", "b=3"], ["a=2", "b=3"]]
    assert grid_points([{"a": 4, "b": 1}, {"a": 1, "b": 4}]) == [["a=4", "b=1"], ["a=1", "b=4"]]
    assert score_selection({"selection": "final"}) == "final"  # FedSelect: the final round's validation accuracy
    assert score_selection({"selection": "best"}) == "best_val"


@pytest.mark.parametrize(("scale", "where", "value", "message"), [
    ("paper", "grid", {"Nope": {"method.lam": [1]}}, r"tuning.grid names rows \['Nope'\]"),
    ("mini", "mini", {"Nope": {"method.lam": [1]}}, r"tuning.grid names rows \['Nope'\]"),
    ("paper", "grid", {"Ditto": {"method.lam": [1]}}, r"leaves out rows \['FedAvg', .*give each its key"),
    ("paper", "Ditto", {}, r"tuning.grid of row 'Ditto' \(paper scale\): tuning.grid entry \{\}"),
    ("paper", "Ditto", {"method.lam": []}, r"row 'Ditto' .*'method.lam' is \[\]: it must be a non-empty"),
    ("paper", "FedRep", [{"method.head_epochs": 4}, {}], r"each a non-empty mapping"),
    ("paper", "Ditto", {"method.lam": [0.1, 1, 2]},
     r"gives rows different budgets \(6 points: FedAvg, .*; 9 points: Ditto\): every row gets the same"),
    ("paper", "lr_factors", [1.0, -0.5], r"tuning.lr_factors is \[1.0, -0.5\]: give a non-empty list of numbers > 0"),
])
def test_a_bad_tuning_block_is_refused_with_its_row_and_fix(scale, where, value, message):
    spec = copy.deepcopy(load_spec(FEDSELECT))
    if where == "grid":
        spec["tuning"]["grid"] = value
    elif where == "mini":
        spec["scales"]["mini"]["tuning"]["grid"] = value
    elif where == "lr_factors":
        spec["tuning"]["lr_factors"] = value
    else:
        spec["tuning"]["grid"][where] = value
    with pytest.raises(ValueError, match=message):
        settings(spec, scale)


def test_the_caption_states_the_budget_or_names_an_unequal_search():
    from bench.experiment.render import search_budget

    spec = copy.deepcopy(load_spec(FEDSELECT))
    for row in spec["rows"]:
        row["searched"] = 6
    lines = search_budget(spec, "mini")
    assert lines[0].startswith("Search budget: 6 points for every row on the tuning seeds [100] (validation split 0.2)")
    assert "Ditto: key method.lam=0.01; method.lam=1" in lines
    spec["rows"][0]["searched"] = None  # records from a search that left FedAvg out
    assert search_budget(spec, "mini") == [
        "Unequal search (the records come from a search that gave rows different budgets): FedAvg 1 point, "
        + ", ".join(f"{r['name']} 6 points" for r in spec["rows"][1:])]


def test_choices_at_the_edge_of_the_step_grid_are_named():
    from bench.experiment.tuning import edge_choices, edge_note

    tuning = {"lr_factors": [1.0, 0.5, 2.0], "lr_factors_alone": [1.0, 0.7, 1.4, 0.5, 2.0, 0.35],
              "grid": {"A": {"method.lam": [0.1, 1]}, "B": None}}
    report = [{"row": "A", "column": "c", "chosen": ["train.lr=0.2"], "chosen_point": ["train.lr=×2", "method.lam=1"]},
              {"row": "B", "column": "c", "chosen": ["train.lr=0.14"], "chosen_point": ["train.lr=×1.4"]},
              {"row": "B", "column": "d", "chosen": ["train.lr=0.035"], "chosen_point": ["train.lr=×0.35"]}]
    assert edge_choices(report, tuning) == ["A | c: train.lr=×2", "B | d: train.lr=×0.35"]
    assert edge_note(report, tuning)[0].startswith("2 of 3 choices take the smallest or largest step of the grid")
    assert edge_note(report[1:2], tuning) == []
