"""Pa3dFL Figures 2 and 3 from the run records of Table 1's Hetero columns (PNG + PDF under results/pa3dfl/figures/).

    python scripts/pa3dfl_figures.py fig2 [--scale mini] [--runs runs]
    python scripts/pa3dfl_figures.py fig3 [--scale mini] [--runs runs]
    python scripts/pa3dfl_figures.py all [--scale mini]        # every figure whose runs exist (make plots)
    python scripts/pa3dfl_figures.py all --scale medium        # the FashionMNIST column on the real data
    python scripts/pa3dfl_figures.py fig2 --run RUN_DIR ...    # any run directories, grouped by method

Fig. 2 (capacity-specific accuracy): in each Hetero column of Table 1 (conf/paper/pa3dfl/table1.yaml), every run's
clients are sorted by their capacity r_i (``partition/capacities.csv``) and cut into five clusters of (nearly) equal
size, the quintiles of r_i: client of rank k (0-based, ties by client id) of N goes to cluster floor(5 k / N). Each
cluster's accuracy is the mean test accuracy of its clients at the round the table's protocol picks (stage post,
selection best_val: the round with the best mean validation accuracy; unweighted: the plain mean over the clients),
then the mean over seeds with +- one std over seeds as error bars. One panel per Hetero column with finished runs.

Fig. 3 (learning curves): mean test accuracy over the clients (stage post) against the round, per method, the mean
over seeds with a band of +- one std over seeds; one panel per Hetero column.

Only finished runs (``summary.json`` complete) are drawn. Beside each figure a CSV holds the plotted numbers.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from bench.core.records import RunDir, atomic_write_text, read_jsonl  # noqa: E402
from bench.core.summary import pick  # noqa: E402
from bench.plots import STYLE, save  # noqa: E402
from bench.spec import expand, label, load_spec, output_base  # noqa: E402

SPEC = Path(__file__).resolve().parent.parent / "conf" / "paper" / "pa3dfl" / "table1.yaml"
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
               rows: Sequence[str] | None = None) -> dict[str, dict[str, list[Path]]]:
    """column -> row -> finished run directories (one per seed, seed order) of a table spec; the Hetero columns
    unless ``columns`` is given. A row whose method folder does not exist is skipped without composing its cells'
    configs (composing one takes a noticeable fraction of a second)."""
    from bench.run import run_dir_for
    from bench.spec import cell_config

    spec = load_spec(spec_path)
    wanted = list(columns) if columns is not None else hetero_columns(spec)
    found: dict[str, dict[str, list[Path]]] = {}
    exp_dir = Path(out_dir) / spec["paper"] / label(spec) / scale
    for cell in expand(spec, scale, out_dir=out_dir):
        if cell.column not in wanted or (rows is not None and cell.row not in rows):
            continue
        methods = [m["name"] for m in map(METHOD.match, cell.overrides) if m]
        if methods and not (exp_dir / methods[-1]).is_dir():
            continue
        run = run_dir_for(cell_config(cell))
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
              highlight: str | None = "Pa3dFL") -> list[Path]:
    columns = list(dict.fromkeys(d["column"] for d in data))
    methods = list(dict.fromkeys(d["method"] for d in data))
    style = styles(methods, highlight)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(columns), figsize=(4.2 * len(columns) + 1.6, 3.2), layout="constrained",
                                 squeeze=False)
        for ax, column in zip(axes[0], columns, strict=True):
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
        axes[0][0].set_ylabel(f"mean client test accuracy (%), {stage}")
        legend(fig, axes[0])
        fig.suptitle("Learning curves (mean +- std over seeds)")
        return save(fig, path)


# ---------------------------------------------------------------------------------------------------- figures
def panels_for(scale: str, out_dir: str, runs: Sequence[Path] | None, columns: Sequence[str] | None,
               rows: Sequence[str] | None) -> dict[str, dict[str, list[Path]]]:
    return given_runs(runs) if runs else table_runs(SPEC, scale, out_dir, columns, rows)


def fig2(scale: str = "mini", out_dir: str = "runs", results: str = "results", runs: Sequence[Path] | None = None,
         columns: Sequence[str] | None = None, rows: Sequence[str] | None = None) -> list[Path]:
    """Capacity-specific accuracy (module docstring); [] with a message when no finished runs exist."""
    spec = load_spec(SPEC)
    panels = panels_for(scale, out_dir, runs, columns, rows)
    if not panels:
        print(f"skipped fig2: no finished Hetero runs of Table 1 under {out_dir} "
              f"(make pa3dfl-table1 SCALE={scale})")
        return []
    data = fig2_data(panels, spec["protocol"])
    base = output_base("pa3dfl", "figures", scale, results) / ("fig2_capacity_accuracy" + ("_runs" if runs else ""))
    return [*draw_fig2(data, base, scale, spec["protocol"], spec.get("compare")), write_csv(data, base)]


def fig3(scale: str = "mini", out_dir: str = "runs", results: str = "results", runs: Sequence[Path] | None = None,
         columns: Sequence[str] | None = None, rows: Sequence[str] | None = None) -> list[Path]:
    """Learning curves (module docstring); [] with a message when no finished runs exist."""
    spec = load_spec(SPEC)
    panels = panels_for(scale, out_dir, runs, columns, rows)
    if not panels:
        print(f"skipped fig3: no finished Hetero runs of Table 1 under {out_dir} "
              f"(make pa3dfl-table1 SCALE={scale})")
        return []
    stage = spec["protocol"]["stage"]
    data = fig3_data(panels, stage)
    base = output_base("pa3dfl", "figures", scale, results) / ("fig3_learning_curves" + ("_runs" if runs else ""))
    return [*draw_fig3(data, base, scale, stage, spec.get("compare")), write_csv(data, base)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["fig2", "fig3", "all"])
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
    print("\n".join(map(str, paths)))


if __name__ == "__main__":
    main()
