"""One result object and one renderer for every result the project writes: a paper table, the cost tables of the
capacity methods, the hypernetwork's cost per round.

A :class:`Result` is a title, caption paragraphs and a sequence of blocks (headings, paragraphs, bullet lists, grids),
each block tagged with what it is (``kind``: the paired comparisons, the notes, the cells not averaged in, ...) so
that a reader can pick blocks without reading text; beside it, its ``frame`` (the long CSV) and its ``statistics``.
It renders to Markdown (:func:`to_markdown`), HTML (:func:`to_html`, the results page) and LaTeX (:func:`to_latex`,
its main grid); :meth:`Result.as_json` is what the ``.stats.json`` / ``.json`` beside a result holds under
``"result"``, from which the results page renders it again (:meth:`Result.from_json`) without reading Markdown.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

#: the kinds of block: a heading (``level`` 1-6), a paragraph, a bullet list (``text``: the line leading it, written
#: without a blank line before the list, or empty), a grid (``head`` and ``rows`` of cell strings)
FORMS = ("heading", "paragraph", "bullets", "grid")


@dataclass
class Block:
    """One piece of a result's body, in reading order."""

    form: str  # one of FORMS
    text: str = ""  # heading or paragraph text; a bullet list's lead line
    items: list[str] = field(default_factory=list)  # bullet items
    head: list[str] = field(default_factory=list)  # grid header
    rows: list[list[str]] = field(default_factory=list)  # grid rows
    level: int = 2  # heading level
    kind: str = ""  # what the block is to a reader (e.g. "table", "paired", "ordering", "problems", "stale")

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"block form {self.form!r} is unknown: use one of {list(FORMS)}")


def heading(text: str, level: int = 2, kind: str = "") -> Block:
    return Block("heading", text, level=level, kind=kind)


def paragraph(text: str, kind: str = "") -> Block:
    return Block("paragraph", text, kind=kind)


def bullets(items: Sequence[str], lead: str = "", kind: str = "") -> Block:
    return Block("bullets", lead, items=list(items), kind=kind)


def grid(head: Sequence[str], rows: Sequence[Sequence[str]], kind: str = "") -> Block:
    return Block("grid", head=[str(h) for h in head], rows=[[str(c) for c in row] for row in rows], kind=kind)


@dataclass
class Result:
    """A titled result: caption paragraphs under the title, then the body's blocks."""

    title: str
    caption: list[str] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    #: cells a reader marks: ``{"problems": [[row, column, state], ...], "stale": [[row, column], ...]}``
    cells: dict[str, list[list[str]]] = field(default_factory=dict)

    def of_kind(self, *kinds: str) -> list[Block]:
        return [b for b in self.blocks if b.kind in kinds]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Result:
        return cls(data["title"], list(data.get("caption", [])), [Block(**b) for b in data.get("blocks", [])],
                   {k: [list(c) for c in v] for k, v in (data.get("cells") or {}).items()})


def frame_grid(frame: pd.DataFrame, kind: str = "") -> Block:
    """A grid block of ``frame`` with its index as the first column (a missing value as an empty cell)."""
    head = [str(frame.index.name or "")] + [str(c) for c in frame.columns]
    return grid(head, [[str(idx)] + ["" if pd.isna(v) else str(v) for v in row] for idx, row in frame.iterrows()],
                kind)


def rerender_from_json(path: Path, write: Callable[[dict[str, Any]], Any]) -> int:
    """A ``--rerender`` command: ``write`` again what the JSON at ``path`` holds (its result left out: ``write``
    builds it anew), measuring nothing; 0, or 2 with a one-line error when there is no such file."""
    if not path.is_file():
        print(f"error: {path} does not exist: measure first (without --rerender)", file=sys.stderr)
        return 2
    write({k: v for k, v in json.loads(path.read_text()).items() if k != "result"})
    print(f"wrote {path.with_suffix('.md')}, .csv, .json (from {path})")
    return 0


# --------------------------------------------------------------------------------------------------- Markdown


def markdown_grid(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured pipe table."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown_lines(block: Block) -> list[str]:
    """A block's Markdown lines, the blank line that ends it included."""
    if block.form == "heading":
        return ["#" * block.level + " " + block.text, ""]
    if block.form == "paragraph":
        return [block.text, ""]
    if block.form == "bullets":
        return [*([block.text] if block.text else []), *(f"- {item}" for item in block.items), ""]
    return [*markdown_grid(block.head, block.rows), ""]


def to_markdown(result: Result, blocks: Sequence[Block] | None = None) -> str:
    """``# title``, the caption paragraphs, then every block (or ``blocks``), blank-line separated."""
    lines = [f"# {result.title}", ""]
    for text in result.caption:
        lines += [text, ""]
    for block in result.blocks if blocks is None else blocks:
        lines += markdown_lines(block)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- HTML


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def inline(text: str) -> str:
    """Escaped text with ``**bold**`` and ```code``` spans."""
    out = esc(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def html_grid(head: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    """An HTML table (the first column marked as the row names)."""
    out = ['<div class="scroll"><table>']
    if head:
        out.append("<thead><tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr></thead>")
    out.append("<tbody>" + "".join(
        "<tr>" + "".join(f'<td{" class=m" if i == 0 else ""}>{inline(c)}</td>' for i, c in enumerate(row)) + "</tr>"
        for row in rows) + "</tbody></table></div>")
    return "".join(out)


def html_pieces(block: Block, shift: int = 2) -> list[str]:
    """A block as HTML elements (headings ``shift`` levels down, as they sit under the page's own)."""
    if block.form == "heading":
        level = min(block.level + shift, 6)
        return [f"<h{level}>{inline(block.text)}</h{level}>"]
    if block.form == "paragraph":
        return [f"<p>{inline(block.text)}</p>"]
    if block.form == "bullets":
        return [*([f"<p>{inline(block.text)}</p>"] if block.text else []),
                "<ul>" + "".join(f"<li>{inline(i)}</li>" for i in block.items) + "</ul>"]
    return [html_grid([c.strip() for c in block.head], [[c.strip() for c in row] for row in block.rows])]


def to_html(result: Result, blocks: Sequence[Block] | None = None, title: bool = True) -> str:
    """The result as HTML: its title (an ``h3``, under the page's section headings), caption and blocks."""
    pieces = [f"<h3>{inline(result.title)}</h3>"] if title else []
    pieces += [f"<p>{inline(text)}</p>" for text in result.caption]
    for block in result.blocks if blocks is None else blocks:
        pieces += html_pieces(block)
    return "\n".join(pieces)


# --------------------------------------------------------------------------------------------------- LaTeX


def latex_escape(text: str) -> str:
    out = str(text)
    for char, repl in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                       ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"),
                       ("^", r"\textasciicircum{}")):
        out = out.replace(char, repl)
    for char, repl in (("±", r"$\pm$"), ("⚑", r"$^\dagger$"), ("‡", r"$^\ddagger$"), ("§", r"\S{}"), ("—", "--"),
                       ("²", r"$^2$"), ("≤", r"$\le$")):
        out = out.replace(char, repl)
    return out


def to_latex(result: Result, block: Block, notes: Sequence[str] = ()) -> str:
    """A standalone ``table`` environment (booktabs) of the grid ``block``, captioned with the result's title and
    caption (without Markdown emphasis); ``notes``: the cells not averaged in, under the table."""
    caption = " ".join(result.caption).replace("**", "")
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{latex_escape(result.title)}. {latex_escape(caption)}}}",
             r"\begin{tabular}{l" + "c" * (len(block.head) - 1) + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in block.head) + r" \\", r"\midrule"]
    lines += [" & ".join(latex_escape(c) for c in row) + r" \\" for row in block.rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if notes:
        lines += [r"\par\footnotesize Not averaged in: " + "; ".join(latex_escape(n) for n in notes) + "."]
    lines += [r"\end{table}", ""]
    return "\n".join(lines)
