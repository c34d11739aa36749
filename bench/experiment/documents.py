"""Markdown documents on the results page: notes written as Markdown by hand or by the benchmark scripts
(``results/bench/*.md``, a table's tuning report, READMEs), shown as they are. Results themselves (tables, cost
tables) are never read back from their Markdown: the page renders them from their ``Result``
(:mod:`bench.experiment.result`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from bench.experiment.result import html_grid, inline


def split_row(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def is_separator(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?", line.strip()))


def pipe_table(lines: Sequence[str]) -> str:
    """An HTML table of Markdown pipe-table lines (the first is the header when a separator line follows it)."""
    head = split_row(lines[0]) if len(lines) > 1 and is_separator(lines[1]) else None
    return html_grid(head, [split_row(line) for line in (lines[2:] if head else lines) if not is_separator(line)])


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
