"""The packages are in layers, each importing only the layers below it, and no module imports itself back in a
circle. Every import counts: at the top of a module or inside a function, relative ones, and the ones made from a
string (``importlib.import_module("x")``, ``__import__("x")``); an import from a computed string is allowed only
as a package importing its own modules (``f"{__name__}.{name}"``) or in the one plug-in loader."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: bottom to top; a module belongs to the layer of its longest matching prefix (``bench.core`` before ``bench``)
LAYERS = (
    ("common",),  # shared utilities: registries, verified file I/O, seeding
    ("datasets",),  # sources, partitioners, the partition cache and report
    ("bench.core",),  # engine and hooks, flat model, data pool, models, records, summaries
    ("methods",),  # one module per method
    ("bench.builder",),  # the assembly: config -> data, workers, federation, method, engine
    ("bench",),  # the experiment layer: runs, tables, collection, rendering, reports
    ("scripts", "hydra_plugins"),  # paper code and tools
)
PACKAGES = ("common", "datasets", "bench", "methods", "scripts", "hydra_plugins")
#: modules that import a module named by a config at run time (the ``imports=`` plug-ins, outside the project)
PLUGIN_LOADERS = {"bench.builder"}
IMPORTERS = {"import_module", "__import__"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def own_modules(arg: ast.expr) -> bool:
    """Whether a computed module name is ``f"{__name__}.<...>"``: a package importing its own modules."""
    return (isinstance(arg, ast.JoinedStr) and len(arg.values) >= 2
            and isinstance(arg.values[0], ast.FormattedValue) and isinstance(arg.values[0].value, ast.Name)
            and arg.values[0].value.id == "__name__"
            and isinstance(arg.values[1], ast.Constant) and str(arg.values[1].value).startswith("."))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> tuple[set[str], list[str]]:
    """(the project modules ``name`` imports, its imports from a computed string that are not of its own modules)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[str] = []
    computed: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            subs = [f"{base}.{a.name}" for a in node.names]
            found += [sub for sub in subs if sub in modules]
            found += [base] if any(sub not in modules for sub in subs) else []  # a name defined in ``base``
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called not in IMPORTERS:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(arg.value)
            elif not own_modules(arg):
                computed.append(f"{name}:{node.lineno}")
    return {t for t in found if t in modules} - {name}, computed


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], list[str]]:
    """module -> the project modules it imports; the computed imports that are not of a package's own modules."""
    modules = project_modules(root)
    graph, computed = {}, []
    for name, path in modules.items():
        graph[name], dynamic = imports_of(name, path, modules)
        computed += dynamic
    return graph, computed


def layer(module: str) -> int:
    best, level = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    assert level >= 0, f"{module} is in no layer: add its package to LAYERS"
    return level


def upward(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """module -> the modules of higher layers it imports."""
    out = {m: sorted(t for t in targets if layer(t) > layer(m)) for m, targets in graph.items()}
    return {m: t for m, t in out.items() if t}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    # a package's __init__ importing its own submodules is no circle
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    found = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return found


def test_every_package_imports_only_the_layers_below_it():
    graph, _ = import_graph()
    assert upward(graph) == {}


def test_imports_from_computed_strings_are_a_packages_own_modules_or_the_plugin_loader():
    _, computed = import_graph()
    assert {site.partition(":")[0] for site in computed} <= PLUGIN_LOADERS, computed


def test_the_import_graph_has_no_circle():
    graph, _ = import_graph()
    assert circles(graph) == []


def test_the_method_registry_imports_no_method_and_loads_one_by_name():
    """``import methods`` registers nothing by itself; building a run imports only its method's module (and what
    that module imports), so a broken method cannot stop the runs of the others."""
    import subprocess
    import sys

    code = ("import sys, methods; from bench.builder import method_class; from tests.helpers import config; "
            "before = sorted(m for m in sys.modules if m.startswith('methods.')); "
            "from bench.experiment.compose import to_container; import tempfile, pathlib; "
            "method_class(to_container(config(pathlib.Path(tempfile.mkdtemp()), 'method=fedprox'))); "
            "print(before, sorted(m for m in sys.modules if m.startswith('methods.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "['methods.fedavg',", "'methods.fedprox']"]


def test_every_method_module_registers_its_own_name():
    import methods

    assert set(methods.load_all()) >= set(methods.names())  # plug-ins registered by other tests may be there too
    for name in methods.names():
        assert methods.METHODS.get(name).__module__ == f"methods.{name}"


@pytest.mark.parametrize("where, source, broken", [
    ("datasets/sources.py", "from bench.core.registry import Registry\n", "bench.core.registry"),
    ("bench/core/data.py", "import importlib\nimportlib.import_module('bench.builder')\n", "bench.builder"),
    ("bench/core/sub/x.py", "from ...builder import build_experiment\n", "bench.builder"),  # relative
    ("bench/core/engine.py", "def f():\n    import methods.fedavg\n", "methods.fedavg"),  # inside a function
])
def test_the_check_sees_every_kind_of_upward_import(tmp_path: Path, where: str, source: str, broken: str):
    for module in ("common/__init__", "datasets/__init__", "bench/__init__", "bench/core/__init__",
                   "bench/core/sub/__init__", "bench/core/registry", "bench/builder", "methods/__init__",
                   "methods/fedavg"):
        (tmp_path / f"{module}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{module}.py").touch()
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(source)
    graph, _ = import_graph(tmp_path)
    assert upward(graph) == {module_name(tmp_path / where, tmp_path): [broken]}


def test_a_computed_import_outside_the_plugin_loader_is_reported(tmp_path: Path):
    (tmp_path / "bench" / "core").mkdir(parents=True)
    (tmp_path / "bench" / "core" / "engine.py").write_text("import importlib\nname = 'methods'\n"
                                                          "importlib.import_module(name)\n")
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "__init__.py").write_text("import importlib\nimportlib.import_module(f'{__name__}.x')\n")
    _, computed = import_graph(tmp_path)
    assert computed == ["bench.core.engine:3"]


def test_the_code_hash_covers_every_module_of_the_computing_layers_that_a_run_executes(tmp_path: Path):
    """What a run executes from the layers up to the assembly (common, datasets, the core, its method's modules, the
    builder) is in its code hash (``bench.experiment.provenance``), so moving a module between packages cannot take it
    out."""
    import json
    import subprocess
    import sys

    from bench.experiment.provenance import SHARED_PATHS, _sources, method_sources

    code = ("import json, pathlib, sys; from bench.experiment.run import execute; from tests.helpers import config; "
            f"execute(config(pathlib.Path({str(tmp_path)!r}), 'method=fedrep', 'rounds=1')); "
            "print(json.dumps([getattr(m, '__file__', None) for m in list(sys.modules.values())]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = {Path(f).resolve() for f in json.loads(out.stdout.splitlines()[-1]) if f}
    mine = {p for p in loaded if p.is_relative_to(ROOT) and p.relative_to(ROOT).parts[0] in PACKAGES}
    computing = {p for p in mine if layer(module_name(p)) <= layer("bench.builder")}
    hashed = set(_sources([*(ROOT / p for p in SHARED_PATHS), *method_sources("fedrep")]))
    # methods/__init__.py only finds a method's module by its name
    assert computing - hashed == {ROOT / "methods" / "__init__.py"}
    assert ROOT / "methods" / "_partial.py" in computing  # the method's own imports are traced, not all methods
    assert not {p for p in mine if p.parent.name == "methods" and p.stem in ("fedavg", "fedselect", "fedcac")}
