"""FedSelect Figures 1 and 2 from run records (PNG + PDF under results/fedselect/figures/).

    python scripts/fedselect/figures.py fig1 [--scale mini] [--seed 0] [--row "FedSelect(0.50)"]
    python scripts/fedselect/figures.py fig2 [--scale mini]
    python scripts/fedselect/figures.py all [--scale mini]      # every figure whose runs exist (make plots)

Fig. 1: intersection over union of every pair of clients' personal masks on the final linear layer (p = 0.50),
one heatmap per shard setting (s = 2, s = 4), from the ``head_mask_iou`` that FedSelect records every round
(the final round is drawn). Fig. 2: mean test accuracy against the personalization rate p (mean ± std over
seeds), per shard setting, one line per reading of p in GradLTN (``method.fraction``: compounding | fixed) from
the Fig. 2 table (``results/fedselect/fig2.csv``, ``conf/paper/fedselect/fig2.yaml``), with the paper's Table 1
values for the same p (its Fig. 2 plots those runs, Sec. 3.2), and below them the share of maskable entries each
reading leaves personal (``personal_fraction`` of the runs' final ``kind: method`` record). The caption states
Sec. 3.2's claims (s = 2: minimal variation; s = 4: p = 0.50 best) and whether ours hold for each reading.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# this tree's bench, also in a worktree whose venv's editable install points at another checkout: the Fig. 2 runs
# are found through this tree's spec expansion (its runs' exp)
sys.path.insert(0, str(ROOT))

from bench.experiment.plots import STYLE, finished_run, heatmap, save  # noqa: E402
from bench.experiment.spec import load_spec, output_base, paper_numbers  # noqa: E402
from common.verified_io import read_jsonl  # noqa: E402

SPECS = ROOT / "conf" / "paper" / "fedselect"
SPEC, FIG2_SPEC = SPECS / "table1.yaml", SPECS / "fig2.yaml"
#: FedSelect(p) rows: Table 1's ``FedSelect(0.50)``, Fig. 2's ``FedSelect(0.50) compounding | fixed``
P_ROW = re.compile(r"^FedSelect\((?P<p>[0-9.]+)\)(?: (?P<reading>compounding|fixed))?$")


def final_iou(run: Path) -> tuple[int, list[int], list[list[float]]]:
    """(round, clients, IoU matrix) of the last ``head_mask_iou`` record of a FedSelect run."""
    found = [r for r in read_jsonl(run / "rounds.jsonl") if r.get("kind") == "method" and "head_mask_iou" in r]
    if not found:
        raise ValueError(f"{run} has no head_mask_iou records: is it a FedSelect run from this code?")
    last = found[-1]
    return last["round"], last["head_mask_clients"], last["head_mask_iou"]


def fig1(scale: str, seed: int = 0, row: str = "FedSelect(0.50)") -> list[Path]:
    """One IoU heatmap per column (shard setting) of Table 1's ``row``, seed ``seed``."""
    columns = [c["name"] for c in load_spec(SPEC)["columns"]]
    runs = {c: finished_run(SPEC, scale, row, c, seed) for c in columns}
    runs = {c: r for c, r in runs.items() if r is not None}
    if not runs:
        print(f"skipped fig1: no finished {row} run of seed {seed} (make fedselect-table1 SCALE={scale})")
        return []
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(runs), figsize=(3.4 * len(runs) + 0.8, 3.3), layout="constrained")
        axes = [axes] if len(runs) == 1 else list(axes)
        for ax, (column, run) in zip(axes, runs.items(), strict=True):
            round_, clients, iou = final_iou(run)
            labels = [str(c) for c in clients]
            image = heatmap(ax, iou, labels, f"{column}, round {round_}", annotate=len(clients) <= 12)
            ax.set_xlabel("client")
        axes[0].set_ylabel("client")
        fig.colorbar(image, ax=axes, fraction=0.03)
        stand_in = " (mini stand-in)" if scale == "mini" else ""
        fig.suptitle(f"IoU of the clients' final-layer masks, {row}, seed {seed}{stand_in}")
        return save(fig, output_base("fedselect", "figures", scale) / "fig1_mask_iou")


def parse_row(name: str) -> tuple[float, str] | None:
    """(p, reading) of a Fig. 2 row ``FedSelect(0.25) fixed``; None for any other row."""
    match = P_ROW.match(name)
    return (float(match["p"]), match["reading"]) if match and match["reading"] else None


def final_personal_fraction(run: Path) -> float:
    """``personal_fraction`` of the last ``kind: method`` record of a FedSelect run (its final round)."""
    found = [r for r in read_jsonl(run / "rounds.jsonl") if r.get("kind") == "method" and "personal_fraction" in r]
    if not found:
        raise ValueError(f"{run} has no personal_fraction records: is it a FedSelect run?")
    return float(found[-1]["personal_fraction"])


def personal_fractions(scale: str, rows: Sequence[str], columns: Sequence[str]) -> dict[tuple[str, str], float]:
    """(row, column) -> mean final personal fraction over the finished seeds of that Fig. 2 cell."""
    spec = load_spec(FIG2_SPEC)
    seeds = spec.get("scales", {}).get(scale, {}).get("seeds", spec["seeds"])
    out = {}
    for row in rows:
        for column in columns:
            runs = [finished_run(FIG2_SPEC, scale, row, column, seed) for seed in seeds]
            values = [final_personal_fraction(run) for run in runs if run is not None]
            if values:
                out[(row, column)] = sum(values) / len(values)
    return out


def paper_curve(scale: str) -> dict[tuple[float, str], float]:
    """(p, column) -> the paper's Table 1 FedSelect(p) accuracy, which its Fig. 2 plots (Sec. 3.2 quotes them)."""
    spec = load_spec(SPEC)
    return {(float(P_ROW.match(row)["p"]), column): mean
            for (row, column), (mean, _, _) in paper_numbers(spec, scale).items() if P_ROW.match(row)}


def claims(frame: pd.DataFrame) -> list[str]:
    """Sec. 3.2's claims against ours, one line per column: on s = 2 "minimal variation" in accuracy over p (the
    paper's spread of Table 1's three values), on s = 4 p = 0.50 above both p = 0.25 and p = 0.75; ``frame`` has
    columns column, reading, p, mean, std (and paper_mean for the paper's own numbers). The margin of the best p
    over the next is compared with the largest std over seeds of that reading's points."""
    lines = []
    for column, sub in frame.groupby("column", sort=False):
        paper = sub.drop_duplicates("p").set_index("p")["paper_mean"].dropna()
        best_middle = column.endswith("s=4")
        parts = []
        for reading, curve in sub.groupby("reading", sort=False):
            means, noise = curve.set_index("p")["mean"], float(curve["std"].fillna(0).max())
            if best_middle:
                best = means.idxmax()
                margin = means[best] - means.drop(best).max()
                holds = "holds" if best == 0.5 else "does not hold"
                within = "within" if margin < noise else "beyond"
                parts.append(f"{reading}: best p = {best:.2f} by {margin:.1f} points, {within} the std of "
                             f"{noise:.1f} ({holds})")
            else:
                spread = means.max() - means.min()
                limit = paper.max() - paper.min() if len(paper) else float("nan")
                holds = spread <= limit
                parts.append(f"{reading}: spread {spread:.1f} points ({'holds' if holds else 'does not hold'})")
        if best_middle:
            claim = "paper: p = 0.50 best, 0.25 and 0.75 slightly worse"
        else:
            claim = f"paper: minimal variation over p (spread {paper.max() - paper.min():.1f} points)"
        lines.append(f"{column}: {claim}; ours, " + "; ".join(parts))
    return lines


def fig2(scale: str) -> list[Path]:
    """Accuracy against p (mean ± std over seeds) per reading of p with the paper's curve, and the final personal
    fraction each reading gives; one column of panels per shard setting."""
    path = output_base("fedselect", "fig2", scale).with_suffix(".csv")
    if not path.exists():
        print(f"skipped fig2: {path} not found (make fedselect-fig2 SCALE={scale})")
        return []
    frame = pd.read_csv(path)
    parsed = frame["method"].map(parse_row)
    frame = frame[parsed.notna()].assign(p=parsed.dropna().map(lambda t: t[0]),
                                         reading=parsed.dropna().map(lambda t: t[1]))
    frame = frame[frame["mean"].notna()].sort_values(["reading", "p"])
    columns = list(dict.fromkeys(frame["column"]))
    paper = paper_curve(scale)
    frame["paper_mean"] = [paper.get((p, c)) for p, c in zip(frame["p"], frame["column"], strict=True)]
    fractions = personal_fractions(scale, list(dict.fromkeys(frame["method"])), columns)
    frame["personal_fraction"] = [fractions.get((m, c)) for m, c in zip(frame["method"], frame["column"], strict=True)]
    caption = claims(frame)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(2, len(columns), figsize=(3.6 * len(columns), 5.6), layout="constrained",
                                 squeeze=False, sharex=True, height_ratios=[3, 2])
        for i, column in enumerate(columns):
            acc, share = axes[0][i], axes[1][i]
            sub = frame[frame["column"] == column]
            for reading, curve in sub.groupby("reading", sort=False):
                acc.errorbar(curve["p"], curve["mean"], yerr=curve["std"].fillna(0), marker="o", capsize=3,
                             label=f"ours, {reading}")
                known = curve[curve["personal_fraction"].notna()]
                share.plot(known["p"], 100 * known["personal_fraction"].astype(float), marker="o", label=reading)
            papers = sub.drop_duplicates("p").dropna(subset=["paper_mean"])
            if len(papers):
                acc.plot(papers["p"], papers["paper_mean"], "s--", color="grey", label="paper (Table 1)")
            acc.set_title(column + (" (mini stand-in)" if scale == "mini" else ""))
            share.set_yscale("log")
            share.set_xticks(sorted(sub["p"].unique()))
            share.set_xlabel("personalization rate p")
        axes[0][0].set_ylabel("mean client test accuracy (%)")
        axes[1][0].set_ylabel("personal entries, final round (%)")
        axes[0][0].legend(fontsize="small")
        axes[1][0].legend(fontsize="small")
        fig.suptitle("FedSelect: accuracy against p, both readings of p (Sec. 3.2)")
        fig.text(0.0, -0.02, "\n".join(caption), ha="left", va="top", fontsize="small", wrap=True)
        base = output_base("fedselect", "figures", scale) / "fig2_accuracy_vs_p"
        paths = save(fig, base)
    base.with_suffix(".txt").write_text("\n".join(caption) + "\n")
    print("\n".join(caption))
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["fig1", "fig2", "all"])
    parser.add_argument("--scale", default="mini", choices=["mini", "medium", "paper"])
    parser.add_argument("--seed", type=int, default=0, help="fig1: which seed's runs to draw")
    parser.add_argument("--row", default="FedSelect(0.50)", help="fig1: which row of Table 1 (the paper: p = 0.50)")
    args = parser.parse_args(argv)
    paths = []
    if args.figure in ("fig1", "all"):
        paths += fig1(args.scale, args.seed, args.row)
    if args.figure in ("fig2", "all"):
        paths += fig2(args.scale)
    print("\n".join(map(str, paths)))


if __name__ == "__main__":
    main()
