"""One self-contained static web page of every result: ``results/index.html``.

For each paper folder under ``results/`` (``results/bench`` has no tables; ``results/demo`` is left out: the demo
writes its own page, ``results/demo/index.html``, from its own results tree):

- every table (a ``<name>.csv`` with a sibling ``<name>.md``, at mini scale in the folder itself, at paper scale
  under ``paper-scale/``): ours (mean ± std, seeds) beside the paper's number and the difference, with the flags
  (⚑ beyond two of our stds at paper scale, ‡ stale, ✗ not averaged in), the caption and notes of the ``.md``,
  the paired differences and Kendall's tau from the ``.stats.json`` when there is one, and its provenance;
- every other Markdown page (``results/bench/bench.md``, ``results/pa3dfl/efficiency.md``, tuning reports);
- every figure (``figures/**/*.png``, and PNGs in the folder itself such as the demo's curves), with the caption
  written beside it (``<name>.caption.txt``: the paper's claim and whether ours holds) when there is one.

No server, no network, no framework: inline CSS, images by paths relative to the page, and one small script that
counts images that did not load (``<body data-broken-images>``, read by the headless-browser test).

Command line::

    python -m bench.experiment.report [--results results] [--out results/index.html] [--screenshot]

``--screenshot`` also renders the page in headless Chromium into ``index.png`` beside it.
"""

from __future__ import annotations

import argparse
import html
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from bench.experiment.provenance import cpu_name
from bench.experiment.render import is_secondary
from bench.experiment.spec import SCALE_FOLDERS
from common.verified_io import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
PACKAGES = ("torch", "torchvision", "pandas", "hydra-core", "wandb")
TABLE_COLUMNS = {"method", "column", "mean", "std", "seeds"}
NO_TABLES = {"bench"}  # result folders that hold pages and figures but no paper tables
OWN_PAGE = {"demo"}  # result folders with a page of their own (scripts/demo.py), not shown on the results page
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: blocks of a table's .md that ``bench.experiment.render.comparisons`` wrote (shown from the .stats.json instead)
COMPARISON_BLOCK = re.compile(r"Paired difference|Ordering of the rows|\S.* minus each other row|\|[^|\n]* minus \|")
INSTALL_HINT = "install it with `apt-get install -y chromium` (Debian/Ubuntu, as root)"

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1240px;
padding:0 16px 48px;color:#1d2330;background:#fff}
h1{font-size:24px;margin:20px 0 4px}h2{font-size:20px;border-bottom:2px solid #d7dce5;padding-bottom:3px;
margin-top:36px}h3{font-size:16px;margin:26px 0 6px}h4{font-size:14px;margin:16px 0 4px}
a{color:#1f5fbf;text-decoration:none}a:hover{text-decoration:underline}
.meta,.prov,.caption{color:#4a5261;font-size:12.5px}.caption p{margin:3px 0}
.scroll{overflow-x:auto;margin:6px 0}
table{border-collapse:collapse;font-size:12.5px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d7dce5;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#eef1f6;text-align:center}td.m,th.m{text-align:left;font-weight:600}
td.paper{color:#5a6372;background:#fafbfd}td.diff{color:#5a6372}td.beyond{background:#fff1e6}
td.stale{background:#f7f2ff}td.missing{background:#fdecec;color:#a12a2a}
.n{color:#8a92a0;font-size:11px;margin-left:3px}.flag{color:#c4470c;font-weight:700}
dl.prov{display:grid;grid-template-columns:max-content 1fr;gap:1px 10px;margin:6px 0}
dl.prov dt{font-weight:600}dl.prov dd{margin:0}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:14px}
figure{margin:0;border:1px solid #e3e7ee;padding:6px;border-radius:4px}
figure img{max-width:100%;height:auto;display:block;margin:auto}
figcaption{font-size:11.5px;color:#4a5261;word-break:break-all;margin-top:4px}
figcaption .claim{display:block;word-break:normal;margin-top:3px}
.page{border-left:3px solid #d7dce5;padding-left:12px}code{background:#f1f3f7;padding:0 3px;border-radius:3px}
nav ul{margin:2px 0}nav>ul>li{margin-top:4px}
"""

SCRIPT = """window.addEventListener("load",function(){var i=Array.prototype.slice.call(document.images);
document.body.dataset.images=String(i.length);
document.body.dataset.brokenImages=String(i.filter(function(x){return !x.complete||x.naturalWidth===0}).length);});"""

LEGEND = ("⚑ difference from the paper above two of our standard deviations (paper scale only) · "
          "‡ averaged in, but computed by other code than this tree (stale) · "
          "✗ not averaged in (missing, failed, partial, diverged, did not train or not run) · "
          "§ the paper's number from a secondary source, not the paper's text · n = seeds averaged")


@dataclass(frozen=True)
class Environment:
    """What the page was generated with: the tree's commit, package versions, hardware and the time."""

    commit: str | None
    packages: dict[str, str | None]
    hardware: str
    generated: str


@dataclass
class MarkdownParts:
    """A table's ``.md``: its title, the caption paragraphs above the table and the blocks below it."""

    title: str = ""
    caption: list[str] = field(default_factory=list)
    table: list[list[str]] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Table:
    """One collected table: its files, the frame of its CSV, its ``.md`` and ``.stats.json``."""

    paper: str
    name: str
    scale: str  # "mini" (results/<paper>/), "medium" (.../medium/) or "paper" (.../paper-scale/)
    csv: Path
    frame: pd.DataFrame
    md: MarkdownParts
    stats: dict[str, Any] | None

    @property
    def anchor(self) -> str:
        return anchor(self.paper, SCALE_FOLDERS[self.scale], self.name)


@dataclass(frozen=True)
class Section:
    """One results folder: its tables, its other Markdown pages and its figures."""

    name: str
    tables: list[Table]
    pages: list[Path]
    figures: list[Path]


# --------------------------------------------------------------------------------------------------- helpers


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


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


def natural(path: Path) -> tuple[bool, list[Any]]:
    """Sort key: tables before figures, then by name with numbers as numbers (table2 before table10)."""
    return (not path.name.startswith("table"),
            [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)])


def iso_mtime(path: Path) -> str:
    return datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------- provenance


def git_commit(path: Path) -> str | None:
    """``git rev-parse HEAD`` of the checkout holding ``path``; None if it is not in one (or git is absent)."""
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Python's version and each installed package's (None if it is not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def environment(results: Path) -> Environment:
    model = cpu_name()
    hardware = f"{platform.platform()}, {os.cpu_count()} CPUs" + (f" ({model})" if model else "")
    return Environment(git_commit(results), package_versions(), hardware,
                       datetime.now(UTC).isoformat(timespec="seconds"))


# --------------------------------------------------------------------------------------------------- markdown


def inline(text: str) -> str:
    """Escaped text with ``**bold**`` and ```code``` spans."""
    out = esc(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def split_row(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def is_separator(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", line.strip()))


def pipe_table(lines: Sequence[str]) -> str:
    """An HTML table of Markdown pipe-table lines (the first is the header when a separator line follows it)."""
    head = split_row(lines[0]) if len(lines) > 1 and is_separator(lines[1]) else None
    body = [split_row(line) for line in (lines[2:] if head else lines) if not is_separator(line)]
    out = ['<div class="scroll"><table>']
    if head:
        out.append("<thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr></thead>")
    out.append("<tbody>" + "".join(
        "<tr>" + "".join(f'<td{" class=m" if i == 0 else ""}>{inline(c)}</td>' for i, c in enumerate(row)) + "</tr>"
        for row in body) + "</tbody></table></div>")
    return "".join(out)


def markdown_to_html(text: str) -> str:
    """A small Markdown subset: ATX headings (shifted two levels down), paragraphs, ``-``/``*``/``1.`` lists
    (indented lines continue an item), pipe tables, and ``**bold**`` and ```code``` inline."""
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []
    ordered = False
    rows: list[str] = []

    def flush() -> None:
        nonlocal ordered
        if para:
            out.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()
        if items:
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{inline(i)}</li>" for i in items) + f"</{tag}>")
            items.clear()
        if rows:
            out.append(pipe_table(rows))
            rows.clear()

    for raw in text.splitlines():
        line = raw.rstrip()
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        bullet = re.match(r"^\s{0,3}([-*]|\d+[.)])\s+(.*)$", line)
        if not line.strip():
            flush()
        elif heading:
            flush()
            level = min(len(heading.group(1)) + 2, 6)
            out.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
        elif line.lstrip().startswith("|"):
            if para or items:
                flush()
            rows.append(line)
        elif bullet:
            if para or rows:
                flush()
            ordered = bullet.group(1)[0].isdigit()
            items.append(bullet.group(2))
        elif items and raw[:1].isspace():
            items[-1] += " " + line.strip()
        else:
            if items or rows:
                flush()
            para.append(line.strip())
    flush()
    return "\n".join(out)


def blocks(text: str) -> list[str]:
    """Blank-line separated blocks of ``text``."""
    return [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]


def parse_table_md(text: str) -> MarkdownParts:
    """Split a table's ``.md`` (``bench.experiment.render.render``) into title, caption, table, the lists of cells not
    averaged in and stale cells, and the other blocks below the table."""
    parts = MarkdownParts()
    seen_table = False
    for block in blocks(text):
        lines = block.splitlines()
        if not seen_table and lines[0].startswith("# "):
            parts.title = lines[0][2:].strip()
            lines = lines[1:]
            if not lines:
                continue
            block = "\n".join(lines)
        if not seen_table and lines[0].lstrip().startswith("|"):
            parts.table = [split_row(line) for line in lines if not is_separator(line)]
            seen_table = True
        elif not seen_table:
            parts.caption.append(" ".join(line.strip() for line in lines))
        else:
            items = [line[2:].strip() for line in lines if line.startswith("- ")]
            if lines[0].startswith("Not averaged in"):
                parts.problems += items
            elif lines[0].startswith("‡"):
                parts.stale += items
            parts.after.append(block)
    return parts


# --------------------------------------------------------------------------------------------------- discovery


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
    return Table(paper, csv.stem, scale, csv, frame, parse_table_md(csv.with_suffix(".md").read_text()), stats)


def discover(results: Path, skip: Sequence[Path] = ()) -> list[Section]:
    """Every results folder with its tables, other Markdown pages and figures (folders named ``runs`` and the
    files in ``skip``, e.g. the page itself, are left out, and so are the folders of :data:`OWN_PAGE`).
    ``bench`` comes last."""
    sections = []
    skipped = {p.resolve() for p in skip}
    folders = sorted((p for p in results.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and p.name not in OWN_PAGE),
                     key=lambda p: (p.name in NO_TABLES, p.name))
    for folder in folders:
        tables, table_mds = [], set()
        for scale, where in (("mini", folder), ("medium", folder / "medium"), ("paper", folder / "paper-scale")):
            for csv in sorted(where.glob("*.csv"), key=natural) if folder.name not in NO_TABLES else []:
                if is_table_csv(csv):
                    tables.append(read_table(folder.name, csv, scale))
                    table_mds.add(csv.with_suffix(".md"))
        pages = [p for p in [*sorted(folder.glob("*.md")), *sorted((folder / "medium").glob("*.md")),
                             *sorted((folder / "paper-scale").glob("*.md"))]
                 if p not in table_mds and p.resolve() not in skipped]
        figures = sorted({p for p in [*folder.glob("*.png"), *folder.glob("**/figures/**/*.png")]
                          if "runs" not in p.relative_to(folder).parts and p.resolve() not in skipped})
        if tables or pages or figures:
            sections.append(Section(folder.name, tables, pages, figures))
    return sections


def main_columns(paper: str, name: str, conf_dir: Path = CONF_DIR) -> set[str] | None:
    """The spec's own columns (not per-client ones) of ``conf/paper/<paper>/<name>.yaml`` (or ``conf/<paper>/``);
    None when there is no such spec or it does not load."""
    from bench.experiment.spec import load_spec

    for path in (conf_dir / "paper" / paper / f"{name}.yaml", conf_dir / paper / f"{name}.yaml"):
        if path.exists():
            try:
                return {str(c["name"]) for c in load_spec(path)["columns"]}
            except Exception:  # a spec that no longer loads only costs the per-client split
                return None
    return None


def runs_averaged(table: Table, conf_dir: Path = CONF_DIR) -> int:
    """Sum of ``seeds`` over the table's main cells (per-client columns repeat their column's runs)."""
    frame = table.frame
    columns = main_columns(table.paper, table.name, conf_dir)
    if columns and frame["column"].isin(columns).any():
        frame = frame[frame["column"].isin(columns)]
    return int(pd.to_numeric(frame["seeds"], errors="coerce").fillna(0).sum())


# --------------------------------------------------------------------------------------------------- cells


def flagged_cells(table: Table) -> tuple[dict[tuple[str, str], str], set[tuple[str, str]]]:
    """(cells not averaged in -> the state the ``.md`` lists, e.g. "failed"; stale cells) of ``table``."""
    pairs = {(r.method, r.column) for r in table.frame.itertuples()}
    problems: dict[tuple[str, str], str] = {}
    for line in table.md.problems:
        for method, column in pairs:
            hit = re.match(rf"^([A-Za-z ]+): {re.escape(method)} \| {re.escape(column)}(?=:| \|)", line)
            if hit:
                problems.setdefault((method, column), hit.group(1))
    stale = {(m, c) for line in table.md.stale for m, c in pairs if line.startswith(f"{m} | {c}:")}
    if table.md.table:  # the rendered table marks stale cells (per-client columns too) with ‡
        head = table.md.table[0]
        for row in table.md.table[1:]:
            for name, cell in zip(head[1:], row[1:], strict=False):
                if name.endswith(" (ours)") and "‡" in cell:
                    stale.add((row[0], name.removesuffix(" (ours)")))
                for state in ("diverged", "did not train"):
                    if name.endswith(" (ours)") and cell.startswith(state):
                        problems.setdefault((row[0], name.removesuffix(" (ours)")), state)
    return problems, stale


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
    agrees = p.get("agrees")
    mark = "" if agrees is None else " ✓" if agrees else " ✗!" if p.get("contradicts") else " ✗"
    return f"{_num(p.get('mean_diff')):+.2f}{interval}" + ("" if math.isnan(paper) else f" (paper {paper:+.2f})") + mark


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
                       "(the paper's difference); ✓ same sign as the paper, ✗ opposite sign, ✗! opposite sign "
                       "beyond noise (the interval excludes zero):</p>")
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
            tau = _num(o.get("tau"))
            out.append(f"<li class=\"tau\">{esc(o['column'])}: τ = {'n/a' if math.isnan(tau) else f'{tau:+.2f}'} "
                       f"over {esc(o['rows'])} rows; best here {esc(o['ours_best'])}, in the paper "
                       f"{esc(o['paper_best'])}</li>")
        out.append("</ul>")
    return "".join(out)


def provenance_html(table: Table, env: Environment, conf_dir: Path = CONF_DIR) -> str:
    packages = ", ".join(f"{k} {v or 'not installed'}" for k, v in env.packages.items())
    rows = [("runs averaged", str(runs_averaged(table, conf_dir))),
            ("table written", f"{iso_mtime(table.csv)} ({table.csv.name})")]
    stats = table.stats or {}
    if stats.get("seeds"):
        low, high = stats["seeds"][0], stats["seeds"][-1]
        rows.append(("seeds per cell", str(low) if low == high else f"{low}–{high}"))
    if stats.get("test_images"):
        low, high = stats["test_images"][0], stats["test_images"][-1]
        rows.append(("test images per client", str(low) if low == high else f"{low}–{high}"))
    rows += [("commit", env.commit or "None (not a git checkout)"), ("packages", packages),
             ("hardware", env.hardware)]
    return '<p class="prov table-provenance"><strong>Provenance</strong>: ' + "; ".join(
        f'<span class="{esc(anchor(k))}">{esc(k)}: {esc(v)}</span>' for k, v in rows) + "</p>"


def table_section(table: Table, env: Environment, conf_dir: Path = CONF_DIR) -> str:
    title = table.md.title or f"{table.paper} {table.name}"
    after = [b for b in table.md.after if not (table.stats and COMPARISON_BLOCK.match(b))]  # from .stats.json
    out = [f'<section class="table" id="{esc(table.anchor)}"><h3>{esc(title)}'
           + (f" <small>({table.scale} scale)</small>" if table.scale != "mini" else "") + "</h3>",
           '<div class="caption">' + "".join(f"<p>{inline(c)}</p>" for c in table.md.caption) + "</div>",
           table_html(table)]
    if table.stats:
        out.append(comparisons_html(table.stats))
    if after:
        out.append('<div class="notes">' + markdown_to_html("\n\n".join(after)) + "</div>")
    out.append(provenance_html(table, env, conf_dir))
    out.append("</section>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------- page


def figure_caption(figure: Path) -> str:
    """The caption written beside a figure (``<name>.caption.txt``: the paper's claim and whether ours holds), as
    HTML paragraphs; empty when there is none."""
    path = figure.with_suffix(".caption.txt")
    if not path.exists():
        return ""
    return "".join(f'<span class="claim">{inline(line)}</span>' for line in path.read_text().splitlines()
                   if line.strip())


def relative_src(path: Path, page_dir: Path) -> str:
    return quote(os.path.relpath(path.resolve(), page_dir.resolve()).replace(os.sep, "/"), safe="/")


def page_title(path: Path) -> str:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def render_page(results: Path, out: Path, env: Environment, conf_dir: Path = CONF_DIR,
                title: str = "pflrepro results", intro: Sequence[str] = ()) -> str:
    """The whole page for the results tree ``results``, to be written at ``out``: ``title`` as its heading, then
    the ``intro`` paragraphs (Markdown subset of :func:`markdown_to_html`)."""
    sections = discover(results, skip=[out, out.with_suffix(".png")])
    toc, body = [], []
    for s in sections:
        sid = anchor("paper", s.name)
        sub = [f'<li><a href="#{esc(t.anchor)}">{esc(t.name)}{f" ({t.scale} scale)" if t.scale != "mini" else ""}'
               f"</a> <span class=meta>{esc(t.md.title)}</span></li>" for t in s.tables]
        sub += [f'<li><a href="#{esc(anchor(s.name, "page", p.relative_to(results / s.name).as_posix()))}">'
                f'{esc(p.relative_to(results / s.name).as_posix())}</a> <span class=meta>{esc(page_title(p))}</span>'
                "</li>" for p in s.pages]
        if s.figures:
            sub.append(f'<li><a href="#{esc(anchor(s.name, "figures"))}">figures ({len(s.figures)})</a></li>')
        toc.append(f'<li><a href="#{esc(sid)}">{esc(s.name)}</a><ul>{"".join(sub)}</ul></li>')
        body.append(f'<section class="paper" id="{esc(sid)}"><h2>{esc(s.name)}</h2>')
        body += [table_section(t, env, conf_dir) for t in s.tables]
        for p in s.pages:
            rel = p.relative_to(results / s.name).as_posix()
            body.append(f'<section class="page" id="{esc(anchor(s.name, "page", rel))}"><h3>{esc(rel)}</h3>'
                        f'<p class="meta">written {esc(iso_mtime(p))}</p>'
                        f"{markdown_to_html(p.read_text(errors='replace'))}</section>")
        if s.figures:
            figs = [f'<figure><a href="{relative_src(f, out.parent)}"><img src="{relative_src(f, out.parent)}" '
                    f'alt="{esc(f.name)}"></a><figcaption>{esc(f.relative_to(results / s.name).as_posix())}'
                    f"{figure_caption(f)}</figcaption></figure>" for f in s.figures]
            body.append(f'<section class="figures" id="{esc(anchor(s.name, "figures"))}"><h3>Figures</h3>'
                        f'<div class="figs">{"".join(figs)}</div></section>')
        body.append("</section>")
    packages = ", ".join(f"{k} {v or 'not installed'}" for k, v in env.packages.items())
    head = (f'<header><h1>{esc(title)}</h1>{"".join(f"<p>{inline(p)}</p>" for p in intro)}'
            f'<p class="meta">Generated {esc(env.generated)} from <code>{esc(results)}</code>.</p>'
            f'<dl class="prov" id="provenance"><dt>commit</dt><dd>{esc(env.commit or "None")}</dd>'
            f"<dt>packages</dt><dd>{esc(packages)}</dd><dt>hardware</dt><dd>{esc(env.hardware)}</dd>"
            f"<dt>generated</dt><dd>{esc(env.generated)}</dd></dl>"
            f'<p class="meta">{esc(LEGEND)}</p></header>')
    nav = f'<nav id="contents"><h2>Contents</h2><ul>{"".join(toc)}</ul></nav>' if toc else \
        "<p>No results yet.</p>"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n{head}\n{nav}\n"
            + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def build(results: Path, out: Path, conf_dir: Path = CONF_DIR, title: str = "pflrepro results",
          intro: Sequence[str] = ()) -> Path:
    """Write the page for ``results`` atomically to ``out`` (heading ``title``, then ``intro``); returns ``out``."""
    atomic_write_text(out, render_page(results, out, environment(results), conf_dir, title, intro))
    return out


# --------------------------------------------------------------------------------------------------- browser


def chromium() -> str:
    """The headless browser's executable; raises FileNotFoundError saying how to install it."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"no chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}): {INSTALL_HINT}")


def run_chromium(page: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``file://<page>`` with ``args``, in a throw-away profile."""
    with tempfile.TemporaryDirectory(prefix="pflrepro-chromium-") as profile:
        command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                   f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def dump_dom(page: Path, budget_ms: int = 5000) -> str:
    """The page's DOM after it loaded (``--dump-dom``; ``--virtual-time-budget`` lets images and scripts run)."""
    done = run_chromium(page, f"--virtual-time-budget={budget_ms}", "--dump-dom")
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def screenshot(page: Path, out: Path | None = None, size: str = "1280,4000") -> Path:
    """A PNG of ``page`` (default: beside it, ``index.png``), written through a temp file and ``os.replace``."""
    out = out or page.with_suffix(".png")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        done = run_chromium(page, f"--screenshot={tmp}", f"--window-size={size}", "--virtual-time-budget=5000")
        if done.returncode != 0 or not os.path.getsize(tmp):
            raise RuntimeError(f"chromium --screenshot failed ({done.returncode}): {done.stderr[-2000:]}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results", help="the results tree (default: results)")
    parser.add_argument("--out", default=None, help="the page (default: <results>/index.html)")
    parser.add_argument("--screenshot", action="store_true",
                        help="also render the page in headless Chromium into index.png beside it")
    args = parser.parse_args(argv)
    results = Path(args.results)
    if not results.is_dir():
        print(f"no results folder {results}", file=sys.stderr)
        return 2
    out = build(results, Path(args.out) if args.out else results / "index.html")
    print(f"wrote {out}")
    if args.screenshot:
        try:
            print(f"wrote {screenshot(out)}")
        except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"screenshot failed: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
