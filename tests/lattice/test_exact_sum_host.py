"""The exact-sum kernels (lattice/kernels/exact_sum.cu) run on the host against their twin (comms/superacc.py).

The kernel file is compiled as C++20 (g++) with a CUDA shim in which every thread of a block is a std::thread:
__syncthreads is a barrier of the block, the warp shuffles and warp reductions are barriers of 32 threads around an
exchange buffer, the atomics are the compiler's, and blocks run one after another. So the register windows, the
warp merges, the shared and global atomics, the last block's clearing of the scratch and the rounding all run as
written, on the CPU; the GPU tests (test_exact_sum_gpu.py) repeat the comparison on the device."""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from comms import reduce as R
from comms import superacc as S
from lattice import cuda_source
from lattice.backend import Backend
from lattice.exact_sum_cuda import ExactReducer, accumulator, device_parts, round_records, twin_records

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the kernels for the host")

SHIM = r"""
#include <atomic>
#include <barrier>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
struct double2 { double x, y; };
struct float2 { float x, y; };
static inline double2 make_double2(double a, double b) { double2 r; r.x = a; r.y = b; return r; }
template <class T> static inline T __ldg(const T *p) { return *p; }
struct Dim { unsigned x; };
static Dim blockIdx, blockDim, gridDim;
static thread_local Dim threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
typedef unsigned long long u64_;
static std::unique_ptr<std::barrier<>> block_bar;
static std::vector<std::unique_ptr<std::barrier<>>> warp_bar;
static u64_ warp_buf[64][32];
static inline void __syncthreads() { block_bar->arrive_and_wait(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    u64_ b = 0; std::memcpy(&b, &v, sizeof(T)); warp_buf[w][l] = b;
    warp_bar[w]->arrive_and_wait();
    T r; std::memcpy(&r, &warp_buf[w][l ^ o], sizeof(T));
    warp_bar[w]->arrive_and_wait();
    return r;
}
static unsigned warp_fold(unsigned v, bool is_max) {
    const unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    warp_buf[w][l] = v;
    warp_bar[w]->arrive_and_wait();
    unsigned r = is_max ? 0 : 0;
    for (int i = 0; i < 32; ++i) r = is_max ? (r > warp_buf[w][i] ? r : (unsigned)warp_buf[w][i])
                                            : (r | (unsigned)warp_buf[w][i]);
    warp_bar[w]->arrive_and_wait();
    return r;
}
static unsigned __reduce_max_sync(unsigned, unsigned v) { return warp_fold(v, true); }
static unsigned __reduce_or_sync(unsigned, unsigned v) { return warp_fold(v, false); }
static inline u64_ atomicAdd(u64_ *p, u64_ v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline u64_ atomicOr(u64_ *p, u64_ v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline u64_ atomicExch(u64_ *p, u64_ v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicInc(unsigned *p, unsigned m) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(p, &old, old >= m ? 0 : old + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
static inline long long __double_as_longlong(double x) { long long r; std::memcpy(&r, &x, 8); return r; }
static inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }
static inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
static void run_grid(long grid, long block, const std::function<void()> &body) {
    gridDim.x = grid; blockDim.x = block;
    block_bar.reset(new std::barrier<>(block));
    warp_bar.clear();
    for (long w = 0; w < block / 32; ++w) warp_bar.emplace_back(new std::barrier<>(32));
    for (long b = 0; b < grid; ++b) {
        blockIdx.x = b;
        std::vector<std::thread> ts;
        for (long t = 0; t < block; ++t) ts.emplace_back([t, &body] { threadIdx.x = t; body(); });
        for (auto &t : ts) t.join();
    }
}
"""
_CTYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong}
_BUILD = Path(tempfile.gettempdir()) / "hmc_exact_sum_host"


def compile_host(source: str) -> dict:
    """{kernel name: its host launcher f(grid, block, *args)} of a kernel source, compiled once per text."""
    kernels = re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', source)
    wrappers, sigs = [], {}
    for name, params in kernels:
        ps = [" ".join(p.split()) for p in params.split(",")]
        names = [re.findall(r"(\w+)$", p)[0] for p in ps]
        sigs[name] = [ctypes.c_void_p if "*" in p else _CTYPES[p.rsplit(" ", 1)[0]] for p in ps]
        wrappers.append(f'extern "C" void launch_{name}(long grid, long block, {params}) {{ '
                        f'run_grid(grid, block, [&] {{ {name}({", ".join(names)}); }}); }}')
    code = SHIM + source + "\n" + "\n".join(wrappers)
    _BUILD.mkdir(exist_ok=True)
    so = _BUILD / f"k_{hashlib.sha1(code.encode()).hexdigest()[:16]}.so"
    if not so.exists():
        src = so.with_suffix(".cpp")
        src.write_text(code)
        tmp = so.with_suffix(f".{np.random.randint(1 << 30)}.tmp")
        subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", "-pthread", "-o", str(tmp), str(src)],
                       check=True)
        tmp.replace(so)
    handle = ctypes.CDLL(str(so))
    fns = {}
    for name, argtypes in sigs.items():
        f = getattr(handle, "launch_" + name)
        f.argtypes = [ctypes.c_long, ctypes.c_long] + argtypes
        fns[name] = f
    return fns


@pytest.fixture(scope="module")
def lib():
    return compile_host(cuda_source.source("lattice", "exact_sum.cu"))


class _HostKernel:
    """A kernel called as CuPy calls a RawModule's function: (grid, block, args), arrays as pointers."""

    def __init__(self, f):
        self.f = f

    def __call__(self, grid, block, args):
        conv = []
        for a in args:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous, "a pointer argument must be a C-contiguous array"
                conv.append(ptr(a))
            else:
                conv.append(None if isinstance(a, np.uintp) and int(a) == 0 else a.item())
        self.f(int(grid[0]), int(block[0]), *conv)


class HostCuPy(types.ModuleType):
    """NumPy under cupy's name, with RawModule compiled for the host and a one-SM device: the driver
    (lattice/exact_sum_cuda.py) runs unchanged on a Backend("cupy", HostCuPy())."""

    def __init__(self):
        super().__init__("cupy_exact_sum_host")
        device = types.SimpleNamespace(id=0)
        self.cuda = types.SimpleNamespace(
            Device=lambda: device,
            runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"multiProcessorCount": 1}))

    def RawModule(self, code, options=()):
        assert "--fmad=false" in options
        fns = compile_host(code)
        return types.SimpleNamespace(get_function=lambda name: _HostKernel(fns[name]))

    def __getattr__(self, name):
        return getattr(np, name)


def ptr(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


class HostReducer:
    """The kernels' launch protocol on the host: scratch and counter zeroed once and checked to stay zero."""

    def __init__(self, lib, grid, block):
        self.lib, self.grid, self.block = lib, grid, block
        self.scratch = np.zeros((2, S.WIDTH), dtype=np.uint64)
        self.counter = np.zeros(1, dtype=np.uint32)

    def reduce(self, a, b=None, rounded=True):
        suffix = "f64" if a.dtype == np.complex128 else "f32"
        nq = 1 if b is None else 2
        out = np.full((nq, S.WIDTH), -7, dtype=np.int64)
        result = np.full(nq, np.nan) if rounded else None
        fields = (ptr(a),) if b is None else (ptr(a), ptr(b))
        name = "exact_norm2" if b is None else "exact_norm2_redot"
        self.lib[f"{name}_{suffix}"](self.grid, self.block, *fields, a.size, ptr(self.scratch), ptr(self.counter),
                                     ptr(out), ptr(result))
        assert not self.scratch.any() and self.counter[0] == 0, "a launch must leave its scratch and counter zero"
        return out, result


def round_host(lib, accs, nq):
    result, total = np.full(nq, np.nan), np.zeros((nq, S.WIDTH), dtype=np.int64)
    accs = np.ascontiguousarray(accs, dtype=np.int64)
    lib["exact_round"](1, 128, ptr(accs), accs.shape[0], nq, ptr(result), ptr(total))
    return result, total


def bits(x):
    return np.asarray(x, dtype=np.float64).view(np.int64)


def field(rng, n, dtype, spread=0):
    a = rng.standard_normal((n, 3)) + 1j * rng.standard_normal((n, 3))
    if spread:
        a *= np.exp2(rng.integers(-spread, spread, (n, 3)))
    return a.astype(dtype)


def reference(a, b):
    """geom.sum's exact sums of the products of solvers/operator.py's exact mode (comms.reduce)."""
    n2 = R.exact_sum(a.real * a.real + a.imag * a.imag)
    return np.array([n2, R.exact_sum(a.real * b.real + a.imag * b.imag)])


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("grid,block,spread", [(1, 32, 0), (3, 64, 0), (2, 64, 200), (5, 32, 500)])
def test_kernels_equal_the_twin_and_reduce(lib, dtype, grid, block, spread):
    rng = np.random.default_rng(grid * 1000 + block + spread)
    n = 4 ** 4 // 2                                          # a 4^4 half-lattice of colour vectors
    if dtype == np.complex64:
        spread = min(spread, 60)
    a, b = field(rng, n, dtype, spread), field(rng, n, dtype, spread)
    red = HostReducer(lib, grid, block)
    out, result = red.reduce(a, b)
    assert np.array_equal(out, twin_records(a, b))
    assert np.array_equal(bits(result), bits(reference(a, b)))
    out1, result1 = red.reduce(a)
    assert np.array_equal(out1, twin_records(a)) and bits(result1[0]) == bits(result[0])


def even_parity(rng, dims, dtype):
    """A full-lattice colour field (nt, nz, ny, nx, 3) with zeros on the odd sites, as the even-odd solvers keep
    their fields."""
    nx, ny, nz, nt = dims
    t, z, y, x = np.indices((nt, nz, ny, nx))
    a = field(rng, nt * nz * ny * nx, dtype).reshape(nt, nz, ny, nx, 3)
    a[(t + z + y + x) % 2 == 1] = 0
    return a


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_full_lattice_fields_with_an_empty_parity(lib, dtype):
    rng = np.random.default_rng(4)
    a, b = even_parity(rng, (4, 4, 4, 4), dtype), even_parity(rng, (4, 4, 4, 4), dtype)
    out, result = HostReducer(lib, 4, 64).reduce(a, b)
    assert np.array_equal(out, twin_records(a, b))
    assert np.array_equal(bits(result), bits(reference(a, b)))


def test_edge_values_through_the_atomic_path(lib):
    """Values far outside the warps' register windows, subnormals, cancellation to zero and a huge redot."""
    tiny, big = 5e-324, 1e150
    a = np.array([[1.0, 1e-160j, tiny, 3e150, 2.0 ** -1060, 1e-300 + 1e-310j]] * 11, dtype=np.complex128)
    b = np.array([[-1.0, 1e160j, 1e300, -big, 1.0, 1e200]] * 11, dtype=np.complex128)
    out, result = HostReducer(lib, 2, 32).reduce(a, b)
    assert np.array_equal(out, twin_records(a, b))
    assert np.array_equal(bits(result), bits(reference(a, b)))
    c = np.concatenate([a, -a]).ravel()
    out, result = HostReducer(lib, 3, 32).reduce(c, np.concatenate([b, b]).ravel())
    assert bits(result[1]) == bits(0.0) and out[1].sum() == 0


def test_non_finite_products_are_flagged(lib):
    a = np.array([1.0, 1e200, 2.0], dtype=np.complex128)   # |1e200|^2 overflows to inf
    b = np.array([np.nan, 1.0, 1.0], dtype=np.complex128)
    out, result = HostReducer(lib, 1, 32).reduce(a, b)
    assert out[0, S.FLAGS] == S.POS_INF and out[1, S.FLAGS] == S.NAN
    assert result[0] == np.inf and np.isnan(result[1])


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_rank_records_round_to_the_whole_sum(lib, parts):
    rng = np.random.default_rng(parts)
    a, b = field(rng, 128, np.complex128, 30), field(rng, 128, np.complex128, 30)
    pieces = np.array_split(np.arange(128), parts)
    red = HostReducer(lib, 2, 64)
    recs = [red.reduce(a[p], b[p], rounded=False)[0] for p in pieces]
    order = rng.permutation(parts)
    result, total = round_host(lib, np.stack([recs[i] for i in order]), 2)
    whole = twin_records(a, b)
    assert np.array_equal(total, whole)
    assert np.array_equal(bits(result), bits([S.to_float(whole[0]), S.to_float(whole[1])]))
    assert np.array_equal(bits(result), bits(reference(a, b)))


def test_rounding_edges_in_the_round_kernel(lib):
    """Ties, subnormals and overflow rounded by the kernel as by the twin."""
    cases = [[1.0, 2.0 ** -53], [1.0 + 2.0 ** -52, 2.0 ** -53], [1.0, 2.0 ** -53, 5e-324], [5e-324] * 3,
             [2.2250738585072014e-308, -5e-324], [1.7976931348623157e308] * 2, [-1.7976931348623157e308] * 2,
             [1.7976931348623157e308, 1.7976931348623157e308 * 2.0 ** -54 * (1 - 2.0 ** -52)], [0.0], [-3.0, 1.0]]
    for values in cases:
        rec = S.accumulate(np.array(values))
        result, total = round_host(lib, rec[None, None, :], 1)
        assert np.array_equal(total[0], rec)
        assert bits(result[0]) == bits(S.to_float(rec)), values


def test_the_driver_on_the_host():
    """lattice/exact_sum_cuda.py's checks, launch configuration and buffers, with the host-compiled kernels."""
    be = Backend("cupy", HostCuPy())
    red = ExactReducer(be)
    rng = np.random.default_rng(9)
    for n, dtype in ((4 ** 4 // 2, np.complex128), (8 ** 4 // 2, np.complex64)):
        a, b = field(rng, n, dtype, 20), field(rng, n, dtype, 20)
        assert red.blocks(a.size) == min(-(-a.size // 2048), 3)
        out, res = accumulator(np, 2), np.zeros(2)
        red.norm2_redot(a, b, out, res)
        assert np.array_equal(out, twin_records(a, b)) and np.array_equal(bits(res), bits(reference(a, b)))
        out1 = accumulator(np, 1)
        red.norm2(a, out1)
        assert np.array_equal(out1[0], out[0]) and not red.scratch.any() and red.counter[0] == 0
        accs = np.stack([out, out])
        total = accumulator(np, 2)
        round_records(be, accs, res, total)
        twice = np.stack([S.add(out[q], out[q]) for q in range(2)])
        assert np.array_equal(total, twice)
        assert np.array_equal(bits(res), bits([S.to_float(twice[0]), S.to_float(twice[1])]))
    empty, res1 = accumulator(np, 1), np.full(1, np.nan)
    red.norm2(np.zeros(0, dtype=np.complex128), empty, res1)
    assert not empty.any() and bits(res1[0]) == bits(0.0)
    with pytest.raises(TypeError, match="complex128 or complex64"):
        red.norm2(np.ones(4), accumulator(np, 1))
    with pytest.raises(ValueError, match="C-contiguous"):
        red.norm2(np.ones((4, 2), dtype=complex)[:, 0], accumulator(np, 1))
    with pytest.raises(ValueError, match="shape \\(2, 68\\)"):
        red.norm2_redot(a, b, accumulator(np, 1))
    with pytest.raises(ValueError, match="one precision"):
        red.norm2_redot(a, b.astype(np.complex128), accumulator(np, 2))
    with pytest.raises(ValueError, match="give result"):
        round_records(be, np.stack([out, out]), None)


def test_device_parts_are_the_host_parts_of_geometry_sum():
    """Geometry.sum's device path (lattice.exact_sum_cuda.device_parts: exact_sum_f64 over the real and imaginary
    parts) gives comms.reduce.local_parts exactly, so the rounded global sum is bitwise the host's: real and complex
    arrays, wide exponent spreads, subnormals, cancellation and non-finite values."""
    be = Backend("cupy", HostCuPy())
    rng = np.random.default_rng(17)
    cases = [field(rng, 600, np.complex128, 300), field(rng, 600, np.complex128, 0).real.copy(),
             np.array([1e308, 1e308, -1e308, 5e-324, -2.5e-320, 1.0, -1.0]),
             np.array([3.0, -np.inf, 1.0]), np.array([np.inf, 2.0, -np.inf]), np.array([np.nan, 1.0]),
             np.zeros((4, 4, 3)), np.ones(7) * 0.1]
    for a in cases:
        got, want = device_parts(be, a), R.local_parts(a)
        if want[0][0] == "nonfinite":
            assert got[0][0] == "nonfinite"           # NaN's sign bit is NumPy's choice: compare NaN as NaN
            assert np.isnan(got[0][1]) if np.isnan(want[0][1]) else bits(got[0][1]) == bits(want[0][1])
            continue
        assert got == want, a
        re = R.combine([got[0]])
        assert bits(re) == bits(R.combine([want[0]]))
    with pytest.raises(TypeError, match="float64 array"):
        ExactReducer(be).sum(np.ones(4, dtype=np.float32), accumulator(np, 1))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA toolkit) to compile for sm_90")
def test_the_kernel_file_compiles_for_the_h200_without_contraction(tmp_path):
    """nvcc with the file's nvrtc options (lattice.cuda_source.OPTIONS) for sm_90: it compiles, and no product is
    contracted into a fused multiply-add (the products must be NumPy's)."""
    src = tmp_path / "exact_sum.cu"
    src.write_text(cuda_source.source("lattice", "exact_sum.cu"))
    ptx = tmp_path / "exact_sum.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "-ptx", *cuda_source.options("lattice", "exact_sum.cu"), "-o", str(ptx),
                    str(src)], check=True, timeout=600)
    text = ptx.read_text()
    for kernel in ("exact_norm2_f64", "exact_norm2_f32", "exact_norm2_redot_f64", "exact_norm2_redot_f32",
                   "exact_sum_f64", "exact_round"):
        assert f".entry {kernel}(" in text
    assert "fma." not in text


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
scaled = st.builds(lambda m, e: float(np.ldexp(m, e)), st.floats(-1.0, 1.0), st.integers(-1080, 1023))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(finite, scaled), min_size=1, max_size=200), st.integers(1, 3))
def test_any_doubles_through_the_redot_channel(lib, values, grid):
    """Re<a, b> with a = x + 0i and b = 1 sums the doubles x themselves (x * 1 + 0 * 0 = x exactly), so the
    kernel's digits, windows, atomics and rounding see arbitrary doubles: equal to the twin and comms.reduce."""
    x = np.asarray(values, dtype=np.float64)
    a, b = x.astype(np.complex128), np.ones(x.size, dtype=np.complex128)
    out, result = HostReducer(lib, grid, 32).reduce(a, b)
    assert np.array_equal(out[1], S.accumulate(x))
    try:
        ref = R.exact_sum(x)
    except OverflowError:
        ref = S.to_float(S.accumulate(x))             # +-inf: comms.reduce raises where the sum overflows
    assert bits(result[1]) == bits(ref)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_gather_words_pulls_every_ranks_partial_in_rank_order(k):
    """The one-step peer sums (comms/cuda/peersum.py): gather_u64 reads the k partials where their owners left them
    (a table of addresses) into one (k, ...) buffer in rank order, which exact_round then rounds as it rounds the
    ranks' records stacked."""
    from lattice.exact_sum_cuda import gather_words, pair_sum

    be = Backend("cupy", HostCuPy())
    rng = np.random.default_rng(k)
    parts = [twin_records(field(rng, 40, np.complex128, 100), field(rng, 40, np.complex128, 100)) for _ in range(k)]
    table = np.array([p.ctypes.data for p in parts], dtype=np.uint64)
    out = np.full((k, 2, S.WIDTH), -1, dtype=np.int64)
    gather_words(be, table, out)
    assert np.array_equal(out, np.stack(parts))
    result, want = np.zeros(2), np.zeros(2)
    round_records(be, out, result)
    round_records(be, np.ascontiguousarray(np.stack(parts[::-1])), want)    # integers: the order does not matter
    assert np.array_equal(bits(result), bits(want))
    pairs = [rng.standard_normal(2) * 10.0 ** rng.integers(-8, 8, 2) for _ in range(k)]
    ptable = np.array([p.ctypes.data for p in pairs], dtype=np.uint64)
    got = np.zeros((k, 2))
    gather_words(be, ptable, got)
    assert np.array_equal(got, np.stack(pairs))
    summed, want = np.full(2, np.nan), pairs[0].copy()
    for p in pairs[1:]:
        want += p                                            # rank_sum's additions, left to right in rank order
    pair_sum(be, ptable, summed)
    assert np.array_equal(bits(summed), bits(want))
    with pytest.raises(ValueError, match="8-byte elements"):
        gather_words(be, table, np.zeros((k, 4), dtype=np.float32))
