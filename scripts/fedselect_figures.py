"""FedSelect Figures 1 and 2 from run records (PNG + PDF under results/fedselect/figures/).

    python scripts/fedselect_figures.py fig1 [--scale mini] [--seed 0] [--row "FedSelect(0.50)"]
    python scripts/fedselect_figures.py fig2 [--scale mini]
    python scripts/fedselect_figures.py all [--scale mini]      # every figure whose runs exist (make plots)

Fig. 1: intersection over union of every pair of clients' personal masks on the final linear layer (p = 0.50),
one heatmap per shard setting (s = 2, s = 4), from the ``head_mask_iou`` that FedSelect records every round
(the final round is drawn). Fig. 2: mean test accuracy against the personalization rate p, per shard setting,
from the FedSelect(p) rows of Table 1 (``results/fedselect/table1.csv``: mean ± std over seeds), with the
paper's Table 1 values for the same p beside ours (the paper's Fig. 2 plots those runs).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.core.records import read_jsonl  # noqa: E402
from bench.plots import STYLE, finished_run, heatmap, save  # noqa: E402
from bench.spec import load_spec, output_base  # noqa: E402

SPEC = Path(__file__).resolve().parent.parent / "conf" / "paper" / "fedselect" / "table1.yaml"
P_ROW = re.compile(r"^FedSelect\((?P<p>[0-9.]+)\)$")


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


def fig2(scale: str) -> list[Path]:
    """Mean test accuracy (± std over seeds) against p, one panel per column, the paper's Table 1 beside it."""
    path = output_base("fedselect", "table1", scale).with_suffix(".csv")
    if not path.exists():
        print(f"skipped fig2: {path} not found (make fedselect-table1 SCALE={scale})")
        return []
    frame = pd.read_csv(path)
    frame["p"] = frame["method"].map(lambda m: float(P_ROW.match(m)["p"]) if P_ROW.match(m) else None)
    frame = frame[frame["p"].notna()].sort_values("p")
    columns = list(dict.fromkeys(frame["column"]))
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns), 2.8), layout="constrained")
        axes = [axes] if len(columns) == 1 else list(axes)
        for ax, column in zip(axes, columns, strict=True):
            sub = frame[frame["column"] == column]
            ax.errorbar(sub["p"], sub["mean"], yerr=sub["std"].fillna(0), marker="o", capsize=3, label="ours")
            if sub["paper_mean"].notna().any():
                ax.plot(sub["p"], sub["paper_mean"], "s--", color="grey", label="paper (Table 1)")
            ax.set_xticks(sub["p"])
            ax.set_xlabel("personalization rate p")
            ax.set_title(column + (" (mini stand-in)" if scale == "mini" else ""))
        axes[0].set_ylabel("mean client test accuracy (%)")
        axes[0].legend()
        return save(fig, output_base("fedselect", "figures", scale) / "fig2_accuracy_vs_p")


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
