"""Code identity: which code computed a run.

A run directory is a function of the config only, so after a bug fix the same command would find and
reuse results computed by the old code. Every summary therefore records ``code``: the git commit, whether
the tree differed from it (``dirty``), ``hash``, a sha256 over the source of everything that computes
the run's results, and the ``version`` of the rule that chose those files (absent: version 1):

- version 1 (every run before the version was recorded): the federated core (``bench/core``), ``datasets`` and
  ``bench/experiment/run.py`` whole (since the layering also ``common`` and ``bench/builder.py``), the run's method
  module with every ``methods`` module it imports (transitively);
- version 2: the modules the run executes: ``bench/experiment/run.py`` and the method's module with every module of
  ``common``, the core, the assembly (``bench/builder.py``), ``datasets`` and ``methods`` they import, transitively
  (``run_sources``), so an edit to a module the run never imports (the dry run's label counts; the mean another
  method aggregates with) leaves it current;

and in both the modules a config imports (``imports=``), so the identity holds without git too. Editing one method
therefore leaves the runs of the other methods current. A summary is judged by the rule it was hashed by, so a new
rule marks no existing run stale.

Finished runs from other code are reused by default (a refactor that changes no number should not cost
hours of compute); tables mark them, and ``python -m bench.experiment.table ... --rerun-stale`` reruns exactly those.
"""

from __future__ import annotations

import ast
import collections
import functools
import hashlib
import importlib.util
import os
import platform
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: what computes results, relative to the project root
CODE_PATHS = ("common", "bench/core", "bench/builder.py", "methods", "datasets", "bench/experiment/run.py")
#: what computes every run's results, whatever its method (code identity version 1: all of it)
SHARED_PATHS = ("common", "bench/core", "bench/builder.py", "datasets", "bench/experiment/run.py")
#: the rule by which a new run's code hash is computed: 1 = :data:`SHARED_PATHS` whole and the run's method modules
#: (every summary written before the version was recorded); 2 = the modules a run imports (:func:`run_sources`)
CODE_IDENTITY_VERSION = 2


def _sources(paths: Iterable[Path]) -> list[Path]:
    files: set[Path] = set()
    for path in paths:
        if path.is_dir():
            files.update(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        elif path.is_file():
            files.add(path)
    return sorted(files)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _module_file(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def method_sources(method: str) -> list[Path]:
    """The source files of method ``method``: its module and every ``methods`` module it imports, transitively
    (``methods/__init__.py`` only finds and imports the method modules and computes nothing)."""
    import methods

    todo = [methods.load(method).__module__]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen[name] = path
        package = name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("methods.")]
            elif isinstance(node, ast.ImportFrom):
                base = (f"{package}.{node.module}" if node.module else package) if node.level else node.module or ""
                if base == "methods":
                    todo += [f"methods.{a.name}" for a in node.names]
                elif base.startswith("methods."):
                    todo.append(base)
    return sorted(seen.values())


def _project_module(name: str) -> Path | None:
    """The file of a module of this project by its dotted name (without importing it), or None."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """The statements of ``tree`` (with the except clauses and match cases holding some), nested ones too, in
    ``ast.walk``'s order: an import is a statement, and no expression holds a statement, so the imports come out as
    ``ast.walk`` gives them without visiting the expressions (most of a module's nodes)."""
    todo = collections.deque([tree])
    while todo:
        node = todo.popleft()
        todo.extend(child for child in ast.iter_child_nodes(node)
                    if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case))
        yield node


def _imported(name: str, path: Path) -> list[str]:
    """The modules a module's source imports (absolute names; ``from x import y`` gives ``x.y`` where that is a
    module of this project, else ``x``), in the function bodies too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in _statements(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            out += [f"{base}.{a.name}" if _project_module(f"{base}.{a.name}") else base for a in node.names]
    return out


#: the code a run's results can come from (code identity version 2); the experiment layer's modules that a run
#: passes through (validation, errors, composition, logging) compute nothing of its records
TRACED = ("common", "bench/core", "bench/builder.py", "datasets", "methods", "bench/experiment/run.py")
#: the methods registry: importing it imports every method, but it computes nothing
REGISTRY = "methods/__init__.py"


def run_sources(method: str) -> list[Path]:
    """The source files a run of ``method`` executes (code identity version 2): ``bench/experiment/run.py`` and the
    method's module, and every module of :data:`TRACED` they import, transitively (by ``ast``, function bodies
    included), with the ``__init__`` of each package on the way; not the methods registry (:data:`REGISTRY`), through
    which the assembly reaches every method, so that a run's hash covers its own method only."""
    import methods

    traced = [ROOT / p for p in TRACED]
    registry = ROOT / REGISTRY
    todo = ["bench.experiment.run", methods.load(method).__module__]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        path = _project_module(name)
        if name in seen or path is None or path == registry or not any(
                path == t or path.is_relative_to(t) for t in traced):
            continue
        seen[name] = path
        parents = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)]
        todo += [*_imported(name, path), *parents]
    return sorted(seen.values())


@functools.cache
def code_identity(imports: tuple[str, ...] = (), method: str | None = None,
                  version: int = CODE_IDENTITY_VERSION) -> dict[str, Any]:
    """``{"commit", "dirty", "hash"}`` of this tree (commit and dirty are None outside a git checkout), with
    ``version`` when it is not 1. Without ``method``, ``hash`` covers all the code that computes results (every
    method); with it, by code identity ``version`` 1 the shared code (:data:`SHARED_PATHS`) and that method's
    modules, by version 2 the modules a run of that method executes (:func:`run_sources`)."""
    extra = [path for path in map(_module_file, imports) if path is not None]
    if method is None:
        paths = [ROOT / p for p in CODE_PATHS]
    elif version == 1:
        paths = [*(ROOT / p for p in SHARED_PATHS), *method_sources(method)]
    elif version == 2:
        paths = run_sources(method)
    else:
        raise ValueError(f"code identity version {version} is unknown: this tree knows versions 1 and 2")
    digest = hashlib.sha256()
    for path in _sources([*paths, *extra]):
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", *CODE_PATHS) if commit else None
    versioned = {"version": version} if method is not None and version != 1 else {}
    dirty = None if status is None else bool(status)
    return {"commit": commit, "dirty": dirty, "hash": digest.hexdigest(), **versioned}


def run_code(summary: Mapping[str, Any]) -> str | None:
    """The code hash a finished run's summary records (None for runs from before code identity)."""
    return (summary.get("code") or {}).get("hash")


def is_stale(summary: Mapping[str, Any], imports: Sequence[str] = ()) -> bool:
    """Whether a finished run was computed by other code than this tree's: its method's code identity by the version
    its summary records (version 1 for a summary that records none)."""
    version = (summary.get("code") or {}).get("version", 1)
    return run_code(summary) != code_identity(tuple(imports), summary.get("method"), version)["hash"]


def cpu_name() -> str:
    """The CPU's model name (Linux: ``/proc/cpuinfo``), else what ``platform`` knows: the hardware a result was
    measured on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: environment variables that cap the instruction set of PyTorch's CPU kernels (ATen), oneDNN (convolutions)
#: and MKL (matrix products)
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_kernels() -> dict[str, Any]:
    """What a CPU run's bits depend on besides the config and the thread count: the torch version, the
    instruction set its kernels dispatch to (``torch.backends.cpu.get_cpu_capability()``, e.g. AVX2 or AVX512),
    the CPU, and any caps set through :data:`ISA_CAPS`. The same run on an AVX-512 and on an AVX2 machine sums
    in different orders, so its records differ in the last bits and, over rounds, in accuracy; with
    ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` an AVX-512 machine computes
    what an AVX2 machine does."""
    import torch

    caps = {name: os.environ[name] for name in ISA_CAPS if name in os.environ}
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": cpu_name(), **({"isa_caps": caps} if caps else {})}

