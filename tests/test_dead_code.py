"""No dead code: every function, class and method the project's packages define is used by the project itself (its
modules, configs or Makefile), not only by the tests or by nothing. A helper that only a test needs lives in the
tests."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from tests.test_layers import PACKAGES, ROOT

#: defined for users outside the project or called by a library, with the reason
USED_OUTSIDE = {
    "read_partition_file": "the reader of the partition files other libraries exchange (docs/partition_format.md)",
    "clear_memory_cache": "the in-process cache's control, as functools' cache_clear",
    "extra_repr": "torch.nn.Module's hook for repr()",
}


def definitions(path: Path) -> list[tuple[str, int]]:
    """(name, line) of the module's functions and classes and of its classes' methods; registered ones (any
    decorator that is not ``staticmethod``/``classmethod``/``property``) and dunders are used by their registry."""
    out = []
    tree = ast.parse(path.read_text())
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else []
        for item in [node, *members]:
            if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            plain = all(ast.unparse(d) in ("staticmethod", "classmethod", "property") for d in item.decorator_list)
            if plain and not item.name.startswith("__"):
                out.append((item.name, item.lineno))
    return out


def unused(root: Path = ROOT) -> list[str]:
    """``path:line name`` of every definition the project's own files name nowhere else."""
    sources = sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts)
    others = [*(root / "conf").rglob("*.yaml"), *[root / f for f in ("Makefile", "pyproject.toml")]]
    words = Counter(word for p in [*sources, *others] if p.is_file() for word in re.findall(r"\w+", p.read_text()))
    found = []
    for path in sources:
        for name, line in definitions(path):
            if words[name] <= 1 and name not in USED_OUTSIDE:
                found.append(f"{path.relative_to(root)}:{line} {name}")
    return found


def test_every_definition_is_used_by_the_project_not_only_by_tests():
    assert unused() == []


def test_the_check_finds_a_function_used_only_by_a_test_and_a_method_used_by_nothing(tmp_path: Path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.py").write_text(
        "def used():\n    return 1\n\n\ndef only_tested():\n    return used()\n\n\n"
        "class Thing:\n    def idle(self):\n        pass\n\n    @property\n    def size(self):\n        return 0\n\n"
        "    def __len__(self):\n        return self.size\n\n\n@REGISTRY.register('x')\ndef registered():\n    pass\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("from bench.a import only_tested\n")
    assert unused(tmp_path) == ["bench/a.py:5 only_tested", "bench/a.py:9 Thing", "bench/a.py:10 idle"]
