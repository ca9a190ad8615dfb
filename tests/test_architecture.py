"""The architecture the docs describe (docs/architecture.md), checked on the source: imports point left only
(comms <- lattice <- solvers, force <- hmc <- bench; so no product module imports bench), no import circles between
modules, modules under 600 lines and functions under 80. An import is any import statement at any depth or an
``importlib.import_module`` / ``__import__`` call naming a module; bench-only rules are in tests/bench/test_layering.py."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"comms": 0, "lattice": 1, "solvers": 2, "force": 2, "hmc": 3, "bench": 4}
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def _modules() -> dict:
    """{dotted module name: path} of every package module."""
    mods = {}
    for pkg in LAYER:
        for f in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else ():
            parts = f.relative_to(ROOT).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


MODULES = _modules()


def _imported(cur: str, node) -> list[str]:
    """The project modules an import statement of module ``cur`` names (relative imports resolved)."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = cur.split(".")
            if MODULES[cur].name != "__init__.py":
                parts = parts[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for n in names:
        while n and n not in MODULES:
            n = n.rpartition(".")[0]
        if n and n != cur:
            out.append(n)
    return out


def _called(node) -> str | None:
    """The module an ``importlib.import_module("x")`` or ``__import__("x")`` call names, else None."""
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
            ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
        return str(node.args[0].value)
    return None


def _dependencies(m: str, tree) -> set:
    """The project modules that module ``m`` (parsed as ``tree``) imports, in any form and at any depth."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(_imported(m, node))
        elif _called(node):
            out.update(_imported(m, ast.Import(names=[ast.alias(name=_called(node))])))
    return out


def _graph() -> dict:
    return {m: _dependencies(m, ast.parse(f.read_text())) for m, f in MODULES.items()}


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), a package and its own submodules aside."""
    related = lambda a, b: a.startswith(b + ".") or b.startswith(a + ".")
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if related(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return comps


def test_imports_point_left_only():
    bad = []
    for m, deps in _graph().items():
        a = m.split(".")[0]
        for w in deps:
            b = w.split(".")[0]
            if LAYER[b] > LAYER[a] or (LAYER[a] == LAYER[b] and a != b):
                bad.append(f"{m} -> {w}")
    assert not bad, "imports pointing up or sideways: " + ", ".join(sorted(bad))


def test_the_packages_are_found():
    assert sum(m.split(".")[0] != "bench" for m in MODULES) > 50, "the product's modules were not found"


def test_the_import_reader_sees_every_form():
    src = ("def f():\n    from bench.scaling import plan\nimport bench.halo\nimportlib.import_module('bench.mg')\n"
           "__import__('bench.gauge')\nfrom .geometry import Geometry\n")
    assert _dependencies("lattice.padded", ast.parse(src)) == {"bench.scaling.plan", "bench.halo", "bench.mg",
                                                              "bench.gauge", "lattice.geometry"}


def test_no_import_circles():
    assert not _cycles(_graph())


def test_cycle_finder_finds_a_circle():
    assert _cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}) == [["a.x", "a.y", "a.z"]]


def test_modules_and_functions_are_small():
    long_modules, long_functions = [], []
    for m, f in MODULES.items():
        src = f.read_text()
        if src.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{m} ({src.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{m}.{node.name} ({n} lines)")
    assert not long_modules and not long_functions, (long_modules, long_functions)


#: third-party packages a shipped module may import without them in [project] dependencies: the GPU extra's, and
#: matplotlib, whose absence hmc scaling report states ("plots skipped")
OPTIONAL_IMPORTS = {"cupy": "gpu", "cupyx": "gpu", "cuda": "gpu", "matplotlib": "test"}
DISTRIBUTION = {"mpi4py": "mpi4py", "numpy": "numpy", "h5py": "h5py", "mpmath": "mpmath", "scipy": "scipy"}


def test_every_third_party_import_is_installed_by_pip_install():
    """A plain ``pip install .`` brings every package the shipped modules import (issue 20: ``hmc solve --solver mg``
    ended in a ModuleNotFoundError traceback for scipy, which only the test extra installed)."""
    import re
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    missing = set()
    for m, f in MODULES.items():
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - set(LAYER):
                if top in OPTIONAL_IMPORTS:
                    assert OPTIONAL_IMPORTS[top] in project["optional-dependencies"], top
                elif DISTRIBUTION.get(top, top).lower() not in required:
                    missing.add(f"{top} ({m})")
    assert not missing, "imported but not in [project] dependencies: " + ", ".join(sorted(missing))
