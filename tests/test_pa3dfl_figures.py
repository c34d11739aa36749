"""Pa3dFL Figures 2 and 3 (scripts/pa3dfl/figures.py) from a fake run tree of Table 1 written with the project's own
record writer: the capacity quintiles, the per-cluster means at the protocol's round (post, best_val, unweighted)
checked by hand, the learning curves, and the files."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.core.records import RunDir
from bench.core.summary import eval_record, summarize
from bench.experiment.run import run_dir_for
from bench.experiment.spec import cell_config, expand, load_spec
from common.verified_io import atomic_write_json, atomic_write_text
from scripts.pa3dfl import figures as figs

pytestmark = pytest.mark.slow  # trains the figures' runs

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "pa3dfl" / "figures.py"

COLUMN = "FashionMNIST Hetero"
#: r_i of clients 0..9; sorted: 1 (0.05), 5, 7, 3, 9, 2, 8, 4, 0, 6 (0.95) -> quintiles {1,5} {7,3} {9,2} {8,4} {0,6}
CAPS = [0.9, 0.05, 0.5, 0.3, 0.7, 0.1, 0.95, 0.2, 0.6, 0.4]
#: post test accuracy of clients 0..9 at round 4, the round of the best mean validation accuracy
ACC4 = [80.0, 10.0, 50.0, 30.0, 70.0, 20.0, 90.0, 40.0, 60.0, 50.0]
#: by hand: Q1 (10 + 20) / 2, Q2 (40 + 30) / 2, Q3 (50 + 50) / 2, Q4 (60 + 70) / 2, Q5 (80 + 90) / 2
CLUSTER_MEANS = [15.0, 35.0, 50.0, 65.0, 85.0]


def write_run(path: Path, method: str, caps: Sequence[float], offset: float) -> None:
    """A finished run: rounds 4 and 8 evaluated pre and post on test and val; round 4 has the best mean val accuracy
    but round 8 the best (and final) test accuracy, and 'pre' other numbers, so a wrong round or stage shows."""
    n = len(caps)
    clients = list(range(n))
    records = []
    for round_, val, test in ((4, 80.0, ACC4), (8, 60.0, [90.0] * n)):
        for stage, shift in (("pre", -7.0), ("post", offset)):
            for split, accs in (("val", [val] * n), ("test", test)):
                correct = [round(a + shift) for a in accs]  # n = 100 test images: correct = accuracy in %
                records.append(eval_record(round_, stage, split, clients, correct, [1.0] * n, [100] * n))
    run = RunDir(path)
    run.append_records(records)
    atomic_write_text(path / "partition" / "capacities.csv",
                      "client,capacity,width\n" + "".join(f"{c},{r},1.0\n" for c, r in enumerate(caps)))
    protocol = {"stage": "post", "selection": "best_val", "weighting": "unweighted"}
    atomic_write_json(run.summary, {"complete": True, "method": method, "protocol": protocol,
                                    "results": summarize(records)})


def fake_table(tmp_path: Path, scale: str = "mini") -> Path:
    """FedAvg (offset 0, 2 for seeds 0, 1) and Pa3dFL (offset 5, 9) runs of Table 1's FashionMNIST Hetero column,
    where the table's cells at ``scale`` put them."""
    out = tmp_path / "runs"
    offsets = {("FedAvg", 0): 0.0, ("FedAvg", 1): 2.0, ("Pa3dFL", 0): 5.0, ("Pa3dFL", 1): 9.0}
    for cell in expand(load_spec(figs.SPEC), scale, out_dir=str(out)):
        if cell.column == COLUMN and (cell.row, cell.seed) in offsets:
            cfg = cell_config(cell)
            write_run(run_dir_for(cfg), cfg["method"]["name"], CAPS, offsets[(cell.row, cell.seed)])
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_capacity_clusters_are_the_quintiles_of_r():
    assert figs.capacity_clusters(dict(enumerate(CAPS))) == {1: 0, 5: 0, 7: 1, 3: 1, 9: 2, 2: 2, 8: 3, 4: 3, 0: 4, 6: 4}
    # 7 clients: ranks 0..6 -> floor(5 j / 7) = 0 0 1 2 2 3 4; equal r_i are ranked by client id
    caps = {10: 0.5, 11: 0.2, 12: 0.5, 13: 0.9, 14: 0.1, 15: 0.5, 16: 0.3}
    assert figs.capacity_clusters(caps) == {14: 0, 11: 0, 16: 1, 10: 2, 12: 2, 15: 3, 13: 4}
    assert sorted(figs.capacity_clusters({c: 1.0 for c in range(20)}).values()) == [q for q in range(5) for _ in "abcd"]
    with pytest.raises(ValueError, match="4 clients"):
        figs.capacity_clusters({c: 0.5 for c in range(4)})


def test_fig2_cluster_means_at_the_best_validation_round_by_hand(tmp_path):
    out = fake_table(tmp_path)
    assert figs.hetero_columns(load_spec(figs.SPEC)) == ["CIFAR-10 Hetero", "CIFAR-100 Hetero", "FashionMNIST Hetero"]
    runs = figs.table_runs(figs.SPEC, "mini", str(out), columns=[COLUMN], results=str(tmp_path / "results"))
    assert list(runs) == [COLUMN] and list(runs[COLUMN]) == ["FedAvg", "Pa3dFL"]  # the spec's row order
    assert [len(r) for r in runs[COLUMN].values()] == [2, 2]
    paths = figs.fig2("mini", str(out), str(tmp_path / "results"), columns=[COLUMN])
    base = tmp_path / "results" / "pa3dfl" / "figures" / "fig2_capacity_accuracy"
    assert paths == [Path(f"{base}.png"), Path(f"{base}.pdf"), Path(f"{base}.csv")]
    assert all(p.stat().st_size > 0 for p in paths)
    rows = read_csv(paths[2])
    expected = [(m, q) for m in ("FedAvg", "Pa3dFL") for q in range(1, 6)]
    assert [(r["method"], int(r["cluster"])) for r in rows] == expected
    for r in rows:
        q = int(r["cluster"]) - 1
        seeds = (0.0, 2.0) if r["method"] == "FedAvg" else (5.0, 9.0)
        assert r["rounds"] == "4 4"  # best_val, not the best or final test round (8)
        assert float(r["mean"]) == pytest.approx(CLUSTER_MEANS[q] + sum(seeds) / 2)
        assert float(r["std"]) == pytest.approx(abs(seeds[1] - seeds[0]) / math.sqrt(2))
        assert int(r["seeds"]) == 2
        low, high = sorted(CAPS)[2 * q], sorted(CAPS)[2 * q + 1]
        assert (float(r["r_min"]), float(r["r_max"])) == (low, high)


def test_medium_scale_figures_come_from_the_medium_runs_and_go_to_the_medium_folder(tmp_path):
    out = fake_table(tmp_path, "medium")
    # the mini cells are other run directories
    assert figs.table_runs(figs.SPEC, "mini", str(out), results=str(tmp_path / "results")) == {}
    paths = figs.fig2("medium", str(out), str(tmp_path / "results"))
    assert paths[0] == tmp_path / "results" / "pa3dfl" / "medium" / "figures" / "fig2_capacity_accuracy.png"
    rows = read_csv(paths[2])
    assert {r["column"] for r in rows} == {COLUMN}  # the one column the medium scale runs
    assert float(rows[0]["mean"]) == pytest.approx(CLUSTER_MEANS[0] + 1.0)
    assert figs.panel_title(COLUMN, "medium") == "FashionMNIST Hetero (medium: real data, fewer rounds)"


def test_fig3_curves_are_the_mean_over_seeds_per_round(tmp_path):
    out = fake_table(tmp_path)
    paths = figs.fig3("mini", str(out), str(tmp_path / "results"), columns=[COLUMN], rows=["Pa3dFL"])
    assert [p.suffix for p in paths] == [".png", ".pdf", ".csv"] and all(p.stat().st_size > 0 for p in paths)
    rows = read_csv(paths[2])
    assert [(r["method"], int(r["round"])) for r in rows] == [("Pa3dFL", 4), ("Pa3dFL", 8)]
    # round 4: mean over clients of ACC4 (50) + offsets 5 and 9 -> 55 and 59; round 8: 90 + 5, 90 + 9
    assert [float(r["mean"]) for r in rows] == pytest.approx([57.0, 97.0])
    assert [float(r["std"]) for r in rows] == pytest.approx([2 * math.sqrt(2)] * 2)


def test_command_line_all_skips_missing_runs_and_draws_given_runs(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "all", "--runs", str(tmp_path / "none")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "skipped fig2" in proc.stdout and "skipped fig3" in proc.stdout
    assert proc.stdout.split()[-6:] == [f"results/pa3dfl/figures/{name}{ext}" for name in
                                        ("fig4_size_ratio", "fig5_partitions") for ext in (".png", ".pdf", ".csv")]
    assert not list((tmp_path / "results").glob("**/fig[23]*"))
    runs = [tmp_path / "a", tmp_path / "b"]
    for run, offset in zip(runs, (0.0, 4.0), strict=True):
        write_run(run, "pa3dfl", CAPS, offset)
    proc = subprocess.run([sys.executable, str(SCRIPT), "all", "--run", *map(str, runs)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "skipped attention" in proc.stdout  # these runs have no method records
    written = [word for word in proc.stdout.split() if word.startswith("results/")]
    assert written == [f"results/pa3dfl/figures/{name}_runs{ext}" for name in
                       ("fig2_capacity_accuracy", "fig3_learning_curves") for ext in (".png", ".pdf", ".csv")]
    assert all((tmp_path / p).stat().st_size > 0 for p in written)
    rows = read_csv(tmp_path / written[2])
    assert [float(r["mean"]) for r in rows] == pytest.approx([m + 2.0 for m in CLUSTER_MEANS])
    assert {r["method"] for r in rows} == {"pa3dfl"}


def test_table_runs_are_the_cells_with_the_values_the_search_chose(tmp_path):
    out = fake_table(tmp_path)  # runs of the spec as written: Pa3dFL with Table 5's step
    results = tmp_path / "results"
    assert list(figs.table_runs(figs.SPEC, "mini", str(out), [COLUMN], results=str(results))[COLUMN]) == [
        "FedAvg", "Pa3dFL"]
    chosen = {"row": "Pa3dFL", "column": COLUMN, "chosen": ["method.hn_lr=0.01"], "val_acc": 50.0}
    atomic_write_json(results / "pa3dfl" / "table1.tuning.json", {"results": [chosen]})
    # the table ran Pa3dFL with the chosen step: these runs are not its cells
    assert list(figs.table_runs(figs.SPEC, "mini", str(out), [COLUMN], results=str(results))[COLUMN]) == ["FedAvg"]


def test_attention_figure_draws_entropy_and_alpha_from_the_method_records(tmp_path):
    out = fake_table(tmp_path)
    runs = figs.table_runs(figs.SPEC, "mini", str(out), [COLUMN], ["Pa3dFL"], str(tmp_path / "results"))
    uniform, n = math.log(len(CAPS)), len(CAPS)
    for seed, run in enumerate(runs[COLUMN]["Pa3dFL"]):  # seeds 0 and 1
        summary = json.loads(RunDir(run).summary.read_text())
        atomic_write_json(RunDir(run).summary, {**summary, "num_clients": n})
        RunDir(run).append_records([  # two generated layers; round 4's evaluation's alphas arrive in round 5's record
            {"kind": "method", "round": 4, "tau": [1.0, 1.0], "attention_entropy": [0.5 * uniform, 0.7 * uniform]},
            {"kind": "method", "round": 5, "tau": [1.0, 1.0], "attention_entropy": [(0.2 + 0.2 * seed) * uniform] * 2,
             "fusion_round": 4, "fusion_alpha": [0.5 + 0.1 * seed] * (n - 1) + [None]},
        ])
    paths = figs.attention("mini", str(out), str(tmp_path / "results"), columns=[COLUMN])
    assert [p.name for p in paths] == [f"attention_alpha{ext}" for ext in (".png", ".pdf", ".csv")]
    assert all(p.stat().st_size > 0 for p in paths)
    rows = read_csv(paths[2])
    assert {r["method"] for r in rows} == {"Pa3dFL"}  # FedAvg's runs have no hypernetwork
    got = [(r["quantity"], int(r["round"]), int(r["seeds"])) for r in rows]
    assert got == [("entropy", 4, 2), ("entropy", 5, 2), ("alpha", 4, 2)]
    assert [float(r["mean"]) for r in rows] == pytest.approx([0.6, 0.3, 0.55])  # by hand, mean over seeds
    assert [float(r["std"]) for r in rows] == pytest.approx([0.0, math.sqrt(0.02), math.sqrt(0.005)])


# ------------------------------------------------------------------------------------------ Fig. 4: model size
def pa3d_closed_form(out_f: int, in_f: int, k2: int, width: float, p_min: float, conv: bool) -> int:
    """docs/methods/pa3dfl.md: U is [R1, k^2, R2] at every width, V is [pT/R1, pS, R2]; R1 = p_min T, linear R2 = R1,
    conv R2 = min(R1 k^2, (T/R1) S) (rank_scale 1)."""
    r1 = round(p_min * out_f)
    r2 = min(r1 * k2, out_f // r1 * in_f) if conv else r1
    return r1 * k2 * r2 + round(width * out_f) // r1 * round(width * in_f) * r2


@pytest.mark.parametrize("p_min", [1 / 8, 1 / 4])
@pytest.mark.parametrize("width", [1.0, 1 / 4])
def test_fig4_sizes_are_the_closed_form_counts_of_the_decomposition(width, p_min):
    conv, lin = figs.FIG4_OPERATORS
    assert figs.decomposed_size(conv, width, p_min) == pa3d_closed_form(64, 64, 25, width, p_min, conv=True)
    assert figs.decomposed_size(lin, width, p_min) == pa3d_closed_form(384, 1600, 1, width, p_min, conv=False)
    assert figs.dense_size(conv, width) == round(width * 64) ** 2 * 25
    assert figs.dense_size(lin, width) == round(width * 384) * round(width * 1600)


def test_fig4_numbers_by_hand():
    """Conv(64, 64, 5, 5), p_min = 1/8: R1 = 8, R2 = min(200, 8 * 64) = 200, U = 8 * 25 * 200 = 40000,
    V = (8p) (64p) 200; Linear(1600, 384): R1 = R2 = 48, U = 2304, V = (8p) (1600p) 48."""
    rows = figs.fig4_data(widths=[1.0, 0.25], p_mins=[1 / 8], rank_scales=[0.5])
    got = {(r["operator"][:4], r["rank_scale"], r["width"]): r for r in rows}
    assert got[("Conv", 1.0, 1.0)]["params"] == 40000 + 8 * 64 * 200
    assert got[("Conv", 1.0, 0.25)]["ratio"] == (40000 + 2 * 16 * 200) / 102400
    assert got[("Conv", 1.0, 0.25)]["p_width_ratio"] == 1 / 16
    assert got[("Conv", 0.5, 1.0)]["params"] == 8 * 25 * 100 + 8 * 64 * 100  # R2 = round(0.5 * 200)
    assert got[("Line", 1.0, 1.0)]["params"] == 2304 + 8 * 1600 * 48
    assert got[("Line", 1.0, 0.25)]["ratio"] == (2304 + 2 * 400 * 48) / (384 * 1600)
    assert not any(k[0] == "Line" and k[1] != 1.0 for k in got)  # linear R2 = R1 whatever rank_scale


# ------------------------------------------------------------------------------------------ Fig. 5: partitions
def test_fig5_counts_are_the_partitions_class_counts():
    import torch

    from datasets.partition import LabelInfo, make_partition

    labels = LabelInfo(train_labels=torch.arange(60) % 3, test_labels=torch.arange(30) % 3, num_classes=3)
    partition = make_partition("dirichlet", labels, 4, seed=0, val_fraction=0.2, alpha=0.5, n_train=12, n_test=5)
    pool = torch.cat([labels.train_labels, labels.test_labels])
    counts = figs.train_counts(partition, pool)
    for cid, client in enumerate(partition.clients):
        held = torch.cat([client.train, client.val])
        assert counts[cid].tolist() == torch.bincount(pool[held], minlength=3).tolist()
    data = [{"column": "c", "counts": counts}]
    rows = figs.fig5_rows(data)
    assert [[r[f"class_{c}"] for c in range(3)] for r in rows] == counts.tolist()
    assert [r["total"] for r in rows] == counts.sum(axis=1).tolist()


def test_fig5_draws_a_table_column_from_label_counts(tmp_path, monkeypatch):
    """Without the data the partition comes from the official label counts; the figure's CSV is its class counts."""
    from datasets.sources import DataSourceError

    def absent(*args, **kwargs):
        raise DataSourceError("no data here")

    monkeypatch.setattr("bench.core.data.load_sources", absent)
    paths = figs.fig5("mini", str(tmp_path), columns=["FashionMNIST Hetero"])
    assert [p.name for p in paths] == ["fig5_partitions.png", "fig5_partitions.pdf", "fig5_partitions.csv"]
    rows = read_csv(paths[-1])
    assert len(rows) == 20 and {r["column"] for r in rows} == {"FashionMNIST Hetero"}
    assert all(int(r["total"]) == 200 for r in rows)  # n_train 200 per client (train + validation)


def test_sweep_figure_plots_the_tables_rows_by_swept_value_and_states_the_claims(tmp_path: Path) -> None:
    results = tmp_path / "results"
    (results / "pa3dfl").mkdir(parents=True)
    rows = [("lam=0.1", "FashionMNIST Ideal", 70.0, 1.0), ("lam=0.0", "FashionMNIST Ideal", 80.0, 1.0),
            ("lam=0.001", "FashionMNIST Ideal", 75.0, 1.0), ("lam=0.1", "CIFAR-10 Hetero", 60.0, 2.0),
            ("lam=0.0", "CIFAR-10 Hetero", 61.0, 2.0), ("lam=0.001", "CIFAR-10 Hetero", math.nan, math.nan)]
    text = "method,column,mean,std,seeds\n" + "".join(f"{m},{c},{a},{s},3\n" for m, c, a, s in rows)
    (results / "pa3dfl" / "fig8.csv").write_text(text.replace("nan", ""))
    paths = figs.sweep_figure("fig8", "mini", results=str(results))
    base = results / "pa3dfl" / "figures" / "fig8_sweep"
    assert [p.name for p in paths] == ["fig8_sweep.png", "fig8_sweep.pdf", "fig8_sweep.caption.txt",
                                       "fig8_sweep.csv"]
    with open(str(base) + ".csv", newline="") as f:
        plotted = [(r["column"], float(r["value"]), float(r["mean"])) for r in csv.DictReader(f)]
    assert plotted == [("FashionMNIST Ideal", 0.0, 80.0), ("CIFAR-10 Hetero", 0.0, 61.0),
                       ("FashionMNIST Ideal", 0.001, 75.0), ("FashionMNIST Ideal", 0.1, 70.0),
                       ("CIFAR-10 Hetero", 0.1, 60.0)]  # sorted by value; the unfinished cell left out
    caption = (results / "pa3dfl" / "figures" / "fig8_sweep.caption.txt").read_text()
    assert "FashionMNIST Ideal: best lambda 0 (80.0; small preferred: holds)" in caption
    # a sweep with a hole (an unfinished cell) cannot test the claim: it used to read "range 1.0 points ... holds"
    assert "CIFAR-10 Hetero: cannot test (1 of 3 values not averaged in, 0.001: see the table)" in caption
    assert figs.sweep_figure("fig_hn_depth", "mini", results=str(results)) == []  # no table yet


def test_depth_claim_compares_the_shallowest_and_deepest() -> None:
    data = [{"column": "X", "value": 1.0, "mean": 50.0, "std": 1.0}, {"column": "X", "value": 4.0, "mean": 55.0,
                                                                    "std": 1.0}]
    assert "X: depth 1 50.0 -> 4 55.0 (deeper is better: holds)" in figs.sweep_claims("fig_hn_depth", data)
    data[1]["mean"] = 45.0
    assert "deeper is better: does not hold" in figs.sweep_claims("fig_hn_depth", data)


def test_fig6_claims_rank_pa3dfl_at_each_panels_last_round() -> None:
    data = [{"column": c, "method": m, "round": t, "mean": v, "std": 0.0} for c, m, t, v in [
        ("CIFAR-10 Hetero", "Pa3dFL", 10, 70.0), ("CIFAR-10 Hetero", "Pa3dFL", 20, 80.0),
        ("CIFAR-10 Hetero", "FjORD", 20, 75.0), ("FashionMNIST Hetero", "Pa3dFL", 20, 80.0),
        ("FashionMNIST Hetero", "FjORD", 20, 80.5), ("CIFAR-100 Ideal", "Pa3dFL", 20, 60.0),
        ("CIFAR-100 Ideal", "FedAvg", 20, 65.0)]]
    assert figs.final_means(data)["CIFAR-10 Hetero"] == {"Pa3dFL": 80.0, "FjORD": 75.0}  # the last round's mean
    text = figs.fig6_claims(data)
    assert "CIFAR-10 Hetero: Pa3dFL 80.0, rank 1 of 2 (best other FjORD 75.0; first: holds)" in text
    assert "FashionMNIST Hetero: Pa3dFL 80.0, rank 2 of 2 (best other FjORD 80.5; within 1 of FjORD: holds)" in text
    assert "CIFAR-100 Ideal: Pa3dFL 60.0, rank 2 of 2 (best other FedAvg 65.0; within 1 of the best: does not hold)" \
        in text


def test_fig6_claims_name_a_cell_the_table_could_not_average(tmp_path: Path) -> None:
    data = [{"column": "FashionMNIST Ideal", "method": m, "round": 20, "mean": v, "std": 0.0}
            for m, v in [("Pa3dFL", 80.0), ("FedAvg", 70.0)]]
    assert "within 1 of the best: holds" in figs.fig6_claims(data)
    csv_path = tmp_path / "fig6.csv"
    csv_path.write_text("method,column,mean,std,seeds,state\nPa3dFL,FashionMNIST Ideal,,,0,did not train\n"
                        "FedAvg,FashionMNIST Ideal,70.0,1.0,3,\n")
    states = figs.table_states([csv_path, tmp_path / "absent.csv"])
    assert states == {("FashionMNIST Ideal", "Pa3dFL"): "did not train"}
    text = figs.fig6_claims(data, states=states)
    assert ("FashionMNIST Ideal: Pa3dFL 80.0, rank 1 of 2 (best other FedAvg 70.0; within 1 of the best; the table's "
            "cell did not train, its seeds' mean curve drawn: does not hold)") in text


def test_fig6_reads_table1_and_fig6_cells_of_every_column() -> None:
    table1, fig6 = load_spec(figs.SPEC), load_spec(figs.FIG6_SPEC)
    assert fig6["exp"] == "pa3dfl/table1" and fig6["rows"] == table1["rows"] and fig6["columns"] == table1["columns"]
    mini = {c.column for c in expand(fig6, "mini")}
    assert mini == {"CIFAR-10 Ideal", "CIFAR-100 Ideal", "FashionMNIST Ideal"}  # Table 1's mini runs the Hetero ones
    one = next(c for c in expand(fig6, "paper") if c.row == "FedAvg" and c.column == "CIFAR-10 Hetero" and c.seed == 0)
    same = next(c for c in expand(table1, "paper") if c.row == "FedAvg" and c.column == "CIFAR-10 Hetero"
                and c.seed == 0)
    assert run_dir_for(cell_config(one)) == run_dir_for(cell_config(same))  # one experiment: the same run


@pytest.mark.parametrize(("name", "param", "values"), [("fig8", "method.lam", [0.0, 0.001, 0.01, 0.1, 1.0]),
                                                       ("fig_hn_depth", "method.encoder_depth", [1, 2, 3, 4])])
def test_sweep_specs_vary_only_the_swept_parameter(name: str, param: str, values: list[float]) -> None:
    spec = load_spec(figs.ROOT / "conf" / "paper" / "pa3dfl" / f"{name}.yaml")
    for scale in ("mini", "paper"):
        cells = [c for c in expand(spec, scale) if c.seed == 0]
        by_column: dict[str, dict[float, dict]] = {}
        for cell in cells:
            cfg = cell_config(cell)
            by_column.setdefault(cell.column, {})[float(cell.row.split("=")[1])] = cfg
        for column, configs in by_column.items():
            assert sorted(configs) == values, column
            method = [{k: v for k, v in cfg["method"].items() if k != param.split(".")[1]} for cfg in configs.values()]
            assert all(m == method[0] for m in method), column  # every other method setting equal across the sweep
            assert [cfg["method"][param.split(".")[1]] for cfg in configs.values()] == [
                type(cfg["method"][param.split(".")[1]])(v) for v, cfg in configs.items()]


def test_table_runs_of_a_figure_spec_are_found_under_its_exp(tmp_path):
    # fig6.yaml names Table 1's experiment (exp: pa3dfl/table1): its cells' runs live there, not under pa3dfl/fig6
    out = tmp_path / "runs"
    cell = next(c for c in expand(load_spec(figs.FIG6_SPEC), "mini", out_dir=str(out))
                if c.row == "FedAvg" and c.column == "CIFAR-10 Ideal" and c.seed == 0)
    cfg = cell_config(cell)
    assert Path(run_dir_for(cfg)).is_relative_to(out / "pa3dfl" / "table1" / "mini")
    write_run(run_dir_for(cfg), cfg["method"]["name"], CAPS, 0.0)
    runs = figs.table_runs(figs.FIG6_SPEC, "mini", str(out), ["CIFAR-10 Ideal"], results=str(tmp_path / "results"))
    assert {c: list(r) for c, r in runs.items()} == {"CIFAR-10 Ideal": ["FedAvg"]}
