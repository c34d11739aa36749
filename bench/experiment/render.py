"""A collected paper table as a :class:`bench.experiment.result.Result` (ours, mean ± std, beside the paper's number;
the paired comparisons, Kendall's tau, metrics, the cells not averaged in), written as Markdown, LaTeX, CSV and
``.stats.json`` (the statistics, and the result under ``"result"``, which the results page renders).

``python -m bench.experiment.render <spec.yaml> [--scale mini] [--results results]`` re-renders a written table's
Markdown and LaTeX from its CSV and ``.stats.json`` alone (after a change to the rendering, when the runs are gone)."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench.experiment.claims import annotate_collected, mark, precondition_names
from bench.experiment.result import (
    Block,
    Result,
    bullets,
    frame_grid,
    paragraph,
    to_latex,
    to_markdown,
)
from bench.experiment.spec import (
    SCALES,
    label,
    load_spec,
    measured_datasets,
    output_base,
    scale_block,
    scale_columns,
    unmeasured_columns,
)
from common.verified_io import atomic_write_text
from common.verified_io import json_safe as _json_safe


def _fmt(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "—"
    return f"{mean:.2f}" if math.isnan(std) else f"{mean:.2f} ± {std:.2f}"


def is_secondary(source: Any) -> bool:
    """Whether a paper number's source (``paper_tables.csv``'s ``source``) is a secondary one, e.g.
    ``secondary-unverified``: a transcription not checked against the paper's text. Such numbers are marked §
    wherever they appear."""
    return isinstance(source, str) and source.startswith("secondary")


def secondary_sources(frame: pd.DataFrame) -> list[str]:
    """The secondary sources of the paper's numbers in ``frame`` (marked §)."""
    if "paper_source" not in frame:
        return []
    return sorted({s for s in frame["paper_source"] if is_secondary(s)})


def wide_table(frame: pd.DataFrame, scale: str) -> pd.DataFrame:
    """One row per method; per column, ours (mean ± std) and the paper's number side by side."""
    wide: dict[str, dict[str, str]] = {}
    stale = {tuple(cell) for cell in frame.attrs.get("stale_cells", [])}
    for r in frame.itertuples():
        cells = wide.setdefault(r.method, {})
        flag = " ⚑" if r.beyond_2std and scale == "paper" else ""
        flag += " ‡" if (r.method, r.column) in stale else ""
        ours = ("diverged" if [r.method, r.column] in frame.attrs.get("diverged_cells", [])
                else "did not train" if [r.method, r.column] in frame.attrs.get("untrained_cells", [])
                else _fmt(r.mean, r.std))
        cells[f"{r.column} (ours)"] = ours + flag
        secondary = is_secondary(getattr(r, "paper_source", "")) and not math.isnan(r.paper_mean)
        cells[f"{r.column} (paper)"] = _fmt(r.paper_mean, r.paper_std) + (" §" if secondary else "")
    table = pd.DataFrame.from_dict(wide, orient="index")
    table.index.name = "method"
    empty = [c for c in table.columns if c.endswith(" (paper)") and (table[c] == "—").all()]
    return table.drop(columns=empty)  # e.g. figures, whose values the paper only plots


def title(spec: dict[str, Any], scale: str) -> str:
    suffix = {"mini": " (mini-scale stand-in)", "medium": " (medium scale)"}.get(scale, "")
    return f"{spec['paper']} {label(spec)}: {spec.get('title', '')}" + suffix


def has_paper_numbers(frame: pd.DataFrame) -> bool:
    """Whether any cell of a collected table has a published number beside it."""
    return bool(frame["paper_mean"].notna().any())


def sample_sizes(frame: pd.DataFrame) -> str:
    """" Each cell: 3 seeds; 797-1000 test images per client." from the collected frame's attributes."""
    seeds, images = frame.attrs.get("seeds", []), frame.attrs.get("test_images", [])
    text = ""
    if seeds:
        text += f" Each cell: {seeds[0]} seeds" if len(seeds) == 1 else f" Cells have {seeds[0]}-{seeds[-1]} seeds"
        text += ";" if images else "."
    if images:
        count = f"{images[0]}" if images[0] == images[1] else f"{images[0]}-{images[1]}"
        text += f" {count} test images per client."
    return text


def caption(spec: dict[str, Any], scale: str, has_paper: bool = True, frame: pd.DataFrame | None = None) -> list[str]:
    proto = spec["protocol"]
    lines = []
    if scale == "mini":
        lines += ["**Mini-scale stand-in**: embedded data sets in place of the paper's, fewer clients and rounds, "
                  "a small model. The paper's columns are shown for orientation only; numbers are not comparable."]
    if scale == "medium":
        lines += ["**Medium scale**: real data with the paper's data protocol and fewer rounds (the spec's "
                  "scales.medium); closer to the paper than the mini stand-in, but not the paper's budget."]
    block = scale_block(spec, scale)
    used = {c["dataset"] for c in scale_columns(spec, scale)} if "columns" in spec else set()
    swapped = {k: v for k, v in block.get("datasets", {}).items() if k in used and k != v}
    if swapped or block.get("model"):
        lines += ["Here: " + "; ".join([*(f"{k} → {v}" for k, v in sorted(swapped.items())),
                                         *([f"model {block['model']}"] if block.get("model") else [])]) + "."]
    protocol = (f"Protocol: stage={proto['stage']}, selection={proto['selection']}, weighting={proto['weighting']}; "
                "mean ± std over seeds (per-cell seed counts in the CSV)."
                + (sample_sizes(frame) if frame is not None else ""))
    unchecked = frame.attrs.get("unchecked_runs", 0) if frame is not None else 0
    if unchecked:
        protocol += (f" {unchecked} runs were not checked against chance (no partition report or final evaluation, "
                     "or eval.chance_z=null): a cell at chance among them would show as a number.")
    rows = frame.attrs.get("row_protocols", {}) if frame is not None else {}
    if rows:
        protocol += " Rows scored differently or after fine-tuning: " + "; ".join(
            f"{row}: {text}" for row, text in rows.items()) + "."
    notes = list(spec.get("notes") or [])  # the spec's own caption lines (e.g. where the code overrides the text)
    notes += width_caption(frame.attrs.get("widths", []) if frame is not None else [])
    lines += measured_note(spec, scale)
    if not has_paper:
        return [*lines, protocol, *notes]
    lines += [protocol + " (paper) columns are the published numbers" + (
        "; ⚑ marks a difference above two of our standard deviations." if scale == "paper" else ".")]
    secondary = secondary_sources(frame) if frame is not None else []
    if secondary:
        lines += [f"§ The paper's number comes from a secondary source ({', '.join(secondary)}), not from the "
                  "paper's text: a transcription that has not been checked against the paper."]
    return [*lines, *notes]


def width_caption(widths: Sequence[dict[str, Any]]) -> list[str]:
    """Two caption lines from ``frame.attrs["widths"]`` (:func:`bench.experiment.collect.width_statistics`): per group
    of columns with the same numbers, each row's mean p^2 and widest width; then which rule sized each row."""
    if not widths:
        return []
    columns: dict[str, dict[str, tuple[float, float]]] = {}
    for w in widths:
        columns.setdefault(w["column"], {})[w["row"]] = (w["mean_p2"], w["widest"])
    groups: dict[tuple, list[str]] = {}
    for column, rows in columns.items():
        groups.setdefault(tuple(rows.items()), []).append(column)
    parts = []
    for rows, names in groups.items():
        if all(p2 == 1 and widest == 1 for _, (p2, widest) in rows):
            parts.append(f"{', '.join(names)}: every client of every row at full width")
        else:
            parts.append(f"{', '.join(names)}: "
                         + ", ".join(f"{row} {p2:.3f} / {widest:g}" for row, (p2, widest) in rows))
    rules: dict[str, list[str]] = {}
    for w in widths:
        if w["row"] not in rules.setdefault(w["rule"], []):
            rules[w["rule"]].append(w["row"])
    return ["Client model sizes from the runs' records, mean p² over clients and seeds / widest width p (p² is "
            "the share of the full model a client trains; pFedGate's is its sparsity): " + "; ".join(parts) + ".",
            "Sized by: " + "; ".join(f"{', '.join(rows)}: {rule}" for rule, rows in rules.items()) + "."]


def measured_note(spec: dict[str, Any], scale: str) -> list[str]:
    """The caption line saying which columns are compared with the paper (its numbers, Kendall's tau and the
    sign marks): those whose stand-in the spec declares to measure the paper's question (``measures_paper``)."""
    measured = measured_datasets(spec, scale)
    if measured is None:
        return []
    swapped = scale_block(spec, scale).get("datasets", {})
    declared = ", ".join(f"{d} (stand-in {swapped.get(d, d)})" for d in sorted(measured)) or "none"
    line = (f"Compared with the paper (its numbers, Kendall's τ, ✓/✗) only where the stand-in is declared to "
            f"measure the paper's question (the spec's scales.{scale}.measures_paper): {declared}.")
    unmeasured = unmeasured_columns(spec, scale)
    if unmeasured:
        line += f" Our numbers only, not compared: {', '.join(unmeasured)}."
    return [line]


#: what the marks of a paired difference mean (docs/claims.md)
MARKS = ("✓ same sign as the paper and a size within the ledger's factor, ✗ opposite sign, ✗! opposite sign beyond "
         "noise (the interval excludes zero); no mark where the column cannot test the paper's claim (the failed "
         "precondition is named: stand-in, headroom, unconverged, inert, baseline suspect) or the sign agrees but "
         "not the size (sign only)")


def tau_text(o: dict[str, Any]) -> str:
    """Kendall's tau of a column, or why the column cannot test the paper's ordering."""
    if o.get("untestable"):
        return f"τ not shown (cannot test: {precondition_names(o['untestable'])})"
    return "τ = n/a" if o["tau"] is None or math.isnan(o["tau"]) else f"τ = {o['tau']:+.2f}"


def _paired_cell(p: dict[str, Any]) -> str:
    interval = "" if math.isnan(p["ci_low"]) else f" [{p['ci_low']:+.2f}, {p['ci_high']:+.2f}]"
    paper = "" if math.isnan(p["paper_diff"]) else f" (paper {p['paper_diff']:+.2f})"
    return f"{p['mean_diff']:+.2f}{interval}{paper}{mark(p)}"


def comparisons(frame: pd.DataFrame) -> list[Block]:
    """The spec's ``compare`` row against the best other row and against every other row (paired over seeds, with
    a confidence interval and the paper's sign), and Kendall's tau between our ordering of the rows and the
    paper's (``bench.experiment.collect``)."""
    blocks = []
    paired = frame.attrs.get("paired", [])
    best = [p for p in paired if p.get("best_other")]
    if best:
        row = best[0]["row"]
        items = []
        for p in best:
            spread = "" if math.isnan(p["std_diff"]) else f" ± {p['std_diff']:.2f}"
            items.append(f"{p['column']}: {row} − {p['other']} = {p['mean_diff']:+.2f}{spread} "
                         f"over {p['seeds']} seeds ({row} higher in {p['higher_in']} of {p['seeds']})")
        blocks.append(bullets(items, "Paired difference over seeds (same seed = same partition and initialisation), "
                                     f"{row} minus the best other row of the column:", "paired"))
        columns = list(dict.fromkeys(p["column"] for p in paired))
        others = list(dict.fromkeys(p["other"] for p in paired))
        cells = {(p["other"], p["column"]): _paired_cell(p) for p in paired}
        table = pd.DataFrame([[cells.get((o, c), "") for c in columns] for o in others], index=others,
                             columns=columns)
        table.index.name = f"{row} minus"
        level = round(100 * paired[0]["confidence"])
        blocks += [paragraph(f"{row} minus each other row, mean of the paired differences [{level}% t-interval] "
                             f"(the paper's difference); {MARKS}:", "paired"), frame_grid(table, "paired")]
    ordering = frame.attrs.get("ordering", [])
    if ordering:
        blocks.append(bullets([f"{o['column']}: {tau_text(o)} over {o['rows']} rows; best here "
                               f"{o['ours_best']}, in the paper {o['paper_best']}" for o in ordering],
                              "Ordering of the rows against the paper's (Kendall's τ over the rows with both "
                              "numbers; 1 = same order, −1 = reversed):", "ordering"))
    return blocks


def metric_tables(frame: pd.DataFrame) -> list[Block]:
    """Per metric the spec names (``metrics:``), its final-round value per row and column, mean over the runs that
    record it (``summary.json``'s ``final_metrics``)."""
    blocks = []
    for name, entries in frame.attrs.get("metrics", {}).items():
        if not entries:
            continue
        table = pd.DataFrame(entries).pivot(index="row", columns="column", values="mean")
        order = list(dict.fromkeys(e["row"] for e in entries))
        table = table.loc[order, list(dict.fromkeys(e["column"] for e in entries))].map(lambda v: f"{v:.4g}")
        table.index.name = "method"
        blocks += [paragraph(f"`{name}` at the final round (the method's own record; mean over seeds):", "metrics"),
                   frame_grid(table, "metrics")]
    return blocks


def flagged_cells(frame: pd.DataFrame, problems: Sequence[str]) -> dict[str, list[list[str]]]:
    """The cells a reader marks: not averaged in (with the state the problem line or the cell names: failed,
    missing, diverged, ...) and stale (computed by other code than this tree), as ``Result.cells``."""
    pairs = list(dict.fromkeys((str(m), str(c)) for m, c in zip(frame["method"], frame["column"], strict=True)))
    states: dict[tuple[str, str], str] = {}
    for line in problems:
        for method, column in pairs:
            hit = re.match(rf"^([A-Za-z ]+): {re.escape(method)} \| {re.escape(column)}(?=:| \|)", line)
            if hit:
                states.setdefault((method, column), hit.group(1))
    for key, state in (("diverged_cells", "diverged"), ("untrained_cells", "did not train")):
        for method, column in frame.attrs.get(key, []):
            states.setdefault((method, column), state)
    stale = {(m, c) for line in frame.attrs.get("stale", []) for m, c in pairs if line.startswith(f"{m} | {c}:")}
    stale |= {(m, c) for m, c in frame.attrs.get("stale_cells", [])}
    return {"problems": [[m, c, s] for (m, c), s in states.items()], "stale": [[m, c] for m, c in sorted(stale)]}


def search_budget(spec: dict[str, Any], scale: str) -> list[str]:
    """The search the rows' records come from: the spec's budget when every row was searched over the same number
    of points (``searched``, from ``<table>.tuning.json``), else each row's count, named as unequal."""
    from bench.experiment.tuning import budget_lines, searched_points

    searched = searched_points(spec)
    if len(set(searched.values())) == 1:
        return budget_lines(spec, scale)
    return ["Unequal search (the records come from a search that gave rows different budgets): "
            + ", ".join(f"{row} {n} point{'s' * (n != 1)}" for row, n in searched.items())]


def result(spec: dict[str, Any], scale: str, frame: pd.DataFrame, problems: Sequence[str]) -> Result:
    """The table as a result: ours (mean ± std) and the paper's number side by side, per column, then the
    comparisons, metrics, tuned points, the cells not averaged in and the stale ones."""
    blocks = [frame_grid(wide_table(frame, scale), "table"), *comparisons(frame), *metric_tables(frame)]
    tuned = [f"{row['name']} | {column}: {', '.join(point)}" for row in spec["rows"]
             for column, point in row.get("tuned", {}).items()]
    if tuned:
        blocks.append(bullets([*search_budget(spec, scale), *tuned],
                              f"Tuned on the clients' validation split ({label(spec)}.tuning.md):", "tuned"))
    if problems:
        blocks.append(bullets(problems, "Not averaged in (missing, failed, diverged, did not train, or partial runs):",
                              "problems"))
    if frame.attrs.get("stale"):
        blocks.append(bullets(frame.attrs["stale"], "‡ Averaged in, but computed by other code than this tree "
                                                    "(`--rerun-stale` reruns them):", "stale"))
    return Result(title(spec, scale), caption(spec, scale, has_paper_numbers(frame), frame), blocks,
                  flagged_cells(frame, problems))


def render(spec: dict[str, Any], scale: str, frame: pd.DataFrame, problems: list[str]) -> str:
    """Markdown: ours (mean ± std) and the paper's number side by side, per column."""
    return to_markdown(result(spec, scale, frame, problems))


def write_markdown_and_latex(spec: dict[str, Any], scale: str, frame: pd.DataFrame, problems: list[str],
                             base: Path) -> Result:
    """``<base>.md`` and ``<base>.tex`` of a collected table, each written atomically; returns the result."""
    table = result(spec, scale, frame, problems)
    atomic_write_text(base.with_suffix(".md"), to_markdown(table))
    atomic_write_text(base.with_suffix(".tex"), to_latex(table, table.of_kind("table")[0], problems))
    return table


def statistics(frame: pd.DataFrame, table: Result) -> dict[str, Any]:
    """The ``.stats.json`` of a table: its statistics (seeds, test images, paired differences, Kendall's tau,
    row protocols, unchecked runs, metrics, widths) and the rendered result (``"result"``)."""
    stats = {key: frame.attrs.get(key, []) for key in ("seeds", "test_images", "paired", "ordering")}
    stats["row_protocols"] = frame.attrs.get("row_protocols", {})
    stats["unchecked_runs"] = frame.attrs.get("unchecked_runs", 0)
    stats["metrics"] = frame.attrs.get("metrics", {})
    stats["widths"] = frame.attrs.get("widths", [])
    stats["result"] = table.as_json()
    return stats


def write_table(spec: dict[str, Any], scale: str, frame: pd.DataFrame, problems: list[str],
                results_dir: str | os.PathLike = "results") -> Path:
    """Markdown, LaTeX and CSV side by side (each written atomically); returns the Markdown path."""
    base = output_base(spec["paper"], label(spec), scale, results_dir)
    table = write_markdown_and_latex(spec, scale, frame, problems, base)
    atomic_write_text(base.with_suffix(".csv"), frame.to_csv(index=False))
    write_statistics(base, statistics(frame, table))
    return base.with_suffix(".md")


def write_statistics(base: Path, stats: dict[str, Any]) -> None:
    atomic_write_text(base.with_suffix(".stats.json"), json.dumps(_json_safe(stats), indent=1, allow_nan=False))


#: numbers of the stats file that JSON stores as null when they are NaN
_NUMERIC_STATS = ("mean_diff", "std_diff", "ci_low", "ci_high", "paper_diff", "tau")


def rerender(spec: dict[str, Any], scale: str, results_dir: str | os.PathLike = "results") -> Path:
    """Rewrite the Markdown and LaTeX of a table that ``write_table`` wrote, from its CSV and ``.stats.json``, and
    the result in its ``.stats.json`` (its statistics kept as they are, marks gated by
    :func:`~bench.experiment.claims.annotate_collected`); returns the Markdown path. A table with
    stale, diverged or unaveraged cells cannot be: those marks live in the runs, not the CSV
    (``python -m bench.experiment.table`` re-collects it)."""
    base = output_base(spec["paper"], label(spec), scale, results_dir)
    if not base.with_suffix(".csv").exists():
        raise FileNotFoundError(f"{base.with_suffix('.csv')} does not exist: write the table first "
                                f"(python -m bench.experiment.table <spec> --scale {scale})")
    stats = json.loads(base.with_suffix(".stats.json").read_text()) if base.with_suffix(".stats.json").exists() \
        else {}
    if stats.get("result"):
        cells = Result.from_json(stats["result"]).cells
        flagged = bool(cells.get("problems") or cells.get("stale"))
    else:  # written before tables kept their result: its marks are in its Markdown only
        old = base.with_suffix(".md").read_text() if base.with_suffix(".md").exists() else ""
        flagged = "‡" in old or "Not averaged in" in old or "| diverged" in old or "| did not train" in old
    if flagged:
        raise ValueError(f"{base.with_suffix('.md')} has stale, diverged or unaveraged cells, which its CSV does not "
                         "record: re-collect it from the runs with python -m bench.experiment.table instead")
    frame = pd.read_csv(base.with_suffix(".csv"))
    for key, entries in stats.items():
        if key in ("paired", "ordering"):
            entries = [{k: math.nan if k in _NUMERIC_STATS and v is None else v for k, v in e.items()}
                       for e in entries]
        if key != "result":
            frame.attrs[key] = entries
    frame.attrs.update(stale_cells=[], diverged_cells=[], untrained_cells=[], stale=[])
    annotate_collected(spec, scale, frame)  # a table collected before the claims ledger: no unchecked marks
    table = write_markdown_and_latex(spec, scale, frame, [], base)
    gated = {key: frame.attrs[key] for key in ("paired", "ordering") if key in stats}
    write_statistics(base, {**stats, **gated, "result": table.as_json()})
    return base.with_suffix(".md")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="+", help="table specs, e.g. conf/paper/pa3dfl/table1.yaml")
    parser.add_argument("--scale", default="mini", choices=SCALES)
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    from bench.experiment.tuning import with_tuned

    for path in args.spec:  # the rows' searched values, as the table ran
        print(f"wrote {rerender(with_tuned(load_spec(path), args.scale, args.results), args.scale, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
