"""What the launchers of official code share (they run under the external code's own interpreter, from its
checkout, so they import nothing of the project but this file, which sits beside them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SPLIT_HELP = "the folder `bench.experiment.partition export --format pfllib` wrote"


def split_and_code_args(split: str, code_args: list[str]) -> tuple[Path, list[str]]:
    """The exported split (checked to hold ``train/``) and the arguments after ``--`` for the official code; puts the
    working directory (the checkout) first on ``sys.path`` so that its modules import."""
    rest = code_args[1:] if code_args[:1] == ["--"] else code_args
    folder = Path(split).resolve()
    if not (folder / "train").is_dir():
        raise SystemExit(f"error: {folder} has no train/ folder: export the split with bench.experiment.partition "
                         "first")
    sys.path.insert(0, os.getcwd())
    return folder, rest
