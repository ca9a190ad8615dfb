"""The CUDA kernels live in .cu files shipped as package data, each including the one shared header, compiled with
options written in one place (lattice/cuda_source.py); no Python module holds kernel source any more."""
from __future__ import annotations

import ast
import fnmatch
import re
import tomllib
from pathlib import Path

import pytest

from lattice import cuda_source

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("comms", "lattice", "solvers", "force", "hmc", "bench")


def _kernel_sources() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.cu"))


def _python_modules() -> list[Path]:
    return sorted(p for top in PACKAGES + ("tools",) for p in (ROOT / top).rglob("*.py"))


def _package_of(path: Path) -> str:
    """The dotted package whose kernels/ folder holds ``path``."""
    assert path.parent.name == cuda_source.KERNEL_DIR, f"{path}: kernel sources belong in a package's kernels/ folder"
    return ".".join(path.parent.parent.relative_to(ROOT).parts)


def test_every_kernel_file_is_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    files = _kernel_sources() + sorted(ROOT.glob("*/kernels/*.cuh"))
    assert len(files) >= 9
    for f in files:
        package = _package_of(f)
        rel = f.relative_to(ROOT / package.replace(".", "/")).as_posix()
        assert any(fnmatch.fnmatch(rel, pat) for pat in data.get(package, [])), \
            f"{f.relative_to(ROOT)} is not in pyproject.toml's [tool.setuptools.package-data] {package!r}"
        assert f.name.endswith(".cuh") or f.name in cuda_source.kernel_files(package)


def test_each_kernel_file_includes_the_shared_header_and_no_other_local_one():
    header = ROOT / "lattice" / cuda_source.KERNEL_DIR / cuda_source.HEADER
    assert header.is_file()
    for f in _kernel_sources():
        includes = re.findall(r'^#include "([^"]+)"', f.read_text(), re.MULTILINE)
        assert includes == [cuda_source.HEADER], f"{f.relative_to(ROOT)} includes {includes}"


def test_the_compiled_text_holds_the_header_in_place_of_its_include():
    text = cuda_source.source("force", "hisq.cu")
    assert not re.search(r'^#include "', text, re.MULTILINE) and cuda_source.header_text().strip() in text
    assert text.count("struct M3 { double2 e[9]; };") == 1           # declared once, in the header
    assert '#line 5 "force/kernels/hisq.cu"' in text                 # messages point at the kernel file's lines


def test_templated_file_needs_its_params():
    from solvers.multigrid.cuda import PRECISIONS

    with pytest.raises(ValueError, match="template"):
        cuda_source.source("solvers.multigrid", "coarse.cu")
    for params in PRECISIONS.values():
        text = cuda_source.source("solvers.multigrid", "coarse.cu", params)
        assert "${" not in text and f"void mg_stencil_{params['SUF']}(const {params['C']}* __restrict__ Y" in text


def test_compiled_once_per_backend_and_variant():
    from lattice.backend import Backend
    from solvers.multigrid.cuda import PRECISIONS

    built = []

    class Compiler:
        class RawModule:
            def __init__(self, code, options):
                built.append((code, options))

            def get_function(self, kernel):
                return (kernel, len(built))

    be = Backend("cupy", Compiler())
    double, single = PRECISIONS.values()
    for _ in range(2):
        assert cuda_source.function(be, "force", "hisq.cu", "staple_fwd") == ("staple_fwd", 1)
        assert cuda_source.function(be, "force", "hisq.cu", "naik_fwd") == ("naik_fwd", 1)
        assert cuda_source.function(be, "solvers.multigrid", "coarse.cu", "mg_stencil_c128", double)[1] == 2
        assert cuda_source.function(be, "solvers.multigrid", "coarse.cu", "mg_stencil_c64", single)[1] == 3
    assert len(built) == 3 and built[0][1] == cuda_source.options("force", "hisq.cu")
    with pytest.raises(ValueError, match="own names"):          # one kernel name, two variants: refused
        cuda_source.function(be, "solvers.multigrid", "coarse.cu", "mg_stencil_c128", single)


def test_a_missing_kernel_file_is_named():
    with pytest.raises(FileNotFoundError, match="nothing.cu"):
        cuda_source.source("force", "nothing.cu")


def _string_constants(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def test_no_python_module_holds_kernel_source():
    """A string with a __global__ declaration and a body ({) is kernel source; names and patterns may mention it."""
    held = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in _python_modules() for n in _string_constants(p)
            if "__global__" in n.value and "{" in n.value]
    assert not held, f"kernel source in Python strings (move it to a kernels/*.cu file): {held}"


def test_nvrtc_options_and_compiles_live_in_cuda_source_only():
    owner = ROOT / "lattice" / "cuda_source.py"
    options = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in _python_modules() if p != owner
               for n in _string_constants(p) if re.match(r"-(-std|std|-fmad|fmad|I|D|arch|-gpu-architecture)", n.value)]
    assert not options, f"nvrtc options outside lattice/cuda_source.py: {options}"
    compiles = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in _python_modules() if p != owner
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Attribute)
                and n.attr in ("RawModule", "RawKernel", "compile_with_cache")]
    assert not compiles, f"kernels compiled outside lattice/cuda_source.py: {compiles}"
    assert sum("--std=c++14" in n.value for n in _string_constants(owner)) == 1
    files = {(_package_of(f), f.name) for f in _kernel_sources()}
    assert set(cuda_source.OPTIONS) == files, "every kernel file, and only those, has its nvrtc options"
    with pytest.raises(KeyError, match="add it to lattice.cuda_source.OPTIONS"):
        cuda_source.options("force", "nothing.cu")
