"""Code identity: which code computed a run.

A run directory is a function of the config only, so after a bug fix the same command would find and
reuse results computed by the old code. Every summary therefore records ``code``: the git commit, whether
the tree differed from it (``dirty``), and ``hash``, a sha256 over the source of everything that computes
the run's results — the shared utilities (``common``), the federated core (``bench/core``), ``datasets``, the
assembly (``bench/builder.py``), ``bench/run.py``, the run's method module with every ``methods`` module it
imports (transitively), and the modules a config imports
(``imports=``) — so the identity holds without git too. Editing one method therefore leaves the runs of the
other methods current.

Finished runs from other code are reused by default (a refactor that changes no number should not cost
hours of compute); tables mark them, and ``python -m bench.table ... --rerun-stale`` reruns exactly those.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: what computes results, relative to the project root
CODE_PATHS = ("common", "bench/core", "bench/builder.py", "methods", "datasets", "bench/run.py")
#: what computes every run's results, whatever its method
SHARED_PATHS = ("common", "bench/core", "bench/builder.py", "datasets", "bench/run.py")


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


@functools.cache
def code_identity(imports: tuple[str, ...] = (), method: str | None = None) -> dict[str, Any]:
    """``{"commit", "dirty", "hash"}`` of this tree (commit and dirty are None outside a git checkout). With
    ``method``, ``hash`` covers the shared code and that method's modules only; without, every method."""
    extra = [path for path in map(_module_file, imports) if path is not None]
    if method is None:
        paths = [ROOT / p for p in CODE_PATHS]
    else:
        paths = [*(ROOT / p for p in SHARED_PATHS), *method_sources(method)]
    digest = hashlib.sha256()
    for path in _sources([*paths, *extra]):
        name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", *CODE_PATHS) if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status), "hash": digest.hexdigest()}


def run_code(summary: Mapping[str, Any]) -> str | None:
    """The code hash a finished run's summary records (None for runs from before code identity)."""
    return (summary.get("code") or {}).get("hash")


def is_stale(summary: Mapping[str, Any], imports: Sequence[str] = ()) -> bool:
    """Whether a finished run was computed by other code than this tree's (its method's code identity)."""
    return run_code(summary) != code_identity(tuple(imports), summary.get("method"))["hash"]


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

