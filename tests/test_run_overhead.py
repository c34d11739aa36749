"""Cheaper work around a run's training that gives the same results: W&B imported before torch, the imports of a
module found without visiting its expressions, the finiteness check of a trained model by one reduction."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest
import torch

from bench.core.data import gather_rows
from bench.core.evaluation import all_finite
from bench.experiment.provenance import ROOT, _statements
from bench.experiment.wandb_logger import wandb_requested

pytestmark = pytest.mark.slow  # imports every module in new processes

INF, NAN = float("inf"), float("nan")


@pytest.mark.parametrize("values", [
    torch.zeros(0), torch.randn(100), torch.tensor([1.0, NAN]), torch.tensor([INF, 1.0]), torch.tensor([-INF]),
    torch.tensor([NAN, INF, -INF]), torch.tensor([3.4e38, -3.4e38]), torch.tensor([1.0, NAN], dtype=torch.float64),
    torch.tensor([-0.0, NAN], dtype=torch.bfloat16), torch.tensor([1.0, INF], dtype=torch.float16),
    torch.tensor([1, 2, 3]), torch.tensor([True, False]), torch.tensor([1 + 1j, complex(INF, 0)]),
    torch.full((582_026,), 0.5).index_fill_(0, torch.tensor([581_999]), NAN),
])
def test_all_finite_answers_as_isfinite_all(values: torch.Tensor) -> None:
    assert all_finite(values) is bool(torch.isfinite(values).all())


def test_the_statements_hold_every_import_of_every_module_in_ast_walks_order() -> None:
    checked = 0
    for path in sorted(ROOT.rglob("*.py")):
        if {".venv", "results", "runs"} & set(path.relative_to(ROOT).parts):
            continue
        tree = ast.parse(path.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        assert [n for n in _statements(tree) if isinstance(n, ast.Import | ast.ImportFrom)] == imports, path
        checked += len(imports)
    source = "try:\n    pass\nexcept E:\n    import a\nmatch x:\n    case 1:\n        from b import c\n"
    nested = ast.parse("def f():\n    if x:\n        import d\n    with y:\n        import e\n" + source)
    assert [n for n in _statements(nested) if isinstance(n, ast.Import | ast.ImportFrom)] == [
        n for n in ast.walk(nested) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert checked > 1000


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], True), (["method=fedavg"], True), (["logger.wandb.mode=offline"], True),
    (["logger.wandb.mode=disabled"], False), (["++logger.wandb.mode=disabled"], False),
    (["logger.wandb.mode=disabled", "logger.wandb.mode=offline"], True),
    (["logger.wandb.mode_x=disabled"], True),
])
def test_wandb_is_requested_unless_an_override_disables_it(overrides: list[str], expected: bool) -> None:
    assert wandb_requested(overrides) is expected


def imported_before(overrides: list[str]) -> list[str]:
    """The top-level packages ``python -m bench.experiment.run`` imports, in order, until Hydra prints the job's
    config (``--cfg job``: nothing runs)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "bench.experiment.run", "--cfg", "job",
                          *overrides], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    names = [line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    return [n for n in names if "." not in n]


def test_a_run_logging_to_wandb_imports_it_before_torch_and_a_run_without_does_not_import_it_first() -> None:
    logging = imported_before([])
    assert logging.index("wandb") < logging.index("torch")
    plain = imported_before(["logger.wandb.mode=disabled"])
    assert "wandb" not in plain[: plain.index("torch")]


@pytest.mark.parametrize("rows", [[0, 3, 6, 7, 11], [], [8, 9], [1, 2], list(range(12))])
def test_gather_rows_is_indexing_the_concatenated_parts(rows: list[int]) -> None:
    parts = [torch.randn(7, 1, 2, 2), torch.randn(0, 1, 2, 2), torch.randn(5, 1, 2, 2)]
    index = torch.tensor(rows, dtype=torch.long)
    assert torch.equal(gather_rows(parts, index), torch.cat(parts)[index])
