"""Pa3dFL Figures 2 and 3 from the run records of Table 1's Hetero columns, Fig. 4 from the decomposed layers' sizes
and Fig. 5 from Table 1's partitions (PNG + PDF + CSV under results/pa3dfl/figures/).

    python scripts/pa3dfl/figures.py fig2 [--scale mini] [--runs runs]
    python scripts/pa3dfl/figures.py fig3 [--scale mini] [--runs runs]
    python scripts/pa3dfl/figures.py fig4                      # no scale, no runs: built layers' parameter counts
    python scripts/pa3dfl/figures.py fig5 [--scale mini]       # no runs: the partitions of seed 0
    python scripts/pa3dfl/figures.py fig6 [--scale mini]       # learning curves, Ideal and Hetero (Table 1 + fig6.yaml)
    python scripts/pa3dfl/figures.py fig8 [--scale mini]       # lambda swept (table CSV of conf/paper/pa3dfl/fig8.yaml)
    python scripts/pa3dfl/figures.py depth [--scale mini]      # HN depth swept (fig_hn_depth.yaml's table CSV)
    python scripts/pa3dfl/figures.py attention [--scale mini]  # Pa3dFL's attention entropy and fusion alpha per round
    python scripts/pa3dfl/figures.py all [--scale mini]        # every figure whose inputs exist (make plots)
    python scripts/pa3dfl/figures.py all --scale medium        # the FashionMNIST column on the real data
    python scripts/pa3dfl/figures.py fig2 --run RUN_DIR ...    # any run directories, grouped by method

Fig. 2 (capacity-specific accuracy): in each Hetero column of Table 1 (conf/paper/pa3dfl/table1.yaml), every run's
clients are sorted by their capacity r_i (``partition/capacities.csv``) and cut into five clusters of (nearly) equal
size, the quintiles of r_i: client of rank k (0-based, ties by client id) of N goes to cluster floor(5 k / N). Each
cluster's accuracy is the mean test accuracy of its clients at the round the table's protocol picks (stage post,
selection best_val: the round with the best mean validation accuracy; unweighted: the plain mean over the clients),
then the mean over seeds with +- one std over seeds as error bars. One panel per Hetero column with finished runs.

Fig. 3 (learning curves): mean test accuracy over the clients (stage post) against the round, per method, the mean
over seeds with a band of +- one std over seeds; one panel per Hetero column.

Fig. 4 (model size, App. A): the size of one decomposed layer at width p (general U + personal V, the parameters a
width-p client holds; biases left out, as in the paper's count of W) over the full dense layer's, for the paper's two
examples Conv(64, 64, 5, 5) and Linear(1600, 384), beside the plain width-p layer (p-width). The layers are built by
``Pa3dFL.extend_model`` (our rank rule: R1 = p_min T, conv R2 = min(round(rank_scale R1 k^2), (T/R1) S), linear
R2 = R1), not counted by formula. The paper's own formulas (Eqs. 12-15) were lost in extraction.

Fig. 5 (partitions, App. E): for each Table 1 column of the scale, a clients x classes heat map of the training
samples (train + validation parts) of seed 0's partition, built from the data when it is present, else from the
official label counts (``datasets/label_counts.py``), as ``bench.experiment.precheck.dry_build`` does.

Attention (no paper figure; Pa3dFL's own records): per round, from the ``kind: method`` records of Table 1's Pa3dFL
runs, the attention's entropy after the round's hypernetwork step (the mean over generated layers of the per-layer
``attention_entropy``, itself the mean over clients, in nats) as a fraction of ln N (1: uniform attention, every client
receives the same personal part; 0: each client attends to one client only), and the fusion alpha of Alg. 1 each
client picked on its validation data at an evaluation (``fusion_alpha`` at ``fusion_round``: the engine evaluates after
a round's method record, so an evaluation's alpha is in the next round's record and the final evaluation's in none),
as the mean over the clients; both as the mean over seeds with a band of +- one std.

Fig. 6 (App. E.2): Fig. 3's curves for every column of Table 1, Ideal and Hetero, from Table 1's runs and those of
``conf/paper/pa3dfl/fig6.yaml`` (the same experiment; at mini scale it adds the Ideal columns). Fig. 8 (App. E.3) and
the hypernetwork-depth study (App. G): accuracy against the swept value (the rows "lam=<v>" / "depth=<v>" of
``fig8.yaml`` / ``fig_hn_depth.yaml``), from the table's CSV. These three state the paper's claim and whether ours holds
under the figure and in ``<figure>.caption.txt``.

Only finished runs (``summary.json`` complete) are drawn. Beside each figure a CSV holds the plotted numbers.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from torch import nn  # noqa: E402

from bench.core.records import RunDir  # noqa: E402
from bench.core.summary import pick  # noqa: E402
from bench.experiment.partition import partition_of, train_counts  # noqa: E402
from bench.experiment.plots import STYLE, save, write_caption  # noqa: E402
from bench.experiment.spec import expand, experiment, load_spec, output_base  # noqa: E402
from common.verified_io import atomic_write_text, read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "conf" / "paper" / "pa3dfl" / "table1.yaml"
FIG6_SPEC = ROOT / "conf" / "paper" / "pa3dfl" / "fig6.yaml"
METHOD_CONF = ROOT / "conf" / "method" / "pa3dfl.yaml"
CLUSTERS = 5
HETERO = re.compile(r"^capacity\.setting=hetero$")
METHOD = re.compile(r"^method=(?P<name>\S+)$")
#: a panel of --run figures (runs given by hand, not a table column)
GIVEN = "given runs"


# ------------------------------------------------------------------------------------------------ finding runs
def hetero_columns(spec: Mapping[str, Any]) -> list[str]:
    """The spec's columns whose clients have heterogeneous capacities (``capacity.setting=hetero``)."""
    return [c["name"] for c in spec["columns"] if any(HETERO.match(o) for o in c.get("overrides", []))]


def table_runs(spec_path: str | Path, scale: str, out_dir: str = "runs", columns: Sequence[str] | None = None,
               rows: Sequence[str] | None = None, results: str | Path = "results") -> dict[str, dict[str, list[Path]]]:
    """column -> row -> finished run directories (one per seed, seed order) of a table spec, with the values its
    search chose (``<results>/.../<table>.tuning.json``) as the table ran them; the Hetero columns unless ``columns``
    is given. A row whose method folder does not exist is skipped without composing its cells' configs (composing one
    takes a noticeable fraction of a second)."""
    from bench.experiment.manifest import cell_dirs
    from bench.experiment.tuning import with_tuned

    spec = with_tuned(load_spec(spec_path), scale, results)
    wanted = list(columns) if columns is not None else hetero_columns(spec)
    found: dict[str, dict[str, list[Path]]] = {}
    exp_dir = Path(out_dir) / experiment(spec) / scale  # the spec's exp: a figure may share a table's runs
    cells = []
    for cell in expand(spec, scale, out_dir=out_dir):
        if cell.column not in wanted or (rows is not None and cell.row not in rows):
            continue
        methods = [m["name"] for m in map(METHOD.match, cell.overrides) if m]
        if methods and not (exp_dir / methods[-1]).is_dir():
            continue
        cells.append(cell)
    for cell, run in cell_dirs(spec, scale, cells, results).items():  # the table's manifest, else composed
        if RunDir(run).is_complete():
            found.setdefault(cell.column, {}).setdefault(cell.row, []).append(run)
    order = {name: i for i, name in enumerate(r["name"] for r in spec["rows"])}
    return {c: dict(sorted(found[c].items(), key=lambda kv: order[kv[0]])) for c in wanted if c in found}


def given_runs(runs: Sequence[Path]) -> dict[str, dict[str, list[Path]]]:
    """``--run`` directories as one panel, grouped by their method (summary.json), in the order given."""
    groups: dict[str, list[Path]] = {}
    for run in runs:
        if not RunDir(run).is_complete():
            raise ValueError(f"{run} is not a finished run directory (no complete summary.json)")
        groups.setdefault(json.loads((Path(run) / "summary.json").read_text())["method"], []).append(Path(run))
    return {GIVEN: groups}


# ---------------------------------------------------------------------------------------- capacity clusters
def read_capacities(run: Path) -> dict[int, float]:
    """client -> r_i of a run (``partition/capacities.csv``: client,capacity,width)."""
    path = Path(run) / "partition" / "capacities.csv"
    if not path.exists():
        raise ValueError(f"{path} not found: the run predates capacity records; run it again")
    with open(path, newline="") as f:
        return {int(r["client"]): float(r["capacity"]) for r in csv.DictReader(f)}


def capacity_clusters(capacities: Mapping[int, float], k: int = CLUSTERS) -> dict[int, int]:
    """client -> cluster 0..k-1 (0 = the smallest capacities): the client of rank j among N (sorted by r_i, ties by
    client id) goes to cluster floor(k j / N), so the clusters are the k-quantiles of r_i, of equal size when k
    divides N."""
    if len(capacities) < k:
        raise ValueError(f"{len(capacities)} clients cannot make {k} capacity clusters")
    ranked = sorted(capacities, key=lambda c: (capacities[c], c))
    return {c: k * j // len(ranked) for j, c in enumerate(ranked)}


def protocol_round(run: Path, protocol: Mapping[str, str]) -> int:
    """The round the protocol (stage, selection, weighting) picks in a finished run (its summary)."""
    summary = json.loads((Path(run) / "summary.json").read_text())
    return int(pick(summary["results"], protocol["stage"], protocol["selection"], protocol["weighting"])["round"])


def eval_record(run: Path, stage: str, round_: int, split: str = "test") -> dict[str, Any]:
    """The evaluation record of one (stage, round, split); a method recording only ``post`` answers ``pre``."""
    found = {r["stage"]: r for r in read_jsonl(Path(run) / "rounds.jsonl")
             if r.get("kind") == "eval" and r["round"] == round_ and r["split"] == split}
    record = found.get(stage, found.get("post") if stage == "pre" else None)
    if record is None:
        raise ValueError(f"{run} has no {stage} {split} evaluation record of round {round_}")
    return record


def cluster_accuracy(run: Path, protocol: Mapping[str, str], k: int = CLUSTERS) -> dict[str, Any]:
    """Per capacity cluster of one run: the clients' mean test accuracy at the protocol's round (unweighted: the
    plain mean; weighted: by test size), the cluster's capacity range and size."""
    caps = read_capacities(run)
    clusters = capacity_clusters(caps, k)
    round_ = protocol_round(run, protocol)
    record = eval_record(run, protocol["stage"], round_)
    acc: list[list[tuple[float, int]]] = [[] for _ in range(k)]
    for cid, a, n in zip(record["clients"], record["acc"], record["n"], strict=True):
        if n and cid in clusters and not math.isnan(a):
            acc[clusters[cid]].append((a, n))
    means = []
    for members in acc:
        if not members:
            means.append(math.nan)
        elif protocol.get("weighting") == "weighted":
            means.append(sum(a * n for a, n in members) / sum(n for _, n in members))
        else:
            means.append(sum(a for a, _ in members) / len(members))
    ranges = [(min(caps[c] for c in clusters if clusters[c] == q), max(caps[c] for c in clusters if clusters[c] == q))
              for q in range(k)]
    return {"round": round_, "acc": means, "ranges": ranges, "sizes": [len(m) for m in acc]}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (0 for one value) of the finite ``values``; (nan, nan) for none."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return math.nan, math.nan
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def fig2_data(panels: Mapping[str, Mapping[str, Sequence[Path]]], protocol: Mapping[str, str],
              k: int = CLUSTERS) -> list[dict[str, Any]]:
    """One row per (column, method, cluster): mean and std over seeds of the cluster's accuracy, the seeds, the
    protocol's rounds and the cluster's capacity range over the runs."""
    out = []
    for column, rows in panels.items():
        for row, runs in rows.items():
            per_run = [cluster_accuracy(run, protocol, k) for run in runs]
            for q in range(k):
                mean, std = mean_std([r["acc"][q] for r in per_run])
                out.append({"column": column, "method": row, "cluster": q + 1, "mean": mean, "std": std,
                            "seeds": len(per_run), "rounds": " ".join(str(r["round"]) for r in per_run),
                            "r_min": min(r["ranges"][q][0] for r in per_run),
                            "r_max": max(r["ranges"][q][1] for r in per_run)})
    return out


def fig3_data(panels: Mapping[str, Mapping[str, Sequence[Path]]], stage: str = "post") -> list[dict[str, Any]]:
    """One row per (column, method, round): mean and std over seeds of the mean test accuracy over clients."""
    out = []
    for column, rows in panels.items():
        for row, runs in rows.items():
            by_round: dict[int, list[float]] = {}
            for run in runs:
                for rec in read_jsonl(Path(run) / "rounds.jsonl"):
                    if rec.get("kind") == "eval" and rec["split"] == "test" and rec["stage"] == stage:
                        by_round.setdefault(rec["round"], []).append(rec["mean_acc"])
            for t in sorted(by_round):
                mean, std = mean_std(by_round[t])
                out.append({"column": column, "method": row, "round": t, "mean": mean, "std": std,
                            "seeds": len(by_round[t])})
    return out


# ---------------------------------------------------------------------------------------------------- drawing
def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The plotted numbers beside the figure (``path`` with .csv), written atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    target = Path(str(path) + ".csv")
    atomic_write_text(target, buffer.getvalue())
    return target


def styles(methods: Sequence[str], highlight: str | None) -> dict[str, dict[str, Any]]:
    """One colour per method (tab20 order); ``highlight`` (the paper's method) thick and black."""
    cmap = plt.get_cmap("tab20")
    out = {}
    for i, m in enumerate(methods):
        out[m] = ({"color": "black", "lw": 2.2, "zorder": 5} if m == highlight
                  else {"color": cmap((2 * i) % 20 + (2 * i // 20) % 2), "lw": 1.2})
    return out


def legend(fig: plt.Figure, axes: Sequence[plt.Axes]) -> None:
    """One legend of every method drawn in any panel, right of the panels."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(name, handle)
    fig.legend(list(entries.values()), list(entries), loc="outside right center", fontsize=7)


#: what a panel's title says about the scale of its runs
SCALE_NOTES = {"mini": " (mini stand-in)", "medium": " (medium: real data, fewer rounds)", "paper": ""}


def panel_title(column: str, scale: str) -> str:
    return column + (SCALE_NOTES[scale] if column != GIVEN else "")


def draw_fig2(data: Sequence[Mapping[str, Any]], path: Path, scale: str, protocol: Mapping[str, str],
              highlight: str | None = "Pa3dFL", k: int = CLUSTERS) -> list[Path]:
    columns = list(dict.fromkeys(d["column"] for d in data))
    methods = list(dict.fromkeys(d["method"] for d in data))
    style = styles(methods, highlight)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(columns), figsize=(4.4 * len(columns) + 1.6, 3.4), layout="constrained",
                                 squeeze=False)
        for ax, column in zip(axes[0], columns, strict=True):
            sub = [d for d in data if d["column"] == column]
            for j, method in enumerate(methods):
                pts = sorted((d for d in sub if d["method"] == method), key=lambda d: d["cluster"])
                if not pts:
                    continue
                shift = (j - (len(methods) - 1) / 2) * 0.025  # error bars side by side
                ax.errorbar([d["cluster"] + shift for d in pts], [d["mean"] for d in pts],
                            yerr=[d["std"] for d in pts], marker="o", ms=3, capsize=2, label=method, **style[method])
            ranges = {d["cluster"]: (d["r_min"], d["r_max"]) for d in sub}
            ax.set_xticks(range(1, k + 1), [f"Q{q}\n{ranges[q][0]:.2f}-{ranges[q][1]:.2f}" if q in ranges else f"Q{q}"
                                            for q in range(1, k + 1)])
            ax.set_xlabel("capacity cluster (quintile of r_i; r range)")
            ax.set_title(panel_title(column, scale))
        axes[0][0].set_ylabel("mean client test accuracy (%)")
        legend(fig, axes[0])
        fig.suptitle(f"Capacity-specific accuracy ({protocol['stage']}, {protocol['selection']}, mean +- std over "
                     "seeds)")
        return save(fig, path)


def draw_fig3(data: Sequence[Mapping[str, Any]], path: Path, scale: str, stage: str,
              highlight: str | None = "Pa3dFL", per_row: int | None = None,
              title: str = "Learning curves (mean +- std over seeds)", claims: str | None = None) -> list[Path]:
    """One panel per column (``per_row`` panels a row, default all in one), one line per method; ``claims`` under
    the figure and beside it (``.caption.txt``)."""
    columns = list(dict.fromkeys(d["column"] for d in data))
    methods = list(dict.fromkeys(d["method"] for d in data))
    style = styles(methods, highlight)
    cols = min(per_row or len(columns), len(columns))
    rows = math.ceil(len(columns) / cols)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 1.6, 3.2 * rows), layout="constrained",
                                 squeeze=False)
        for ax in axes.flat[len(columns):]:
            ax.set_visible(False)
        for ax, column in zip(axes.flat, columns, strict=False):
            for method in methods:
                pts = [d for d in data if d["column"] == column and d["method"] == method]
                if not pts:
                    continue
                x, mean = [d["round"] for d in pts], [d["mean"] for d in pts]
                ax.plot(x, mean, marker="o", ms=2.5, label=method, **style[method])
                ax.fill_between(x, [m - d["std"] for m, d in zip(mean, pts, strict=True)],
                                [m + d["std"] for m, d in zip(mean, pts, strict=True)], color=style[method]["color"],
                                alpha=0.12, lw=0)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(panel_title(column, scale))
        for row in axes:
            row[0].set_ylabel(f"mean client test accuracy (%), {stage}")
        legend(fig, list(axes.flat))
        fig.suptitle(title)
        if claims is None:
            return save(fig, path)
        fig.text(0.0, -0.02, claims, fontsize=7.5, va="top", wrap=True)
        return [*save(fig, path), write_caption(path, claims)]


def final_means(data: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """column -> method -> mean over seeds of the test accuracy at the method's last recorded round."""
    out: dict[str, dict[str, float]] = {}
    for d in data:
        last = out.setdefault(d["column"], {})
        if d["method"] not in last or d["round"] >= last[d["method"]][0]:
            last[d["method"]] = (d["round"], d["mean"])
    return {c: {m: v for m, (_, v) in rows.items()} for c, rows in out.items()}


def table_states(paths: Sequence[Path]) -> dict[tuple[str, str], str]:
    """(column, method) -> the table's verdict on a cell it could not average ("did not train", "failed", ...), from
    the tables' CSVs (their ``state`` column; a missing CSV is skipped)."""
    import pandas as pd

    states: dict[tuple[str, str], str] = {}
    for path in paths:
        if path.exists():
            for r in pd.read_csv(path, keep_default_na=False).to_dict("records"):
                if str(r.get("state", "")).strip():
                    states[(str(r["column"]), str(r["method"]))] = str(r["state"]).strip()
    return states


def fig6_claims(data: Sequence[Mapping[str, Any]], highlight: str = "Pa3dFL", rival: str = "FjORD",
                near: float = 1.0, states: Mapping[tuple[str, str], str] | None = None) -> str:
    """App. E.2's claims against the last round of each panel: under Hetero Pa3dFL first on CIFAR-10 / CIFAR-100 and
    within ``near`` points of FjORD (or above) elsewhere; under Ideal first or within ``near`` of the best. A panel
    whose ``highlight`` cell the table could not average (``states``, e.g. "did not train": a seed ends at chance)
    says so, and its claim does not hold whatever the mean curve's rank."""
    parts = []
    for column, means in final_means(data).items():
        if highlight not in means:
            continue
        best = max((v, m) for m, v in means.items() if m != highlight) if len(means) > 1 else (math.nan, "-")
        mine = means[highlight]
        rank = 1 + sum(v > mine for m, v in means.items() if m != highlight)
        if "Hetero" in column and column.startswith("CIFAR"):
            ok, want = rank == 1, "first"
        elif "Hetero" in column:
            ok, want = rival in means and mine >= means[rival] - near, f"within {near:g} of {rival}"
        else:
            ok, want = mine >= best[0] - near, f"within {near:g} of the best"
        state = (states or {}).get((column, highlight))
        if state:
            ok, want = False, f"{want}; the table's cell {state}, its seeds' mean curve drawn"
        parts.append(f"{column}: {highlight} {mine:.1f}, rank {rank} of {len(means)} (best other {best[1]} "
                     f"{best[0]:.1f}; {want}: {'holds' if ok else 'does not hold'})")
    return ("Paper (App. E.2, Fig. 6): under Hetero Pa3dFL is above the others on CIFAR-10 and CIFAR-100 and "
            "competitive with FjORD; under Ideal it is outstanding whatever the data distribution.\n"
            "Ours (last round, mean over seeds): " + "; ".join(parts) + ".")


# ------------------------------------------------------------------- Pa3dFL's attention entropy and fusion alpha
def attention_series(run: Path) -> dict[str, dict[int, float]]:
    """One run's per-round series: ``entropy`` (round -> mean over generated layers of the attention entropy / ln N)
    and ``alpha`` (evaluated round -> mean over clients of the fusion alpha they picked); empty without records."""
    entropy: dict[int, float] = {}
    alpha: dict[int, float] = {}
    for rec in read_jsonl(Path(run) / "rounds.jsonl"):
        if rec.get("kind") != "method":
            continue
        if rec.get("attention_entropy"):
            if not entropy:
                uniform = math.log(int(json.loads((Path(run) / "summary.json").read_text())["num_clients"]))
            entropy[rec["round"]] = statistics.fmean(rec["attention_entropy"]) / uniform
        alphas = [a for a in rec.get("fusion_alpha") or [] if a is not None]
        if alphas:
            alpha[rec["fusion_round"]] = statistics.fmean(alphas)
    return {"entropy": entropy, "alpha": alpha}


def attention_data(panels: Mapping[str, Mapping[str, Sequence[Path]]]) -> list[dict[str, Any]]:
    """One row per (column, method, quantity, round): mean and std over seeds of :func:`attention_series`."""
    out = []
    for column, rows in panels.items():
        for row, runs in rows.items():
            series = [attention_series(run) for run in runs]
            for quantity in ("entropy", "alpha"):
                rounds = sorted({t for s in series for t in s[quantity]})
                for t in rounds:
                    mean, std = mean_std([s[quantity][t] for s in series if t in s[quantity]])
                    out.append({"column": column, "method": row, "quantity": quantity, "round": t, "mean": mean,
                                "std": std, "seeds": sum(t in s[quantity] for s in series)})
    return out


ATTENTION_CAPTION = ("Pa3dFL's hypernetwork per round (Table 1's Pa3dFL runs, {where}; mean +- std over seeds). Top: "
                     "the attention's entropy after the round's hypernetwork step, mean over clients and generated "
                     "layers, over ln N (1: uniform attention, every client gets the same personal part; 0: each "
                     "client attends to one client; it starts at method.init_entropy). Bottom: the fusion alpha of "
                     "Alg. 1 picked on each client's validation data at each evaluation, mean over clients (1: the "
                     "received model with the global head; 0: the client's last trained model with its local head). "
                     "The final evaluation's alpha is not recorded (the engine evaluates after the method's record).")
#: what ATTENTION_CAPTION says about the scale of the runs
ATTENTION_NOTES = {"mini": "mini stand-in", "medium": "medium: real data, fewer rounds", "paper": "paper scale"}


def draw_attention(data: Sequence[Mapping[str, Any]], path: Path, scale: str) -> list[Path]:
    columns = list(dict.fromkeys(d["column"] for d in data))
    methods = list(dict.fromkeys(d["method"] for d in data))
    style = styles(methods, None)
    labels = {"entropy": "attention entropy / ln N", "alpha": "fusion alpha (mean over clients)"}
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(2, len(columns), figsize=(4.2 * len(columns) + 1.6, 5.6), layout="constrained",
                                 squeeze=False, sharex="col")
        for j, column in enumerate(columns):
            for i, quantity in enumerate(("entropy", "alpha")):
                ax = axes[i][j]
                for method in methods:
                    pts = [d for d in data if (d["column"], d["method"], d["quantity"]) == (column, method, quantity)]
                    if not pts:
                        continue
                    x, mean = [d["round"] for d in pts], [d["mean"] for d in pts]
                    ax.plot(x, mean, marker="o", ms=2.5, label=method, **style[method])
                    ax.fill_between(x, [m - d["std"] for m, d in zip(mean, pts, strict=True)],
                                    [m + d["std"] for m, d in zip(mean, pts, strict=True)],
                                    color=style[method]["color"], alpha=0.15, lw=0)
                ax.set_ylim(-0.05, 1.05)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                if j == 0:
                    ax.set_ylabel(labels[quantity])
            axes[0][j].set_title(panel_title(column, scale))
            axes[1][j].set_xlabel("round")
        if len(methods) > 1:
            legend(fig, axes[0])
        fig.suptitle("Pa3dFL: attention entropy and fusion alpha per round")
        fig.text(0.0, -0.01, ATTENTION_CAPTION.format(where=ATTENTION_NOTES[scale]), fontsize=7.5, va="top",
                 wrap=True)
        return save(fig, path)


# ------------------------------------------------------------------------------------------ Fig. 4: model size
@dataclass(frozen=True)
class Operator:
    """A conv (``kernel`` k: a k x k kernel) or linear (``kernel`` None) layer of T outputs and S inputs."""

    name: str
    out_features: int
    in_features: int
    kernel: int | None = None

    def dense(self, width: float = 1.0, features: int | None = None) -> nn.Conv2d | nn.Linear:
        """The plain layer at ``width`` (pT outputs, pS inputs; ``features`` inputs instead of pS), without bias."""
        out_f, in_f = round(width * self.out_features), features or round(width * self.in_features)
        return (nn.Linear(in_f, out_f, bias=False) if self.kernel is None
                else nn.Conv2d(in_f, out_f, self.kernel, bias=False))


#: the paper's two example operators (App. A, Fig. 4: "Conv(64,64,5,5) and Linear(1600,384) used in CIFAR10")
FIG4_OPERATORS = (Operator("Conv(64, 64, 5, 5)", 64, 64, 5), Operator("Linear(1600, 384)", 384, 1600))
#: the widths drawn (those that are multiples of p_min: Eq. 10 prunes whole blocks of R1 channels)
FIG4_WIDTHS = tuple(k / 16 for k in range(1, 17))
#: the systemic constraints p_min drawn (R1 = p_min T); the paper's default value was lost
FIG4_P_MINS = (1 / 16, 1 / 8, 1 / 4)
#: p_min of the rank_scale sweep: the weakest width of Table 1's Hetero columns at paper scale (r_i ~ U[0.01, 1])
FIG4_P_MIN = 1 / 8
#: conv R2 = round(rank_scale R1 k^2), capped at (T/R1) S; linear layers keep R2 = R1 whatever rank_scale is; 0.75 is
#: conf/method/pa3dfl.yaml's default (the runs' rule), 1 the reconstructed Eq. 14 of the first two panels
FIG4_RANK_SCALES = (0.25, 0.5, 0.75, 1.0, 2.0)


def pa3dfl_hyper(p_min: float, rank_scale: float | None = 1.0) -> Any:
    """Pa3dFL's defaults (conf/method/pa3dfl.yaml) with R1 = ``p_min`` T and conv R2 scaled by ``rank_scale`` (None:
    the file's)."""
    import yaml

    from methods.pa3dfl import Pa3dFLHyper

    values = yaml.safe_load(METHOD_CONF.read_text())
    values = {k: v for k, v in values.items() if k not in ("name", "federation")}
    return Pa3dFLHyper(**{**values, "rank_width": p_min, **({} if rank_scale is None else {"rank_scale": rank_scale})})


class Probe(nn.Module):
    """A body of an input layer (pS outputs) and ``op`` at width p, with the head ``Pa3dFL.extend_model`` expects, so
    that ``op`` is decomposed as a layer after the first (its inputs are pS, not S)."""

    def __init__(self, op: Operator, width: float) -> None:
        super().__init__()
        feed = Operator("input", op.in_features, 1, None if op.kernel is None else 1)
        self.body = nn.Sequential(feed.dense(width, features=1), op.dense(width))
        self.feature_dim = 1
        self.head = nn.Linear(1, 1)


def decomposed_size(op: Operator, width: float, p_min: float, rank_scale: float = 1.0) -> int:
    """Parameters of ``op`` at ``width`` as ``Pa3dFL.extend_model`` decomposes it (general U + personal V)."""
    from methods.pa3dfl import Pa3dFL

    model = Pa3dFL.extend_model(Probe(op, width), pa3dfl_hyper(p_min, rank_scale), width)
    return sum(t.numel() for t in model.body[1].parameters())


def dense_size(op: Operator, width: float = 1.0) -> int:
    return sum(t.numel() for t in op.dense(width).parameters())


def fig4_data(operators: Sequence[Operator] = FIG4_OPERATORS, widths: Sequence[float] = FIG4_WIDTHS,
              p_mins: Sequence[float] = FIG4_P_MINS, rank_scales: Sequence[float] = FIG4_RANK_SCALES,
              p_min: float = FIG4_P_MIN) -> list[dict[str, Any]]:
    """One row per (operator, rule, p_min, rank_scale, width): the decomposed layer's size and its ratio to the full
    dense layer, beside the plain width-p layer's ratio. Rules: ``pa3dfl`` (rank_scale 1, every p_min) and
    ``rank_scale`` (p_min fixed, every rank_scale, conv layers only: linear R2 = R1 ignores it)."""
    settings = [("pa3dfl", m, 1.0) for m in p_mins] + [("rank_scale", p_min, s) for s in rank_scales if s != 1.0]
    out = []
    for op in operators:
        full = dense_size(op)
        for rule, low, scale in settings:
            if rule == "rank_scale" and op.kernel is None:
                continue
            for p in widths:
                if abs(p / low - round(p / low)) > 1e-9:  # not whole blocks of R1 channels
                    continue
                size = decomposed_size(op, p, low, scale)
                out.append({"operator": op.name, "rule": rule, "p_min": low, "rank_scale": scale, "width": p,
                            "params": size, "full_params": full, "ratio": size / full,
                            "p_width_ratio": dense_size(op, p) / full})
    return out


def fraction(x: float) -> str:
    """1/8 for 0.125 (widths and p_min are 1/2^k here), else the number."""
    return f"1/{round(1 / x)}" if x < 1 and abs(1 / x - round(1 / x)) < 1e-9 else f"{x:g}"


def fig4_claims(data: Sequence[Mapping[str, Any]]) -> str:
    """The caption: App. A's qualitative claims and whether our numbers hold them."""
    conv, lin = FIG4_OPERATORS

    def at(op: Operator, p: float, low: float) -> Mapping[str, Any]:
        return next(d for d in data if d["operator"] == op.name and d["rule"] == "pa3dfl" and d["width"] == p
                    and d["p_min"] == low)

    lin_gap = max(abs(d["ratio"] - d["p_width_ratio"]) for d in data if d["operator"] == lin.name)
    weakest = [at(conv, low, low) for low in FIG4_P_MINS]  # each p_min's weakest client (p = p_min)
    loose = all(a["ratio"] < b["ratio"] for a, b in itertools.pairwise(weakest))  # growing p_min, growing ratio
    limited = all(d["ratio"] < 2 * d["p_width_ratio"] for d in weakest)
    return (
        "Paper (App. A, Fig. 4): under its rank rule the linear layer's ratio is almost p-width's; the conv layer "
        "adds very limited parameters even at small widths, more under a loose constraint (large p_min).\n"
        f"Ours (our rule; the paper's Eqs. 12-15 were lost): linear within {lin_gap:.4f} of p-width at every p and "
        f"p_min: holds. Conv at p = p_min: "
        + ", ".join(f"{d['ratio']:.3f} vs p-width {d['p_width_ratio']:.4f} (p_min {fraction(d['p_min'])})"
                    for d in weakest)
        + f": a looser p_min costs more ({'holds' if loose else 'does not hold'}), but the overhead is "
        + ("limited (holds)" if limited else "not limited (does not hold): U (R1 k^2 R2 entries) is never pruned and "
           "with R2 = R1 k^2 is the same size at every width")
        + "; the third panel shows a smaller R2 shrinking it.")


def draw_fig4(data: Sequence[Mapping[str, Any]], path: Path) -> list[Path]:
    panels = [(op, "pa3dfl") for op in FIG4_OPERATORS] + [(FIG4_OPERATORS[0], "rank_scale")]
    cmap = plt.get_cmap("viridis")
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(panels), figsize=(13, 4.2), layout="constrained")
        for ax, (op, rule) in zip(axes, panels, strict=True):
            rows = [d for d in data if d["operator"] == op.name]
            widths = sorted({d["width"] for d in rows})
            full = [d for d in rows if d["p_min"] == min(FIG4_P_MINS) and d["rule"] == "pa3dfl"]
            ax.plot([d["width"] for d in full], [d["p_width_ratio"] for d in full], "k--", lw=1.4,
                    label="p-width (plain layer, p^2)")
            if rule == "pa3dfl":
                curves = [(m, 1.0, f"Pa3dFL, p_min = {fraction(m)}") for m in FIG4_P_MINS]
                title = f"{op.name}, R1 = p_min T, {'R2 = R1' if op.kernel is None else 'R2 = R1 k^2 (capped)'}"
            else:
                default = pa3dfl_hyper(FIG4_P_MIN, None).rank_scale
                curves = [(FIG4_P_MIN, s, f"R2 = {s:g} R1 k^2 (capped)" + (", runs' default" if s == default else ""))
                          for s in FIG4_RANK_SCALES]
                title = f"{op.name}, p_min = {fraction(FIG4_P_MIN)}, R2 varied"
            for i, (low, scale, name) in enumerate(curves):
                pts = [d for d in rows if d["p_min"] == low and d["rank_scale"] == scale]
                ax.plot([d["width"] for d in pts], [d["ratio"] for d in pts], marker="o", ms=3,
                        color=cmap(i / max(1, len(curves) - 1) * 0.85), label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ticks = [w for w in widths if math.log2(w).is_integer()]
            ax.set_xticks(ticks, [fraction(w) for w in ticks])
            ax.set_xlabel("width ratio p")
            ax.set_title(title, fontsize=8.5)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("layer size / full dense layer size")
        fig.suptitle("Fig. 4: model-size ratio of Pa3dFL's decomposed layer (built by Pa3dFL.extend_model)")
        fig.text(0.0, -0.02, fig4_claims(data), fontsize=7.5, va="top", wrap=True)
        return save(fig, path)


# ------------------------------------------------------------------------------------------ Fig. 5: partitions
def fig5_data(scale: str, seed: int = 0, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Per Table 1 column of ``scale`` (or ``columns``): its seed-``seed`` partition's clients x classes counts."""
    from bench.experiment.spec import cell_config

    spec = load_spec(SPEC)
    out, seen = [], set()
    for cell in expand(spec, scale, seeds=[seed]):
        if cell.column in seen or (columns is not None and cell.column not in columns):
            continue
        seen.add(cell.column)
        cfg = cell_config(cell)
        partition, pool, origin = partition_of(cfg)
        out.append({"column": cell.column, "dataset": cfg["dataset"]["name"], "origin": origin,
                    "partition": {k: v for k, v in cfg["partition"].items() if k != "val_fraction"},
                    "counts": train_counts(partition, pool)})
    return out


def fig5_rows(data: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The CSV: one row per (column, client) with its class counts."""
    width = max(d["counts"].shape[1] for d in data)
    return [{"column": d["column"], "client": i, **{f"class_{c}": int(row[c]) if c < len(row) else "" for c in
                                                     range(width)}, "total": int(row.sum())}
            for d in data for i, row in enumerate(d["counts"])]


def partition_name(part: Mapping[str, Any]) -> str:
    scheme = part["scheme"]
    if scheme == "dirichlet":
        return f"Dir({part['alpha']:g}), prior {part.get('prior', 'uniform')}"
    if scheme == "pathological":
        return f"{part['classes_per_client']} classes per client"
    return str(scheme)


FIG5_CLAIM = ("Paper (App. E, Fig. 5): CIFAR-10 Dir(0.1 p) is strongly label-skewed with unequal class shares, "
              "CIFAR-100 gives each client 20 of its 100 classes, Fashion is IID with equal sizes.\nOurs ({scale}; a "
              "client's train + validation samples): the same three kinds of partition, as the panel titles count "
              "(holds for the partition kinds{note}).")
#: what FIG5_CLAIM adds at each scale
FIG5_NOTES = {"mini": ("mini stand-in: 20 clients of Fashion-MNIST", "; all three drawn from Fashion-MNIST, 2 of 10 "
                       "classes standing for 20 of 100"),
              "medium": ("medium: the FashionMNIST column on the real data", ""), "paper": ("paper scale", "")}


def draw_fig5(data: Sequence[Mapping[str, Any]], path: Path, scale: str, seed: int) -> list[Path]:
    with plt.rc_context(STYLE):
        cols = min(3, len(data))
        rows = math.ceil(len(data) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 0.8, 4.4 * rows), layout="constrained",
                                 squeeze=False)
        for ax in axes.flat[len(data):]:
            ax.set_visible(False)
        for ax, d in zip(axes.flat, data, strict=False):
            counts = d["counts"]
            image = ax.imshow(counts.T, aspect="auto", cmap="viridis", interpolation="nearest", origin="lower",
                              vmin=0)
            ax.grid(False)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel(f"client ({counts.shape[0]})")
            ax.set_ylabel(f"class ({counts.shape[1]})")
            held, sizes = (counts > 0).sum(axis=1), counts.sum(axis=1)
            ax.set_title(f"{panel_title(d['column'], scale)}\n{d['dataset']}, {partition_name(d['partition'])}, "
                         f"from {d['origin']}\nclasses held per client {held.min()}-{held.max()} "
                         f"(mean {held.mean():.1f}), samples {sizes.min()}-{sizes.max()}", fontsize=8)
            fig.colorbar(image, ax=ax, label="training samples", shrink=0.85)
        where, note = FIG5_NOTES[scale]
        fig.suptitle(f"Fig. 5: Table 1's partitions, seed {seed} (clients x classes)")
        fig.text(0.0, -0.02, FIG5_CLAIM.format(scale=where, note=note), fontsize=7.5, va="top", wrap=True)
        return save(fig, path)


# ---------------------------------------------------------------------------------------------------- figures
def panels_for(scale: str, out_dir: str, runs: Sequence[Path] | None, columns: Sequence[str] | None,
               rows: Sequence[str] | None, results: str = "results") -> dict[str, dict[str, list[Path]]]:
    return given_runs(runs) if runs else table_runs(SPEC, scale, out_dir, columns, rows, results)


def skipped(name: str, scale: str, out_dir: str) -> list[Path]:
    """No figure: say why and how to make its runs."""
    print(f"skipped {name}: no finished Hetero runs of Table 1 under {out_dir} (make pa3dfl-table1 SCALE={scale})")
    return []


def fig2(scale: str = "mini", out_dir: str = "runs", results: str = "results", runs: Sequence[Path] | None = None,
         columns: Sequence[str] | None = None, rows: Sequence[str] | None = None) -> list[Path]:
    """Capacity-specific accuracy (module docstring); [] with a message when no finished runs exist."""
    spec, panels = load_spec(SPEC), panels_for(scale, out_dir, runs, columns, rows, results)
    if not panels:
        return skipped("fig2", scale, out_dir)
    data = fig2_data(panels, spec["protocol"])
    base = output_base("pa3dfl", "figures", scale, results) / ("fig2_capacity_accuracy" + ("_runs" if runs else ""))
    return [*draw_fig2(data, base, scale, spec["protocol"], spec.get("compare")), write_csv(data, base)]


def fig3(scale: str = "mini", out_dir: str = "runs", results: str = "results", runs: Sequence[Path] | None = None,
         columns: Sequence[str] | None = None, rows: Sequence[str] | None = None) -> list[Path]:
    """Learning curves (module docstring); [] with a message when no finished runs exist."""
    spec, panels = load_spec(SPEC), panels_for(scale, out_dir, runs, columns, rows, results)
    if not panels:
        return skipped("fig3", scale, out_dir)
    stage = spec["protocol"]["stage"]
    data = fig3_data(panels, stage)
    base = output_base("pa3dfl", "figures", scale, results) / ("fig3_learning_curves" + ("_runs" if runs else ""))
    return [*draw_fig3(data, base, scale, stage, spec.get("compare")), write_csv(data, base)]


def fig6_panels(scale: str, out_dir: str, results: str) -> dict[str, dict[str, list[Path]]]:
    """Every Table 1 column (Ideal and Hetero) with finished runs, from Table 1's runs and the Fig. 6 spec's (the same
    run where both have a cell), columns and rows in Table 1's order."""
    spec = load_spec(SPEC)
    columns = [c["name"] for c in spec["columns"]]
    found: dict[str, dict[str, list[Path]]] = {}
    for source in (SPEC, FIG6_SPEC):
        for column, rows in table_runs(source, scale, out_dir, columns, results=results).items():
            for row, runs in rows.items():
                have = found.setdefault(column, {}).setdefault(row, [])
                have += [r for r in runs if r not in have]
    order = {r["name"]: i for i, r in enumerate(spec["rows"])}
    return {c: dict(sorted(found[c].items(), key=lambda kv: order[kv[0]])) for c in columns if c in found}


def fig6(scale: str = "mini", out_dir: str = "runs", results: str = "results") -> list[Path]:
    """Learning curves of every Table 1 column, Ideal beside Hetero (App. E.2); [] with a message without runs."""
    panels = fig6_panels(scale, out_dir, results)
    if not panels:
        print(f"skipped fig6: no finished runs of Table 1 or Fig. 6 under {out_dir} (make pa3dfl-table1 "
              f"SCALE={scale}; at mini scale the Ideal columns: make pa3dfl-fig6)")
        return []
    stage = load_spec(SPEC)["protocol"]["stage"]
    data = fig3_data(panels, stage)
    base = output_base("pa3dfl", "figures", scale, results) / "fig6_learning_curves"
    states = table_states([output_base("pa3dfl", name, scale, results).with_suffix(".csv")
                           for name in ("table1", "fig6")])
    return [*draw_fig3(data, base, scale, stage, per_row=2, claims=fig6_claims(data, states=states),
                       title="Fig. 6: learning curves, Ideal and Hetero (panel titles), mean +- std over seeds"),
            write_csv(data, base)]


#: the sweep figures: spec name -> (swept parameter as in the rows' names, axis label, title)
SWEEPS = {"fig8": ("lam", "lambda (orthogonality coefficient, Eq. 32)", "Fig. 8: the regulariser coefficient"),
          "fig_hn_depth": ("depth", "hypernetwork encoder depth (Linear layers)", "App. G: depth of the hypernetwork")}


def sweep_rows(frame: Any, param: str) -> list[dict[str, Any]]:
    """The table CSV's rows "<param>=<value>" as (column, value, mean, std, seeds) dicts, sorted by value."""
    out = [{"column": r["column"], "value": float(str(r["method"]).split("=", 1)[1]), "mean": float(r["mean"]),
            "std": float(r["std"]) if r["std"] == r["std"] else 0.0, "seeds": int(r.get("seeds", 0) or 0)}
           for r in frame.to_dict("records") if str(r["method"]).startswith(f"{param}=")]
    return sorted(out, key=lambda d: d["value"])


def sweep_claims(name: str, data: Sequence[Mapping[str, Any]],
                 missing: Mapping[str, Sequence[float]] | None = None) -> str:
    """App. E.3 (lambda) / App. G (depth) claims against the swept means. A column where the table could not average
    some swept values (``missing``: column -> values; did not train, failed) cannot test the claim: a sweep with
    holes has no best value and no range."""
    by_column: dict[str, list[Mapping[str, Any]]] = {}
    for d in data:
        by_column.setdefault(d["column"], []).append(d)
    parts = []
    for column, pts in by_column.items():
        holes = sorted((missing or {}).get(column, ()))
        if holes:
            parts.append(f"{column}: cannot test ({len(holes)} of {len(pts) + len(holes)} values not averaged in, "
                         f"{', '.join(f'{v:g}' for v in holes)}: see the table)")
            continue
        best = max(pts, key=lambda d: d["mean"])
        spread = max(d["mean"] for d in pts) - min(d["mean"] for d in pts)
        noise = max(d["std"] for d in pts)
        if name == "fig_hn_depth":
            ok = pts[-1]["mean"] > pts[0]["mean"]
            parts.append(f"{column}: depth {pts[0]['value']:g} {pts[0]['mean']:.1f} -> {pts[-1]['value']:g} "
                         f"{pts[-1]['mean']:.1f} (deeper is better: {'holds' if ok else 'does not hold'})")
        elif column.startswith("FashionMNIST"):
            ok = best["value"] <= 0.01
            parts.append(f"{column}: best lambda {best['value']:g} ({best['mean']:.1f}; small preferred: "
                         f"{'holds' if ok else 'does not hold'})")
        elif column.startswith("CIFAR-10 "):
            ok = spread <= 2 * noise
            parts.append(f"{column}: range {spread:.1f} points over lambda vs the largest std {noise:.1f} (effect not "
                         f"obvious, read as range <= 2 std: {'holds' if ok else 'does not hold'})")
        else:
            parts.append(f"{column}: best lambda {best['value']:g} ({best['mean']:.1f}), range {spread:.1f} points "
                         "(no claim)")
    paper = ("Paper (App. G): the clients' accuracy benefits from a deeper hypernetwork." if name == "fig_hn_depth" else
             "Paper (App. E.3, Fig. 8): on FashionMNIST a small lambda is preferred; on CIFAR-10 its effect is not "
             "obvious and needs tuning.")
    return paper + "\nOurs (mean over seeds): " + "; ".join(parts) + "."


def sweep_figure(name: str, scale: str = "mini", out_dir: str = "runs", results: str = "results") -> list[Path]:
    """Accuracy against the swept parameter of a sweep spec (``fig8``: lambda, ``fig_hn_depth``: the hypernetwork's
    depth), one line per column, from the table's CSV (``python -m bench.experiment.table
    conf/paper/pa3dfl/<name>.yaml``)."""
    import pandas as pd

    path = output_base("pa3dfl", name, scale, results).with_suffix(".csv")
    if not path.exists():
        print(f"skipped {name}: no table yet (make pa3dfl-{name} SCALE={scale})")
        return []
    param, xlabel, title = SWEEPS[name]
    rows = sweep_rows(pd.read_csv(path), param)
    data = [d for d in rows if not math.isnan(d["mean"])]
    missing: dict[str, list[float]] = {}
    for d in rows:
        if math.isnan(d["mean"]):
            missing.setdefault(d["column"], []).append(d["value"])
    if not data:
        print(f"skipped {name}: {path} has no finished cell")
        return []
    base = output_base("pa3dfl", "figures", scale, results) / f"{name}_sweep"
    positive = sorted({d["value"] for d in data if d["value"] > 0})
    zero_at = positive[0] / 10 if name == "fig8" and positive else 0.0  # lambda = 0 drawn a decade left of the rest
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(5.4, 3.4), layout="constrained")
        for column in dict.fromkeys(d["column"] for d in data):
            pts = [d for d in data if d["column"] == column]
            x = [d["value"] if d["value"] > 0 or name != "fig8" else zero_at for d in pts]
            ax.errorbar(x, [d["mean"] for d in pts], yerr=[d["std"] for d in pts], marker="o", ms=3, capsize=2,
                        label=panel_title(column, scale))
        if name == "fig8":
            ax.set_xscale("log")
            ticks = ([zero_at] if any(d["value"] == 0 for d in data) else []) + positive
            ax.set_xticks(ticks, ["0" if t == zero_at and zero_at else f"{t:g}" for t in ticks])
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean client test accuracy (%)")
        ax.legend(fontsize=7)
        fig.suptitle(title + SCALE_NOTES[scale])
        claims = sweep_claims(name, data, missing)
        fig.text(0.0, -0.02, claims, fontsize=7.5, va="top", wrap=True)
        return [*save(fig, base), write_caption(base, claims), write_csv(data, base)]


def attention(scale: str = "mini", out_dir: str = "runs", results: str = "results", runs: Sequence[Path] | None = None,
              columns: Sequence[str] | None = None, rows: Sequence[str] | None = None) -> list[Path]:
    """Pa3dFL's attention entropy and fusion alpha per round (module docstring), from Table 1's Pa3dFL row (or the
    given runs); [] with a message when no finished run has the records."""
    panels = panels_for(scale, out_dir, runs, columns, rows or (None if runs else ["Pa3dFL"]), results)
    data = attention_data(panels)
    if not data:
        print(f"skipped attention: no finished Pa3dFL runs of Table 1 with attention records under {out_dir} "
              f"(make pa3dfl-table1 SCALE={scale})")
        return []
    base = output_base("pa3dfl", "figures", scale, results) / ("attention_alpha" + ("_runs" if runs else ""))
    return [*draw_attention(data, base, scale), write_csv(data, base)]


def fig4(results: str = "results") -> list[Path]:
    """Model-size ratio of the decomposed layers (module docstring); it has no scale: results/pa3dfl/figures/."""
    data = fig4_data()
    base = output_base("pa3dfl", "figures", "mini", results) / "fig4_size_ratio"
    return [*draw_fig4(data, base), write_csv(data, base)]


def fig5(scale: str = "mini", results: str = "results", seed: int = 0,
         columns: Sequence[str] | None = None) -> list[Path]:
    """Table 1's partitions at ``scale`` (module docstring)."""
    data = fig5_data(scale, seed, columns)
    base = output_base("pa3dfl", "figures", scale, results) / "fig5_partitions"
    return [*draw_fig5(data, base, scale, seed), write_csv(fig5_rows(data), base)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["fig2", "fig3", "fig4", "fig5", "fig6", "fig8", "depth", "attention", "all"])
    parser.add_argument("--scale", default="mini", choices=list(SCALE_NOTES))
    parser.add_argument("--runs", default="runs", help="the runs folder of the table (default: %(default)s)")
    parser.add_argument("--results", default="results", help="the results folder (default: %(default)s)")
    parser.add_argument("--run", type=Path, nargs="+", help="draw these run directories instead (grouped by method)")
    parser.add_argument("--columns", nargs="+", help="Table 1 columns to draw (default: every Hetero column)")
    parser.add_argument("--rows", nargs="+", help="Table 1 rows (methods) to draw (default: all)")
    args = parser.parse_args(argv)
    paths: list[Path] = []
    kw = dict(scale=args.scale, out_dir=args.runs, results=args.results, runs=args.run, columns=args.columns,
              rows=args.rows)
    if args.figure in ("fig2", "all"):
        paths += fig2(**kw)
    if args.figure in ("fig3", "all"):
        paths += fig3(**kw)
    if args.figure == "fig6" or (args.figure == "all" and not args.run):
        paths += fig6(args.scale, args.runs, args.results)
    if args.figure == "fig8" or (args.figure == "all" and not args.run):
        paths += sweep_figure("fig8", args.scale, args.runs, args.results)
    if args.figure == "depth" or (args.figure == "all" and not args.run):
        paths += sweep_figure("fig_hn_depth", args.scale, args.runs, args.results)
    if args.figure in ("attention", "all"):
        paths += attention(**kw)
    given = args.figure == "all" and args.run  # figures of given runs: Figs. 4-5 do not come from runs
    if args.figure == "fig4" or (args.figure == "all" and not given):
        paths += fig4(args.results)
    if args.figure == "fig5" or (args.figure == "all" and not given):
        paths += fig5(args.scale, args.results)
    print("\n".join(map(str, paths)))


if __name__ == "__main__":
    main()
