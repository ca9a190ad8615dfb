"""The project's CUDA kernels: their source files, the nvrtc options and the cache of compiled modules.

Every kernel lives in a ``.cu`` file in the ``kernels/`` folder of the package that drives it (shipped as package
data, pyproject.toml), e.g. ``force/kernels/hisq.cu``. Each file starts with ``#include "hmc_common.cuh"``, the one
shared header (``lattice/kernels/hmc_common.cuh``: the precision traits, the 3x3 matrix type and the double2 complex
products). :func:`source` writes that header's text in place of the include line, so nvrtc gets one self-contained
text: no include path to pass, and CuPy's on-disk compile cache, keyed by the text and the options, is never stale
after an edit of the header. ``#line`` directives keep compiler messages pointing at the file and line they come from.

Templated files: a file compiled in several variants (solvers/multigrid/kernels/coarse.cu, once per precision)
writes ``${NAME}`` where a variant differs, kernel names included; :func:`source` substitutes ``params``
(``string.Template``), and each variant is its own module in the cache.

:func:`module` compiles a file once per backend (``Backend.kernels``, keyed by package, file and params) with its
:data:`OPTIONS`; :func:`function` is one kernel of it. The backend's ``xp.RawModule`` compiles: CuPy's on a GPU,
the host shim of the CPU tests (tests/force/cuda_host.py).
"""
from __future__ import annotations

import re
from importlib import resources
from string import Template

CXX14, CXX17 = "--std=c++14", "--std=c++17"
#: the nvrtc options of each kernel file, (package, file) -> options: the one place they are written. The C++ dialect
#: is the one each file was compiled with before the sources left the Python modules (nvrtc's default, C++17, where
#: none was given): the dialect changes the code nvrtc generates for some kernels (on nvrtc 13.0 for sm_90, hop_*
#: and pack_double at C++17, exp_update at C++14: the same arithmetic, other instruction choices), and CuPy's
#: complex.cuh (coarse.cu) needs C++17 with CUDA 13. fused_blas.cu compiles without contraction of a*b + c to fused
#: multiply-adds, so that its vector updates are bitwise NumPy's (solvers/blas_cuda.py); exact_sum.cu likewise, so
#: that its products are NumPy's (lattice/exact_sum_cuda.py).
OPTIONS = {
    ("lattice", "su3_exp.cu"): (CXX17,),
    ("lattice", "su3_taylor.cu"): (CXX17,),
    ("lattice", "su3_reunit.cu"): (CXX17,),
    ("solvers", "staggered_hop.cu"): (CXX14, "--fmad=false"),
    ("solvers", "fused_blas.cu"): (CXX14, "--fmad=false"),
    ("solvers", "graph_loop.cu"): (CXX17,),
    ("lattice", "exact_sum.cu"): (CXX17, "--fmad=false"),
    ("solvers.multigrid", "coarse.cu"): (CXX17,),
    ("solvers.multigrid", "coarse_half.cu"): (CXX17,),
    ("solvers.multigrid", "small_lstsq.cu"): (CXX17,),
    ("solvers.multigrid", "dense_products.cu"): (CXX17,),
    ("solvers.multigrid", "multi_dot.cu"): (CXX17,),
    ("force", "gauge_force.cu"): (CXX14,),
    ("force", "hisq.cu"): (CXX14,),
    ("force", "hisq_staged.cu"): (CXX17,),
    ("force", "hisq_staged_vjp.cu"): (CXX17,),
}
#: the shared header, in lattice/kernels/
HEADER = "hmc_common.cuh"
#: the sites a group of threads covers in the header's thread order (``lat::job``, ``LANES`` there): a launch over
#: F fields of V sites in that order has F x JOB_LANES x ceil(V / JOB_LANES) threads
JOB_LANES = 32
KERNEL_DIR = "kernels"

_INCLUDE = re.compile(r'^#include "([^"]+)"[ \t]*$', re.MULTILINE)


def kernel_file(package: str, name: str):
    """The file ``name`` in the kernels folder of ``package`` (e.g. "solvers.multigrid", "coarse.cu")."""
    path = resources.files(package).joinpath(KERNEL_DIR, name)
    if not path.is_file():
        raise FileNotFoundError(f"no CUDA source {name!r} in {package}/{KERNEL_DIR}: the file is missing from the "
                                "installation (pyproject.toml package-data must list kernels/*.cu)")
    return path


def kernel_files(package: str) -> list[str]:
    """The names of the ``.cu`` files in the kernels folder of ``package``, sorted."""
    folder = resources.files(package).joinpath(KERNEL_DIR)
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".cu")) if folder.is_dir() else []


def header_text() -> str:
    return kernel_file("lattice", HEADER).read_text()


def source(package: str, name: str, params: dict | None = None) -> str:
    """The text nvrtc compiles for the kernel file ``name`` of ``package``: ``${...}`` placeholders replaced by
    ``params``, then the shared header in place of its include line (``#line`` directives around it)."""
    text = kernel_file(package, name).read_text()
    try:
        text = Template(text).substitute(params or {})
    except KeyError as e:
        raise ValueError(f"{package}/{KERNEL_DIR}/{name} is a template: give params with {e.args[0]!r}") from None
    includes = list(_INCLUDE.finditer(text))
    if [m.group(1) for m in includes] != [HEADER]:
        raise ValueError(f"{package}/{KERNEL_DIR}/{name} must include {HEADER!r} once and no other quoted header "
                         f"(found {[m.group(1) for m in includes]})")
    m = includes[0]
    after = text.count("\n", 0, m.end()) + 2           # the line after the include, 1-based
    inlined = (f'#line 1 "{HEADER}"\n' + header_text().rstrip("\n") + "\n"
               + f'#line {after} "{package.replace(".", "/")}/{KERNEL_DIR}/{name}"')
    return text[:m.start()] + inlined + text[m.end():]


def options(package: str, name: str) -> tuple:
    """The nvrtc options of the kernel file ``name`` of ``package`` (:data:`OPTIONS`)."""
    if (package, name) not in OPTIONS:
        raise KeyError(f"{package}/{KERNEL_DIR}/{name} has no nvrtc options: add it to lattice.cuda_source.OPTIONS")
    return OPTIONS[(package, name)]


def resource_usage_command(package: str, name: str, path, cubin, arch: str = "sm_90") -> list[str]:
    """The nvcc command that compiles ``path`` (a file holding :func:`source`'s text of ``name``) with the file's
    nvrtc options for ``arch`` into ``cubin`` and prints ptxas's registers, stack and spills per kernel
    (tools/kernel_resources.py): the same front end and ptxas as nvrtc on the device, no GPU needed."""
    return ["nvcc", f"-arch={arch}", "-cubin", "--resource-usage", "-o", str(cubin), *options(package, name), str(path)]


def module(backend, package: str, name: str, params: dict | None = None):
    """The compiled kernel file ``name`` of ``package`` (variant ``params``), built once per backend."""
    key = ("cuda_module", package, name, tuple(params.items()) if params else None)
    return backend.kernel(key, lambda: backend.xp.RawModule(code=source(package, name, params),
                                                            options=options(package, name)))


def ptx_function(backend, ptx: str, kernel: str):
    """The kernel ``kernel`` of the PTX text ``ptx``, loaded by the driver's JIT compiler (a CuPy RawModule of a
    temporary .ptx file), once per backend: for the few kernels that call driver builtins nvrtc's front end may not
    declare (solvers/krylov_while.py: ``cudaGraphSetConditional``)."""
    import os
    import tempfile

    def build():
        fd, path = tempfile.mkstemp(suffix=".ptx")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(ptx)
            return backend.xp.RawModule(path=path).get_function(kernel)
        finally:
            os.unlink(path)
    return backend.kernel(("cuda_ptx_function", kernel, hash(ptx)), build)


def function(backend, package: str, name: str, kernel: str, params: dict | None = None):
    """The kernel ``kernel`` of :func:`module`, looked up once per backend. Drivers call this per launch, so a hit
    is one dictionary lookup keyed by the kernel's name; a templated file's kernel names must therefore differ
    from variant to variant (coarse.cu: ``mg_stencil_${SUF}``), which is checked."""
    key = ("cuda_function", package, name, kernel)
    hit = backend.kernels.get(key)
    if hit is None:
        hit = backend.kernel(key, lambda: (module(backend, package, name, params).get_function(kernel), params))
    if hit[1] is not params and hit[1] != params:
        raise ValueError(f"{package}/{KERNEL_DIR}/{name}: kernel {kernel!r} asked for with params {params} and "
                         f"{hit[1]}: give each variant's kernels their own names (a ${{...}} in the name)")
    return hit[0]
