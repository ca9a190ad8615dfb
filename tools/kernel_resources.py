"""Registers, stack and spills of every kernel of the project's CUDA files, from ptxas, without a GPU.

    PYTHONPATH=. python3 tools/kernel_resources.py [force/hisq_staged.cu ...] [--arch sm_90]

Compiles the text nvrtc compiles on the device (:func:`lattice.cuda_source.source`: the shared header inlined) with
``nvcc -cubin --resource-usage`` and the file's own options (:func:`lattice.cuda_source.resource_usage_command`), so the numbers
are those of the module CuPy builds (the same front end and ptxas; anything a kernel relies on, such as
``__launch_bounds__``, is in its source, never in the options). One line per kernel: registers, stack frame, spill
stores and loads in bytes. Arguments name files as ``package/file.cu`` (``force/hisq_staged.cu``); none: every
kernel file of the packages of tools/check_cuda_sources.py, a templated one in each variant listed there.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lattice import cuda_source  # noqa: E402

_ENTRY = re.compile(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill stores, "
                    r"(\d+) bytes spill loads\n.*?Used (\d+) registers", re.S)


def resources(package: str, name: str, arch: str = "sm_90", params=None) -> dict[str, dict[str, int]]:
    """{kernel: {registers, stack, spill_stores, spill_loads}} of one kernel file (variant ``params``) as ptxas
    reports it."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name
        src.write_text(cuda_source.source(package, name, params))
        cmd = cuda_source.resource_usage_command(package, name, src, Path(tmp) / "out.cubin", arch)
        run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"nvcc failed on {package}/{name}:\n{run.stderr}")
    return {m[0]: {"registers": int(m[4]), "stack": int(m[1]), "spill_stores": int(m[2]), "spill_loads": int(m[3])}
            for m in _ENTRY.findall(run.stdout + run.stderr)}


def _files(args) -> list[tuple[str, str, dict | None]]:
    """(package, file, params) for each variant of the files named (all files: none named), the variants those of
    tools/check_cuda_sources.py."""
    from tools.check_cuda_sources import _variants, kernel_packages

    named = ([(str(Path(a).parent).replace("/", "."), Path(a).name) for a in args] if args else
             [(p, f) for p in kernel_packages() for f in cuda_source.kernel_files(p)])
    variants = _variants()
    return [(p, f, params) for p, f in named for params in variants.get((p, f), [None])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="package/file.cu (default: every kernel file)")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)
    for package, name, params in _files(args.files):
        print(f"{package.replace('.', '/')}/{name} {params or ''} {cuda_source.options(package, name)} {args.arch}")
        for kernel, r in sorted(resources(package, name, args.arch, params).items()):
            print(f"  {kernel:28s} {r['registers']:4d} registers  stack {r['stack']:4d} B  "
                  f"spills {r['spill_stores']:4d} / {r['spill_loads']:4d} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
