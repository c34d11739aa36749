"""A collected table on the results page: read from its CSV (the cells) and its ``.stats.json`` (the statistics and
the rendered result), shown as HTML with ours (mean ± std, seeds) beside the paper's number and the difference, the
flags of each cell, and the paired differences and Kendall's tau."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.experiment.claims import mark
from bench.experiment.render import MARKS, is_secondary, tau_text
from bench.experiment.result import Result, esc
from bench.experiment.spec import SCALE_FOLDERS

TABLE_COLUMNS = {"method", "column", "mean", "std", "seeds"}


@dataclass(frozen=True)
class Table:
    """One collected table: its files, the frame of its CSV, its ``.md`` and ``.stats.json``."""

    paper: str
    name: str
    scale: str  # "mini" (results/<paper>/), "medium" (.../medium/) or "paper" (.../paper-scale/)
    csv: Path
    frame: pd.DataFrame
    stats: dict[str, Any] | None
    result: Result | None  # the rendered table (its .stats.json's "result"; None in tables written before it)

    @property
    def title(self) -> str:
        return self.result.title if self.result else ""

    @property
    def anchor(self) -> str:
        return anchor(self.paper, SCALE_FOLDERS[self.scale], self.name)


def anchor(*parts: str) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", p).strip("_") for p in parts if p)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def fmt(mean: Any, std: Any = math.nan) -> str:
    """``"12.34 ± 0.56"``, ``"12.34"`` without a std, ``"—"`` without a mean."""
    m, s = _num(mean), _num(std)
    if math.isnan(m):
        return "—"
    return f"{m:.2f}" if math.isnan(s) else f"{m:.2f} ± {s:.2f}"


def is_table_csv(path: Path) -> bool:
    """A CSV written by ``bench.experiment.render.write_table``: a sibling ``.md`` and the long format's columns."""
    if not path.with_suffix(".md").exists():
        return False
    try:
        header = pd.read_csv(path, nrows=0).columns
    except (OSError, ValueError, pd.errors.ParserError):
        return False
    return set(header) >= TABLE_COLUMNS


def read_table(paper: str, csv: Path, scale: str) -> Table:
    frame = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    frame["method"] = frame["method"].astype(str)
    frame["column"] = frame["column"].astype(str)
    stats_path = csv.with_name(csv.stem + ".stats.json")
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else None
    result = Result.from_json(stats["result"]) if stats and stats.get("result") else None
    return Table(paper, csv.stem, scale, csv, frame, stats, result)


def flagged_cells(table: Table) -> tuple[dict[tuple[str, str], str], set[tuple[str, str]]]:
    """(cells not averaged in -> their state, e.g. "failed"; stale cells) of ``table``, from its result."""
    cells = table.result.cells if table.result else {}
    return ({(m, c): state for m, c, state in cells.get("problems", [])},
            {(m, c) for m, c in cells.get("stale", [])})


def table_html(table: Table) -> str:
    """The wide table: per column ours (mean ± std, n), the paper's number and ours minus the paper's."""
    frame = table.frame
    methods = list(dict.fromkeys(frame["method"]))
    columns = list(dict.fromkeys(frame["column"]))
    cells = {(r.method, r.column): r for r in frame.itertuples()}
    has_paper = {c: bool(frame.loc[frame["column"] == c, "paper_mean"].notna().any()) if "paper_mean" in frame
                 else False for c in columns}
    problems, stale = flagged_cells(table)
    top = ['<th class="m" rowspan="2">method</th>'] + [
        f'<th colspan="{3 if has_paper[c] else 1}">{esc(c)}</th>' for c in columns]
    sub = []
    for c in columns:
        sub += ["<th>ours</th>"] + (["<th>paper</th>", "<th>Δ</th>"] if has_paper[c] else [])
    out = [f'<div class="scroll"><table class="results" id="{esc(table.anchor)}-table">',
           f"<thead><tr>{''.join(top)}</tr><tr>{''.join(sub)}</tr></thead><tbody>"]
    for method in methods:
        tds = [f'<td class="m">{esc(method)}</td>']
        for c in columns:
            r = cells.get((method, c))
            mean, std = (getattr(r, "mean", math.nan), getattr(r, "std", math.nan)) if r is not None else (math.nan,
                                                                                                           math.nan)
            seeds = int(_num(getattr(r, "seeds", 0)) or 0) if r is not None else 0
            classes, flags = [], ""
            ours = fmt(mean, std)
            if (method, c) in problems:
                state = problems[(method, c)]
                classes.append("missing")
                flags += f' <span class="flag" title="not averaged in: {esc(state)}">✗</span>'
                if math.isnan(_num(mean)):
                    ours = state
            beyond = r is not None and str(getattr(r, "beyond_2std", "")).lower() == "true"
            if beyond and table.scale == "paper":
                classes.append("beyond")
                flags += ' <span class="flag" title="beyond two of our standard deviations">⚑</span>'
            if (method, c) in stale:
                classes.append("stale")
                flags += ' <span class="flag" title="computed by other code than this tree">‡</span>'
            n = f'<span class="n">n={seeds}</span>' if seeds else ""
            cls = f' class="{" ".join(classes)}"' if classes else ""
            tds.append(f"<td{cls}>{esc(ours)}{n}{flags}</td>")
            if has_paper[c]:
                paper = (getattr(r, "paper_mean", math.nan), getattr(r, "paper_std", math.nan)) if r is not None \
                    else (math.nan, math.nan)
                source = getattr(r, "paper_source", "") if r is not None else ""
                title = f' title="source: {esc(source)}"' if isinstance(source, str) and source else ""
                mark = " §" if is_secondary(source) else ""
                diff = _num(getattr(r, "diff", math.nan)) if r is not None else math.nan
                tds.append(f'<td class="paper"{title}>{esc(fmt(*paper))}{mark}</td>')
                tds.append(f'<td class="diff">{"" if math.isnan(diff) else esc(f"{diff:+.2f}")}</td>')
        out.append(f"<tr>{''.join(tds)}</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def paired_cell(p: dict[str, Any]) -> str:
    """``+1.20 [-0.50, +2.90] (paper +0.80) ✓``: ours, its t-interval, the paper's difference and whether the
    signs agree (✗! opposite beyond noise); missing parts (JSON null) are left out."""
    low, high, paper = _num(p.get("ci_low")), _num(p.get("ci_high")), _num(p.get("paper_diff"))
    interval = "" if math.isnan(low) or math.isnan(high) else f" [{low:+.2f}, {high:+.2f}]"
    return (f"{_num(p.get('mean_diff')):+.2f}{interval}" + ("" if math.isnan(paper) else f" (paper {paper:+.2f})")
            + mark(p))


def comparisons_html(stats: dict[str, Any]) -> str:
    """The paired differences over seeds and Kendall's tau against the paper's ordering (``.stats.json``).
    ``paired`` holds one entry per column (``best_other``: the best other row) or, in newer tables, one per
    column and other row (``other``; ``best_other`` set on the best one), then shown as a table too."""
    out = []
    paired = stats.get("paired") or []
    best = [p for p in paired if p.get("best_other")]
    if best:
        row = best[0]["row"]
        out.append(f"<p>Paired difference over seeds (same seed = same partition and initialisation), "
                   f"{esc(row)} minus the best other row of the column:</p><ul>")
        for p in best:
            spread = "" if math.isnan(_num(p.get("std_diff"))) else f" ± {_num(p['std_diff']):.2f}"
            out.append(f"<li class=\"paired\">{esc(p['column'])}: {esc(row)} − {esc(p.get('other') or p['best_other'])}"
                       f" = {_num(p['mean_diff']):+.2f}{spread} over {esc(p['seeds'])} seeds ({esc(row)} higher in "
                       f"{esc(p['higher_in'])} of {esc(p['seeds'])})</li>")
        out.append("</ul>")
        every = [p for p in paired if p.get("other")]
        if every:
            columns = list(dict.fromkeys(str(p["column"]) for p in every))
            others = list(dict.fromkeys(str(p["other"]) for p in every))
            cells = {(str(p["other"]), str(p["column"])): paired_cell(p) for p in every}
            level = round(100 * _num(every[0].get("confidence", 0.95)))
            out.append(f"<p>{esc(row)} minus each other row, mean of the paired differences [{level}% t-interval] "
                       f"(the paper's difference); {esc(MARKS)}:</p>")
            out.append('<div class="scroll"><table class="paired"><thead><tr>'
                       f'<th class="m">{esc(row)} minus</th>' + "".join(f"<th>{esc(c)}</th>" for c in columns)
                       + "</tr></thead><tbody>" + "".join(
                           f'<tr><td class="m">{esc(o)}</td>'
                           + "".join(f"<td>{esc(cells.get((o, c), ''))}</td>" for c in columns) + "</tr>"
                           for o in others) + "</tbody></table></div>")
    ordering = stats.get("ordering") or []
    if ordering:
        out.append("<p>Ordering of the rows against the paper's (Kendall's τ over the rows with both numbers; "
                   "1 = same order, −1 = reversed):</p><ul>")
        for o in ordering:
            out.append(f"<li class=\"tau\">{esc(o['column'])}: {esc(tau_text({**o, 'tau': _num(o.get('tau'))}))} "
                       f"over {esc(o['rows'])} rows; best here {esc(o['ours_best'])}, in the paper "
                       f"{esc(o['paper_best'])}</li>")
        out.append("</ul>")
    return "".join(out)
