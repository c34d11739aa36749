"""Figures from run records, in one style (PNG and PDF side by side).

``python -m bench.experiment.plots [--scale mini] [spec ...]`` draws, for every table spec (default: all of
``conf/paper/*/``) whose runs exist, one learning-curve figure per column: one line per row (method),
mean over seeds with a band of +- one std, into ``results/<paper>/figures/``. Paper-specific figures
(``scripts/<paper>/figures.py``) come on top of these; ``make plots`` runs both.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.experiment.collect import curves  # noqa: E402

STYLE = {"figure.dpi": 120, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
         "axes.spines.right": False, "font.size": 9, "legend.frameon": False}


def save(fig: plt.Figure, path: str | os.PathLike) -> list[Path]:
    """Save ``fig`` as ``path`` with .png and .pdf suffixes; returns both paths."""
    base = str(path).removesuffix(".png").removesuffix(".pdf")
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    out = [Path(base + ext) for ext in (".png", ".pdf")]
    for target in out:  # no creation date in the PDF, so the same figure gives the same bytes
        fig.savefig(target, bbox_inches="tight", metadata={"CreationDate": None} if target.suffix == ".pdf" else None)
    plt.close(fig)
    return out


def write_caption(path: str | os.PathLike, text: str) -> Path:
    """The figure's caption beside it (``<path>.caption.txt``, ``path`` without suffix); the results page shows it."""
    target = Path(str(path).removesuffix(".png").removesuffix(".pdf") + ".caption.txt")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text.rstrip() + "\n")
    return target


def mean_band(ax: plt.Axes, frame: Any, column: str, label: str) -> None:
    """One line: the per-round mean of ``frame[column]`` over its runs, with a band of +- one std (nothing when
    ``frame`` is empty)."""
    if frame.empty:
        return
    stats = frame.groupby("round")[column].agg(["mean", "std"]).fillna(0.0)
    ax.plot(stats.index, stats["mean"], label=label, lw=1.4)
    ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], alpha=0.2)


def learning_curves(
    groups: Mapping[str, Sequence[Path]], path: str | os.PathLike, *, title: str = "",
    stage: str = "post", ylabel: str = "mean client test accuracy (%)",
) -> list[Path]:
    """One line per group (mean over its runs) with a band of +- one std over runs (seeds)."""
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(4.2, 3.0))
        for label, runs in groups.items():
            mean_band(ax, curves(runs, stage=stage), "mean_acc", label)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        ax.legend()
        return save(fig, path)



def diagnostic_frame(run_dirs: Sequence[Path], metric: str) -> Any:
    """Long frame (run_dir, round, value) of a method diagnostic (``kind: method`` records; a list: its mean)."""
    import pandas as pd

    from common.verified_io import read_jsonl

    rows = []
    for run in run_dirs:
        for rec in read_jsonl(Path(run) / "rounds.jsonl"):
            if rec.get("kind") == "method" and metric in rec:
                value = rec[metric]
                value = sum(value) / len(value) if isinstance(value, list) else value
                rows.append({"run_dir": str(run), "round": rec["round"], "value": float(value)})
    return pd.DataFrame(rows)


def mechanism_curves(groups: Mapping[str, tuple[str, str, Sequence[Path]]], path: str | os.PathLike, *,
                     title: str = "") -> list[Path]:
    """Per round, each row's mechanism diagnostic (``conf/claims.yaml`` ``mechanisms``), mean over its runs with a
    band of +- one std: one panel per diagnostic. ``groups``: row -> (metric, what it measures, runs)."""
    panels: dict[tuple[str, str], dict[str, Sequence[Path]]] = {}
    for row, (metric, what, runs) in groups.items():
        panels.setdefault((metric, what), {})[row] = runs
    if not panels:
        return []
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.0), squeeze=False)
        for ax, ((metric, what), rows) in zip(axes[0], panels.items(), strict=True):
            for label, runs in rows.items():
                mean_band(ax, diagnostic_frame(runs, metric), "value", label)
            ax.set_xlabel("round")
            ax.set_ylabel(f"{what} ({metric})")
            ax.legend(fontsize=6)
        if title:
            fig.suptitle(title)
        return save(fig, path)


def heatmap(ax: plt.Axes, matrix: Sequence[Sequence[float]], labels: Sequence[str], title: str,
            vmin: float = 0.0, vmax: float = 1.0, cmap: str = "viridis", annotate: bool = True) -> Any:
    """A square heatmap of ``matrix`` (rows and columns named by ``labels``), each cell's value written in it
    when ``annotate``; returns the image (for a colour bar)."""
    import numpy as np

    values = np.asarray(matrix, dtype=float)
    ax.grid(False)
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_title(title)
    if annotate:
        for (i, j), v in np.ndenumerate(values):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                    color="white" if v < vmin + 0.5 * (vmax - vmin) else "black")
    return image


def finished_run(spec_path: str | os.PathLike, scale: str, row: str, column: str | None = None, seed: int | None = None,
                 out_dir: str = "runs", results_dir: str = "results") -> Path | None:
    """The run directory of one finished cell of a table spec (first column / seed when not given), or None; from
    the table's manifest where it lists the cell (:func:`bench.experiment.manifest.cell_dirs`)."""
    from bench.core.records import RunDir
    from bench.experiment.manifest import cell_dirs
    from bench.experiment.spec import expand, load_spec

    spec = load_spec(spec_path)
    for cell in expand(spec, scale, out_dir=out_dir):
        if cell.row == row and column in (None, cell.column) and seed in (None, cell.seed):
            run = cell_dirs(spec, scale, [cell], results_dir)[cell]  # one at a time: the first finished one ends it
            if RunDir(run).is_complete():
                return run
    return None


def table_curves(spec_path: str | os.PathLike, scale: str, out_dir: str = "runs",
                 results_dir: str = "results") -> list[Path]:
    """Learning curves of one table spec's finished runs, one figure per column."""
    from bench.experiment.spec import load_spec
    from bench.experiment.tuning import with_tuned

    spec = with_tuned(load_spec(spec_path), scale, results_dir)  # the rows' searched values, as the table ran
    return spec_curves(spec, scale, out_dir, results_dir)


def spec_curves(spec: dict[str, Any], scale: str, out_dir: str = "runs", results_dir: str = "results",
                seeds: Sequence[int] | None = None, extra: Sequence[str] = ()) -> list[Path]:
    """Learning curves of a loaded table spec's finished runs (its cells with ``seeds`` and ``extra`` overrides, as
    :func:`bench.experiment.spec.expand` takes them; their directories from the table's manifest where it lists them),
    one figure per column, under ``<results_dir>/<paper>/figures/curves/``."""
    from bench.core.records import RunDir
    from bench.experiment.manifest import cell_dirs
    from bench.experiment.spec import expand, label, output_base, slug

    groups: dict[str, dict[str, list[Path]]] = {}
    for cell, run in cell_dirs(spec, scale, expand(spec, scale, seeds, out_dir, extra), results_dir).items():
        if RunDir(run).is_complete():
            groups.setdefault(cell.column, {}).setdefault(cell.row, []).append(run)
    paths: list[Path] = []
    base = output_base(spec["paper"], "figures", scale, results_dir) / "curves"
    stage = spec["protocol"]["stage"]
    from bench.experiment.claims import thresholds

    rules = thresholds().get("mechanisms") or {}
    for column, rows in groups.items():
        mechanisms = mechanism_metrics(rows, rules)
        title = f"{spec['paper']} {label(spec)}: {column}" + (" (mini stand-in)" if scale == "mini" else "")
        paths += learning_curves(rows, base / f"{label(spec)}_{slug(column)}", title=title, stage=stage)
        diagnosed = {row: (*mechanisms[row], runs) for row, runs in rows.items() if row in mechanisms}
        paths += mechanism_curves(diagnosed, base / f"{label(spec)}_{slug(column)}_mechanisms", title=title)
    return paths


def mechanism_metrics(rows: Mapping[str, Sequence[Path]], rules: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Row -> (diagnostic metric, what it measures) for the rows whose method (read from a run's config) declares a
    mechanism diagnostic in ``rules`` (``conf/claims.yaml``'s ``mechanisms``)."""
    from bench.core.records import run_config

    out = {}
    for row, runs in rows.items():
        method = str(run_config(Path(runs[0])).get("method", {}).get("name")) if runs else None
        if method in rules:
            out[row] = (rules[method]["metric"], rules[method]["what"])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="*", help="table specs (default: every conf/paper/*/table*|fig*.yaml)")
    parser.add_argument("--scale", default="mini", choices=["mini", "medium", "paper"])
    parser.add_argument("--out-dir", default="runs")
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2] / "conf" / "paper"
    specs = args.spec or sorted([*root.glob("*/table*.yaml"), *root.glob("*/fig*.yaml")])
    from bench.experiment.spec import load_spec, scale_block

    for spec in specs:
        if args.scale != "paper" and not scale_block(load_spec(spec), args.scale):
            print(f"{spec}: no {args.scale} scale")  # e.g. FedC2I's tables at medium: nothing to draw
            continue
        paths = table_curves(spec, args.scale, args.out_dir, args.results)
        print(f"{spec}: {len(paths) // 2} figures" + ("" if paths else " (no finished runs yet)"))


if __name__ == "__main__":
    main()
