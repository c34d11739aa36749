"""Generated blocks in the READMEs: filled from their source files, stale ones named, and every README current."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.experiment import readme_blocks

TEXT = """# Notes
Before.
<!-- generated: results/t.md#table:2 -->
old numbers
<!-- /generated -->
Between.
<!-- generated: results/caption.txt -->
<!-- /generated -->
After.
"""
SOURCE = "# t\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\ntext\n\n| x |\n|---|\n| 9.5 |\n"


def tree(tmp_path: Path) -> Path:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t.md").write_text(SOURCE)
    (tmp_path / "results" / "caption.txt").write_text("Ours: 12.3, holds.\n")
    (tmp_path / "README.md").write_text(TEXT)
    return tmp_path / "README.md"


def test_fill_puts_each_sources_part_in_its_block_and_leaves_the_prose(tmp_path):
    readme = tree(tmp_path)
    filled = readme_blocks.fill(readme.read_text(), tmp_path)
    assert filled == TEXT.replace("old numbers\n", "| x |\n|---|\n| 9.5 |\n").replace(
        "<!-- generated: results/caption.txt -->\n", "<!-- generated: results/caption.txt -->\nOurs: 12.3, holds.\n")
    assert readme_blocks.fill(filled, tmp_path) == filled  # filling twice changes nothing


def test_a_stale_block_is_named_and_a_bad_part_or_source_refused(tmp_path):
    readme = tree(tmp_path)
    assert readme_blocks.stale_blocks(readme, tmp_path) == ["results/t.md#table:2", "results/caption.txt"]
    readme.write_text(readme_blocks.fill(readme.read_text(), tmp_path))
    assert readme_blocks.stale_blocks(readme, tmp_path) == []
    (tmp_path / "results" / "caption.txt").write_text("Ours: 12.4, holds.\n")  # the result moved, the README did not
    assert readme_blocks.stale_blocks(readme, tmp_path) == ["results/caption.txt"]
    with pytest.raises(ValueError, match="the file has 2 pipe tables"):
        readme_blocks.source_text("results/t.md", "table:3", tmp_path)
    with pytest.raises(ValueError, match="the part must be table:N"):
        readme_blocks.source_text("results/t.md", "rows", tmp_path)
    with pytest.raises(ValueError, match="'results/none.md', which does not exist"):
        readme_blocks.source_text("results/none.md", None, tmp_path)


def test_every_readme_block_matches_its_source():
    """A result regenerated without its README (``make report`` fills them) fails here."""
    stale = {str(path): readme_blocks.stale_blocks(path) for path in readme_blocks.readmes()}
    assert not {path: blocks for path, blocks in stale.items() if blocks}
    assert any("<!-- generated: " in path.read_text() for path in readme_blocks.readmes())
