"""What is particular to bench: the ``hmc`` command line offers ``bench`` and ``scaling`` through the command
registry (hmc.commands), in a checkout without an install; the packaging ships bench; and bench uses only the
product's public names. That no product module imports bench is the layering of tests/test_architecture.py."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, launch_env

PRODUCT = ("comms", "lattice", "solvers", "force", "hmc")


@pytest.mark.parametrize("argv,words", [(["--help"], ("bench", "scaling")),
                                        (["bench", "--help"], ("gauge", "halo", "dslash", "mg", "suite")),
                                        (["scaling", "--help"], ("--transports", "--graph", "--mps"))])
def test_cli_lists_bench_and_scaling(argv, words):
    r = subprocess.run([sys.executable, "-m", "hmc"] + argv, capture_output=True, text=True, cwd=ROOT,
                       env=launch_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    for w in words:
        assert w in r.stdout, f"{w!r} missing from hmc {' '.join(argv)}:\n{r.stdout}"


def test_registry_finds_the_checkout_provider():
    from hmc.commands import provider_modules

    assert "bench.commands" in provider_modules()


def test_pyproject_registers_the_provider():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["hmc.commands"]["bench"] == "bench.commands"
    assert "bench*" in meta["tool"]["setuptools"]["packages"]["find"]["include"]
    assert (Path(ROOT) / "bench" / "suites.toml").is_file()


def test_bench_imports_no_private_name_of_the_product():
    """The benchmarks use the product's public names (a capability such as ``lattice.geometry.device_engine``, not a
    private helper that sniffs a class name), so that the product can change its internals without breaking them."""
    bad = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in PRODUCT):
                bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_")]
    assert not bad, "private names of the product imported by bench:\n" + "\n".join(bad)
