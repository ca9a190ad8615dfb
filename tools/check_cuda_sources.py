"""Compile every CUDA kernel file of the project through :mod:`lattice.cuda_source` on a GPU and load each kernel.

Run on the device machine, next to the GPU suite::

    PYTHONPATH=. python3 tools/check_cuda_sources.py        # then: PYTHONPATH=. python3 -m pytest -m gpu

Finds every ``kernels/*.cu`` of the packages, compiles each variant (a templated file once per entry of
:data:`VARIANTS`) with the options the drivers use, looks up every ``extern "C" __global__`` kernel of it and prints
one line per variant. Exits 1 if a file fails to compile or load, or if a templated file has no entry in VARIANTS.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lattice import cuda_source, get_backend  # noqa: E402

PACKAGES = ("comms", "lattice", "solvers", "force", "hmc")


def _variants() -> dict:
    """{(package, file): [params, ...]} for the templated files: the tables their drivers compile from."""
    from solvers.multigrid.cuda import PRECISIONS

    return {("solvers.multigrid", "coarse.cu"): list(PRECISIONS.values())}


def kernel_packages() -> list[str]:
    """The packages (dotted names) that have a kernels/ folder with .cu files."""
    found = []
    for top in PACKAGES:
        for folder in sorted((ROOT / top).rglob(cuda_source.KERNEL_DIR)):
            if folder.is_dir() and any(folder.glob("*.cu")):
                found.append(".".join(folder.parent.relative_to(ROOT).parts))
    return found


def kernel_names(text: str) -> list[str]:
    """The extern "C" kernels a source defines, the names an INSTANTIATE(R, T, SUF) macro pastes together included."""
    names = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+(?:##\w+)?)\(', text)
    suffixes = re.findall(r"^INSTANTIATE\([^,]+,[^,]+,\s*(\w+)\)", text, re.MULTILINE)
    out = []
    for n in names:
        if "##" in n:
            out += [n.split("##")[0] + s for s in suffixes]
        else:
            out.append(n)
    return out


def check(backend, package: str, name: str, params) -> tuple[int, float]:
    text = cuda_source.source(package, name, params)
    t0 = time.perf_counter()
    kernels = kernel_names(text)
    for k in kernels:
        cuda_source.function(backend, package, name, k, params)
    return len(kernels), time.perf_counter() - t0


def main() -> int:
    backend = get_backend("cupy")
    variants = _variants()
    failures, total = 0, 0
    for package in kernel_packages():
        for name in cuda_source.kernel_files(package):
            templated = "${" in cuda_source.kernel_file(package, name).read_text()
            if templated and (package, name) not in variants:
                print(f"FAIL {package}/{name}: a template with no entry in VARIANTS (tools/check_cuda_sources.py)")
                failures += 1
                continue
            for params in variants.get((package, name), [None]):
                label = f"{package}/{name}" + (f" {params}" if params else "")
                try:
                    n, dt = check(backend, package, name, params)
                except Exception as e:                     # report every file, then fail
                    print(f"FAIL {label}: {type(e).__name__}: {e}")
                    failures += 1
                    continue
                total += n
                print(f"ok   {label}: {n} kernels, {dt:.2f} s, options {cuda_source.options(package, name)}")
    print(f"{total} kernels loaded, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
