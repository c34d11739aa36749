"""One self-contained static web page of every result: ``results/index.html``.

For each paper folder under ``results/`` (``results/bench`` has no tables; ``results/demo`` is left out: the demo
writes its own page, ``results/demo/index.html``, from its own results tree):

- every table (a ``<name>.csv`` with a sibling ``<name>.md``, at mini scale in the folder itself, at paper scale
  under ``paper-scale/``): ours (mean ± std, seeds) beside the paper's number and the difference, with the flags
  (⚑ beyond two of our stds at paper scale, ‡ stale, ✗ not averaged in), its title, caption and notes, the paired
  differences and Kendall's tau, all from the ``.stats.json`` (its statistics and its rendered result,
  :mod:`bench.experiment.result`), and its provenance; its Markdown is never read;
- every other result page: a ``<name>.md`` whose ``<name>.json`` holds its result (``results/pa3dfl/efficiency``,
  ``table9``), rendered from that result; every other Markdown page (``results/bench/bench.md``, tuning reports) as
  a document (:mod:`bench.experiment.documents`);
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
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from bench.experiment.browser import screenshot
from bench.experiment.documents import markdown_to_html
from bench.experiment.provenance import cpu_name
from bench.experiment.result import Result, esc, html_pieces, inline, to_html
from bench.experiment.table_html import Table, anchor, comparisons_html, is_table_csv, read_table, table_html
from common.verified_io import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
PACKAGES = ("torch", "torchvision", "pandas", "hydra-core", "wandb")
NO_TABLES = {"bench"}  # result folders that hold pages and figures but no paper tables
OWN_PAGE = {"demo"}  # result folders with a page of their own (scripts/demo.py), not shown on the results page

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




@dataclass(frozen=True)
class Section:
    """One results folder: its tables, its other Markdown pages and its figures."""

    name: str
    tables: list[Table]
    pages: list[Path]
    figures: list[Path]


# --------------------------------------------------------------------------------------------------- helpers



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
    title = table.title or f"{table.paper} {table.name}"
    shown = ("table", "paired", "ordering") if table.stats else ("table",)  # the comparisons: from the statistics
    after = [b for b in table.result.blocks if b.kind not in shown] if table.result else []
    out = [f'<section class="table" id="{esc(table.anchor)}"><h3>{esc(title)}'
           + (f" <small>({table.scale} scale)</small>" if table.scale != "mini" else "") + "</h3>",
           '<div class="caption">' + "".join(f"<p>{inline(c)}</p>" for c in (table.result.caption if table.result
                                                                              else [])) + "</div>",
           table_html(table)]
    if table.stats:
        out.append(comparisons_html(table.stats))
    if after:
        out.append('<div class="notes">' + "\n".join(piece for b in after for piece in html_pieces(b)) + "</div>")
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


def page_result(path: Path) -> Result | None:
    """The result a Markdown page was rendered from: ``"result"`` of the ``.json`` beside it, if it has one."""
    data = path.with_suffix(".json")
    try:
        found = json.loads(data.read_text()).get("result") if data.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return Result.from_json(found) if found else None


def page_title(path: Path) -> str:
    """A page's title: its result's, else its document's first heading."""
    result = page_result(path)
    if result is not None:
        return result.title
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def page_html(path: Path) -> str:
    """A page's body: its result rendered, else the Markdown document as it is."""
    result = page_result(path)
    return to_html(result) if result is not None else markdown_to_html(path.read_text(errors="replace"))


def render_page(results: Path, out: Path, env: Environment, conf_dir: Path = CONF_DIR,
                title: str = "pflrepro results", intro: Sequence[str] = ()) -> str:
    """The whole page for the results tree ``results``, to be written at ``out``: ``title`` as its heading, then
    the ``intro`` paragraphs (Markdown subset of :func:`markdown_to_html`)."""
    sections = discover(results, skip=[out, out.with_suffix(".png")])
    toc, body = [], []
    for s in sections:
        sid = anchor("paper", s.name)
        sub = [f'<li><a href="#{esc(t.anchor)}">{esc(t.name)}{f" ({t.scale} scale)" if t.scale != "mini" else ""}'
               f"</a> <span class=meta>{esc(t.title)}</span></li>" for t in s.tables]
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
                        f"{page_html(p)}</section>")
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
