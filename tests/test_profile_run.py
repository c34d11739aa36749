"""scripts/profile_run.py profiles the code of the tree it sits in: run from a copy of another commit by a venv
whose editable install points at this checkout, it still imports the copy's ``bench`` (the measurement itself is
`python scripts/profile_run.py`, results/bench/throughput.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_script_imports_bench_from_its_own_tree(tmp_path: Path) -> None:
    copy = tmp_path / "other_commit"
    (copy / "scripts").mkdir(parents=True)
    (copy / "bench").mkdir()
    (copy / "bench" / "__init__.py").write_text("")
    shutil.copy(ROOT / "scripts" / "profile_run.py", copy / "scripts" / "profile_run.py")
    probe = ("import runpy, sys; runpy.run_path(sys.argv[1], run_name='probe'); import bench; print(bench.__file__)")
    out = subprocess.run([sys.executable, "-c", probe, str(copy / "scripts" / "profile_run.py")], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out) == copy / "bench" / "__init__.py"
