"""Generated blocks in hand-written Markdown: numbers in a README come from a results file, never from a keyboard.

A block names its source, a file under the repository root, and optionally which part of it::

    <!-- generated: results/fedcac/medium/table2.md#table:1 -->
    ...whatever the last ``--write`` put here...
    <!-- /generated -->

``#table:N`` is the file's N-th Markdown pipe table (1-based); without a part, the whole file. ``--write`` fills
every block from its source; ``--check`` changes nothing and fails, naming each stale block, when a block differs
from its source (the test suite runs it over every README, so a result regenerated without its README fails).

Usage: ``python -m bench.experiment.readme_blocks (--write | --check) [FILE ...]`` (default: every README).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from common.verified_io import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- generated: (?P<source>[^#\s]+)(?:#(?P<part>\S+))? -->\n)(?P<body>.*?)(<!-- /generated -->)",
                   re.DOTALL)


def readmes(root: Path = ROOT) -> list[Path]:
    """The README files that may hold blocks: the top level's and each paper's."""
    return [root / "README.md", *sorted((root / "conf" / "paper").glob("*/README.md"))]


def pipe_tables(text: str) -> list[str]:
    """The Markdown pipe tables of ``text``, each as its lines."""
    tables, current = [], []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            current.append(line)
        elif current:
            tables.append("\n".join(current))
            current = []
    if current:
        tables.append("\n".join(current))
    return tables


def source_text(source: str, part: str | None, root: Path = ROOT) -> str:
    """The text a block shows: ``source`` (relative to ``root``) whole, or its ``table:N``."""
    path = root / source
    if not path.is_file():
        raise ValueError(f"generated block names {source!r}, which does not exist: regenerate it or fix the name")
    text = path.read_text()
    if part is None:
        return text.rstrip("\n")
    hit = re.fullmatch(r"table:(\d+)", part)
    if not hit:
        raise ValueError(f"generated block {source}#{part}: the part must be table:N (the file's N-th pipe table)")
    tables, n = pipe_tables(text), int(hit.group(1))
    if not 1 <= n <= len(tables):
        raise ValueError(f"generated block {source}#{part}: the file has {len(tables)} pipe tables")
    return tables[n - 1]


def fill(text: str, root: Path = ROOT) -> str:
    """``text`` with every block's body replaced by its source's current text."""
    return BLOCK.sub(lambda m: m.group(1) + source_text(m.group("source"), m.group("part"), root) + "\n" + m.group(5),
                     text)


def stale_blocks(path: Path, root: Path = ROOT) -> list[str]:
    """The blocks of ``path`` whose body differs from their source (``source#part`` each)."""
    text = path.read_text()
    return [m.group("source") + (f"#{m.group('part')}" if m.group("part") else "") for m in BLOCK.finditer(text)
            if m.group("body") != source_text(m.group("source"), m.group("part"), root) + "\n"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="fill every block from its source")
    mode.add_argument("--check", action="store_true", help="fail if a block differs from its source")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: every README)")
    args = parser.parse_args(argv)
    files = args.files or readmes()
    stale = []
    for path in files:
        if args.write:
            text = path.read_text()
            new = fill(text)
            if new != text:
                atomic_write_text(path, new)
                print(f"wrote {path}")
        else:
            stale += [f"{path}: {block}" for block in stale_blocks(path)]
    if stale:
        print("stale generated blocks (run python -m bench.experiment.readme_blocks --write):\n  "
              + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
