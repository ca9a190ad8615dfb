"""Run a CuPy RawModule's CUDA source on the host: the kernels compiled as C++ (g++) with a small CUDA shim and
launched through ctypes, one "thread" after another. Lets the CPU test suite check the kernels' arithmetic and
indexing against the NumPy twins where no GPU is present (tests/force/test_hisq_cuda_host.py).

``FakeCuPy`` stands in for the cupy module (NumPy underneath, plus ``RawModule``), so the Python drivers of the
kernels run unchanged with a ``Backend("cupy", FakeCuPy())``.

Two ways to run a launch. By default a launch of ``grid x block`` threads runs as that many blocks of one thread,
one after another (``blockIdx.x`` = the thread's number, ``blockDim.x`` = 1): enough for kernels whose threads do not
cooperate, and ``__syncthreads`` does nothing. ``FakeCuPy(blocks=True)`` runs each block as ``block`` threads at once
(std::thread; C++20) with a barrier for ``__syncthreads`` and ``__shared__`` memory shared by the block's threads,
blocks one after another; a thread that returns leaves the barrier, as an exited GPU thread no longer counts at
``__syncthreads``. That serves kernels whose threads share work through shared memory."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

TYPES = r"""
#include <math.h>
struct double2 { double x, y; };
struct float2 { float x, y; };
struct short2 { short x, y; };
static inline double2 make_double2(double a, double b) { double2 r; r.x = a; r.y = b; return r; }
template <class T> static inline T __ldg(const T *p) { return *p; }
struct Idx { long x; };
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static
"""
HEADER = TYPES + r"""
static Idx blockIdx = {0}, threadIdx = {0}, blockDim = {1};
static inline void __syncthreads() {}
"""
#: FakeCuPy(blocks=True): a block's threads at once, __syncthreads a barrier (module docstring)
BLOCK_HEADER = r"""
#include <barrier>
#include <thread>
#include <vector>
""" + TYPES + r"""
static thread_local Idx blockIdx = {0}, threadIdx = {0};
static Idx blockDim = {1};
static std::barrier<> *hmc_block_barrier = nullptr;
static inline void __syncthreads() { hmc_block_barrier->arrive_and_wait(); }
"""
_CTYPES = {"double": ctypes.c_double, "float": ctypes.c_float, "int": ctypes.c_int, "long": ctypes.c_long}
_BUILD = Path(tempfile.gettempdir()) / "hmc_cuda_host"


def compiler_available() -> bool:
    return shutil.which("g++") is not None


#: the marker of the tests that compile the kernels for the host
needs_gxx = pytest.mark.skipif(not compiler_available(), reason="needs g++ to compile the kernels for the host")


def _serial_launcher(name, params, names):
    return (f'extern "C" void launch_{name}(long nthr, {params}) {{ for (long i = 0; i < nthr; ++i) '
            f'{{ blockIdx.x = i; {name}({", ".join(names)}); }} }}')


def _block_launcher(name, params, names):
    """Blocks one after another, each as nthreads std::threads sharing a barrier (BLOCK_HEADER)."""
    return (f'extern "C" void launch_{name}(long nblocks, long nthreads, {params}) {{\n'
            f'  blockDim.x = nthreads;\n'
            f'  for (long b = 0; b < nblocks; ++b) {{\n'
            f'    std::barrier<> bar(nthreads);\n'
            f'    hmc_block_barrier = &bar;\n'
            f'    std::vector<std::thread> team;\n'
            f'    for (long t = 0; t < nthreads; ++t)\n'
            f'      team.emplace_back([&, b, t] {{ blockIdx.x = b; threadIdx.x = t; {name}({", ".join(names)}); '
            f'bar.arrive_and_drop(); }});\n'
            f'    for (auto &member : team) member.join();\n'
            f'  }}\n'
            f'  hmc_block_barrier = nullptr; blockDim.x = 1;\n'
            f'}}')


def _build(source: str, blocks: bool = False):
    kernels = re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)', source)
    wrappers, sigs = [], {}
    launcher = _block_launcher if blocks else _serial_launcher
    for name, params in kernels:
        ps = [p.strip() for p in params.split(",")]
        names = [re.findall(r"(\w+)$", p)[0] for p in ps]
        sigs[name] = [ctypes.c_void_p if "*" in p else _CTYPES[p.split()[-2]] for p in ps]
        wrappers.append(launcher(name, params, names))
    code = (BLOCK_HEADER if blocks else HEADER) + source + "\n" + "\n".join(wrappers)
    key = hashlib.sha1(code.encode()).hexdigest()[:16]
    _BUILD.mkdir(exist_ok=True)
    lib = _BUILD / f"k_{key}.so"
    if not lib.exists():
        src = _BUILD / f"k_{key}.cpp"
        src.write_text(code)
        tmp = _BUILD / f"k_{key}.{np.random.randint(1 << 30)}.so"
        extra = ["-std=c++20", "-pthread"] if blocks else []
        subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-w", *extra, "-o", str(tmp), str(src)], check=True)
        tmp.replace(lib)
    return ctypes.CDLL(str(lib)), sigs


class _Function:
    def __init__(self, so, name, argtypes, blocks=False):
        self.f = getattr(so, "launch_" + name)
        self.f.argtypes = [ctypes.c_long] * (2 if blocks else 1) + argtypes
        self.argtypes, self.blocks = argtypes, blocks

    def __call__(self, grid, block, args):
        if len(args) != len(self.argtypes):
            raise TypeError(f"{len(args)} arguments for {len(self.argtypes)} parameters")
        conv = []
        for a, t in zip(args, self.argtypes):
            if t is ctypes.c_void_p and isinstance(a, int) and a == 0:
                conv.append(ctypes.c_void_p(None))       # a null pointer (an optional field left out)
            elif t is ctypes.c_void_p:
                if not isinstance(a, np.ndarray) or not a.flags.c_contiguous:
                    raise TypeError("a pointer argument must be a C-contiguous NumPy array")
                conv.append(ctypes.c_void_p(a.ctypes.data))
            else:
                conv.append(t(a.item() if hasattr(a, "item") else a))
        if self.blocks:
            self.f(int(grid[0]), int(block[0]), *conv)
        else:
            self.f(int(grid[0]) * int(block[0]), *conv)


class RawModule:
    def __init__(self, code, options=(), blocks=False):
        self.so, self.sigs = _build(code, blocks)
        self.blocks = blocks

    def get_function(self, name):
        return _Function(self.so, name, self.sigs[name], self.blocks)


class FakeCuPy(types.ModuleType):
    """NumPy under cupy's name, with RawModule compiled for the host."""

    RawModule = RawModule

    def __init__(self, blocks: bool = False):
        super().__init__("cupy_host_shim")
        if blocks:                                  # each block's threads at once (module docstring)
            self.RawModule = functools.partial(RawModule, blocks=True)

    def __getattr__(self, name):
        return getattr(np, name)


# --- shared by the tests of the kernels on halo-padded links (test_gauge_force_padded, test_hisq_smearing_padded)
def smooth_links(geom, seed=4):
    """Links near the identity from counter-based random numbers keyed by global site: every decomposition holds
    the local part of the same global field. NumPy."""
    from lattice import CounterRNG, su3

    rng = CounterRNG(seed)
    w = rng.gaussian("s", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    return np.ascontiguousarray(su3.expm_su3(np.moveaxis(su3.algebra_from_coefficients(0.4 * w), -3, 0)))


def rel(a, b):
    """max |a - b| / max |b|."""
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


def single_rank_geometry(dims, backend="numpy"):
    """The whole lattice on this process alone (its own one-rank communicator, nothing partitioned): the reference
    a worker rank computes under mpiexec to compare its part with."""
    from comms import ProcessGrid
    from comms.grid import _SingleComm
    from lattice import Geometry, get_backend

    grid = ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4)
    return Geometry(dims, get_backend(backend), grid)


@contextmanager
def forced_partition(monkeypatch, partition):
    """A one-process grid with ``partition`` (e.g. "xt") treated as partitioned, the halo path staging the stand-in
    CuPy's faces as NumPy arrays (:func:`host_staging`); the grid is closed on leaving."""
    from comms import ProcessGrid
    from lattice import geometry

    monkeypatch.setattr(geometry, "_staging", host_staging)
    grid = ProcessGrid((1, 1, 1, 1), partitioned=partition)
    try:
        yield grid
    finally:
        grid.close()


def host_staging(geom):
    """Stand-in for lattice.geometry._staging: the stand-in CuPy's arrays are NumPy arrays, which a CPU halo engine
    takes as they are (the geometry would otherwise stage "CuPy" faces through the host with ``.get()``, which NumPy
    arrays lack)."""
    return "numpy"
