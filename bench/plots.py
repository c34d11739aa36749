"""Figures from run records, in one style (PNG and PDF side by side)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.collect import curves  # noqa: E402

STYLE = {"figure.dpi": 120, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
         "axes.spines.right": False, "font.size": 9, "legend.frameon": False}


def save(fig: plt.Figure, path: str | os.PathLike) -> list[Path]:
    """Save ``fig`` as ``path`` with .png and .pdf suffixes; returns both paths."""
    base = str(path).removesuffix(".png").removesuffix(".pdf")
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    out = [Path(base + ext) for ext in (".png", ".pdf")]
    for target in out:
        fig.savefig(target, bbox_inches="tight")
    plt.close(fig)
    return out


def learning_curves(
    groups: Mapping[str, Sequence[Path]], path: str | os.PathLike, *, title: str = "",
    stage: str = "post", ylabel: str = "mean client test accuracy (%)",
) -> list[Path]:
    """One line per group (mean over its runs) with a band of +- one std over runs (seeds)."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(4.2, 3.0))
        for label, runs in groups.items():
            frame = curves(runs, stage=stage)
            if frame.empty:
                continue
            stats = frame.groupby("round")["mean_acc"].agg(["mean", "std"]).fillna(0.0)
            ax.plot(stats.index, stats["mean"], label=label, lw=1.4)
            ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], alpha=0.2)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        ax.legend()
        return save(fig, path)

