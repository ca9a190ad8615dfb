"""The mixed-precision multishift's first stage under the ``multishift_reliable`` switch (solvers.multishift,
MixedMultishift): single-precision Krylov vectors, the light shifts' solutions accumulated in double, reliable
updates of the base system; its fused update kernel (solvers/kernels/fused_blas.cu ms_update_mixed) compiled for
the host against the NumPy twin, and the device loop's reliable-update stop (ms_close)."""
from importlib import resources

import numpy as np
import pytest

from comms.config import RunConfig
from lattice import Geometry
from solvers import multishift_cg
from solvers.blas_cuda import BlasTwin
from solvers.krylov_graph import NSTATE, SLOT
import solvers.multishift as ms
import solvers.multishift_run as msrun
from solvers.multishift import MultishiftCG, _MultishiftRun
from tests.force.cuda_host import RawModule, needs_gxx
from test_multishift import SHIFTS, _system, _true_residuals


def _recorded(monkeypatch):
    """Record every shift's (alpha_i, p_i) at each NumPy-path step (alpha_i = alpha zeta_{k+1} / zeta_k)."""
    steps = []
    update = _MultishiftRun._shift_updates

    def spy(run, alpha, beta, fresh=None):
        z = list(run.z)
        out = update(run, alpha, beta, fresh)
        steps.append([(alpha * zn / zi if zi else 0.0, p.copy()) for zi, zn, p in zip(z, run.z, run.ps_i)])
        return out
    monkeypatch.setattr(_MultishiftRun, "_shift_updates", spy)
    return steps


def _accumulation_error(x, steps, i):
    """max |x - sum_k alpha_k p_k| / max |x|, the sum in long double."""
    ref = np.zeros(x.shape, dtype=np.clongdouble)
    for step in steps:
        a, p = step[i]
        ref += np.longdouble(a) * p.astype(np.clongdouble)
    return float(np.abs(x.astype(np.clongdouble) - ref).max() / np.abs(ref).max())


def test_solutions_accumulate_in_double(monkeypatch):
    """After 40 iterations every x_i (all light at tol 1e-12 with SINGLE_X_ROUNDING 0.1) is sum_k alpha_i,k p_i,k
    to double rounding (1e-12), where the all-single first stage is off by single rounding."""
    monkeypatch.setattr(msrun, "SINGLE_X_ROUNDING", 0.1)
    geom, a, b = _system()
    steps = _recorded(monkeypatch)
    xs, st = MultishiftCG(tuple(SHIFTS), 1e-12, 40, False, False, np.complex64)(a).solve(b)
    assert st.iters == 40 and st.precision == "single/double"
    assert all(x.dtype == np.complex128 for x in xs)
    errs = [_accumulation_error(x, steps, i) for i, x in enumerate(xs)]
    assert max(errs) < 1e-12, errs
    steps.clear()
    xs, _ = MultishiftCG(tuple(SHIFTS), 1e-12, 40, False, False)(a.converted(np.complex64)).solve(b)
    assert min(_accumulation_error(x, steps, i) for i, x in enumerate(xs)) > 1e-9


def test_heavy_shifts_keep_single_solutions(monkeypatch):
    """By default only the base shift's x_0 is double; with SINGLE_X_ROUNDING 0.1 at tol 1e-5 the heavy shifts'
    x_i stay in single (rounding them costs < tol / 10), the light ones and the base shift's are double."""
    geom, a, b = _system()
    shifts = (2e-4, 0.05, 1.5, 40.0)
    xs, _ = MultishiftCG(shifts, 1e-5, 3, False, False, np.complex64)(a).solve(b)
    assert [x.dtype for x in xs] == [np.complex128] + [np.complex64] * 3
    monkeypatch.setattr(msrun, "SINGLE_X_ROUNDING", 0.1)
    xs, st = MultishiftCG(shifts, 1e-5, 3, False, True, np.complex64)(a).solve(b)      # (true residuals too)
    assert [x.dtype for x in xs] == [np.complex128, np.complex128, np.complex64, np.complex64]
    xs, st = MultishiftCG((40.0, 1.5), 1e-5, 3, False, False, np.complex64)(a).solve(b)
    assert [x.dtype for x in xs] == [np.complex64, np.complex128]        # the base shift's x_0: always double


def test_reliable_updates_cut_the_refinement():
    """cgprec 1 on the 4^4 test operator: the all-single first stage leaves the base shift 64 refinement
    iterations; with double solutions and reliable updates the first stage meets the base shift's tolerance in
    its true residual (no refinement), and every shift still meets the double-precision tolerance."""
    geom, a, b = _system()
    counts = {}
    for on in (False, True):
        xs, st = multishift_cg(SHIFTS, 1e-5, 5000).mixed_precision(accumulate=on)(a).solve(b)
        counts[on] = [r.iters for r in st.extra["refine"]]
        assert st.converged and max(_true_residuals(geom, a, b, xs)) <= 1e-5
    assert counts[True][0] == 0 < counts[False][0], counts
    assert sum(counts[True]) < sum(counts[False])
    assert st.extra["reliable_updates"] >= 1 and st.extra["outer_matvecs"] == st.extra["reliable_updates"]


def test_device_loop_hands_restarts_to_the_host(monkeypatch):
    """The solve's control flow with device iterations (solvers.krylov_graph.multishift_iterations, stood in for by
    host steps under its contract: iterate until converged, maxiter or a reliable update due) gives the host-driven
    iterates exactly, and the device is never handed a restarted step (its update kernels know only k = 0)."""
    geom, a, b = _system()
    make = MultishiftCG((0.02, 0.4, 2.0), 1e-5, 5000, False, False, np.complex64, 0.01)
    want, st_host = make(a).solve(b)
    calls = []

    def device(run, iters):
        assert not run.restart
        calls.append(run.k)
        while True:
            run.iterate()
            if not (run.g > run.stop and run.k < run.inv.maxiter) or run.reliable_due():
                return
    monkeypatch.setattr(ms, "graph_iterations", lambda op, blas: 8)
    monkeypatch.setattr(ms, "multishift_iterations", device)
    got, st = make(a).solve(b)
    assert len(calls) >= st.extra["reliable_updates"] >= 2 and st.iters == st_host.iters
    assert all(np.array_equal(x, y) for x, y in zip(got, want))


def test_the_switch(monkeypatch):
    """Off by default (the all-single first stage on the converted operator); HMC_MULTISHIFT_RELIABLE=1, read
    through the operator's run configuration, or ``accumulate=True`` selects the first stage on the double
    operator with single Krylov vectors and reliable updates."""
    assert RunConfig().multishift_reliable is False
    factory = multishift_cg(SHIFTS, 1e-5).mixed_precision()
    _, a, _ = _system()
    off = factory(a).multishift
    assert off.inner_dtype is None and off.dtype == np.complex64 and off.delta == 0.0
    monkeypatch.setenv("HMC_MULTISHIFT_RELIABLE", "1")
    assert RunConfig.from_environment().multishift_reliable is True
    _, a, _ = _system()
    for on in (factory(a).multishift, multishift_cg(SHIFTS, 1e-5).mixed_precision(accumulate=True)(a).multishift):
        assert on.inner_dtype == np.complex64 and on.dtype == np.complex128 and on.delta > 0
    assert multishift_cg(SHIFTS, 1e-5).mixed_precision(accumulate=False)(a).multishift.inner_dtype is None


# --- the kernels, compiled for the host ---------------------------------------------------------------------------

_PRELUDE = r"""
typedef unsigned long long u64;
template <typename R> struct C2;
template <> struct C2<double> { typedef double2 T; };
template <> struct C2<float> { typedef float2 T; };
static Idx gridDim = {1L << 40};
"""
_WRAPPER = r"""
extern "C" __global__ void host_ms_update_mixed(float2 *s, float2 *r, const float2 *w, const u64 *pp, const u64 *xp,
                                                const double *coef, int nshift, double alpha, double beta, int fresh,
                                                long n, int parity, int nx, int ny, int nz) {
    ms_update<float, double, double>(s, r, w, pp, xp, coef, nshift, (float)alpha, (float)beta, fresh, n, parity,
                                     nx, ny, nz);
}
extern "C" __global__ void host_ms_update_single(float2 *s, float2 *r, const float2 *w, const u64 *pp, const u64 *xp,
                                                 const float *coef, int nshift, double alpha, double beta, int fresh,
                                                 long n, int parity, int nx, int ny, int nz) {
    ms_update<float, float, float>(s, r, w, pp, xp, coef, nshift, (float)alpha, (float)beta, fresh, n, parity,
                                   nx, ny, nz);
}
extern "C" __global__ void host_ms_update_double(double2 *s, double2 *r, const double2 *w, const u64 *pp,
                                                 const u64 *xp, const double *coef, int nshift, double alpha,
                                                 double beta, int fresh, long n, int parity, int nx, int ny, int nz) {
    ms_update<double, double, double>(s, r, w, pp, xp, coef, nshift, alpha, beta, fresh, n, parity, nx, ny, nz);
}
"""


@pytest.fixture(scope="module")
def update_kernel():
    src = resources.files("solvers").joinpath("kernels/fused_blas.cu").read_text()
    site = src[src.index("/* lattice index of checkerboard"):src.index("/* Sum v[0..1] over the grid")]
    update = src[src.index("/* multishift: s = w + beta s"):src.index("// ---------------------------")]
    return RawModule(_PRELUDE + site + update + _WRAPPER)


def _fields(geom, rng, dtype):
    f = rng.normal(size=geom.shape + (3, 2)) @ np.array([1.0, 1j])
    return np.ascontiguousarray((f * (geom.parity() == 0)[..., None]).astype(dtype))


#: the update kernels compiled for the host: Krylov precision, the x_i's precisions, the coefficients' precision
_VARIANTS = {"mixed": (np.complex64, (np.complex128, np.complex64, np.complex128, np.complex64, np.complex128,
                                      np.complex128), np.float64),
             "single": (np.complex64, (np.complex64,) * 6, np.float32),
             "double": (np.complex128, (np.complex128,) * 6, np.float64)}


@needs_gxx
@pytest.mark.parametrize("variant", sorted(_VARIANTS))
@pytest.mark.parametrize("fresh", [False, True])
def test_update_kernel_equals_the_twin(update_kernel, variant, fresh):
    """Bitwise: s, r, the p_i and the x_i of the kernel (the mixed one: float p_i, double x_i at tagged addresses
    and single ones) equal BlasTwin.multishift_update's NumPy arithmetic, on the even sites only; frozen shifts are
    left alone. Six shifts: two chunks of the kernel's loads (MS_CHUNK 4), a frozen shift in each."""
    krylov, xdtypes, real = _VARIANTS[variant]
    geom = Geometry((4, 4, 2, 2))
    rng = np.random.default_rng(3)
    s, r, w = (_fields(geom, rng, krylov) for _ in range(3))
    ps = [_fields(geom, rng, krylov) for _ in xdtypes]
    xs = [_fields(geom, rng, dt) for dt in xdtypes]
    coefs = [(0.7312, -1.234567890123, 0.4321), (0.11, 3.3333333333, 0.9), None, (0.25, 0.5, 0.125),
             (1.0 / 3.0, -0.7, 0.3), None]
    alpha, beta = 0.81234, 0.45678
    want = [a.copy() for a in (s, r, *ps, *xs)]
    k = len(coefs)
    BlasTwin(geom, krylov, 0).multishift_update(want[0], want[1], w, want[2:2 + k], want[2 + k:], coefs, alpha,
                                                beta, fresh)
    pp = np.array([p.ctypes.data for p in ps], dtype=np.uint64)
    tag = variant == "mixed"
    xp = np.array([x.ctypes.data | (1 if tag and x.dtype == np.complex128 else 0) for x in xs], dtype=np.uint64)
    coef = np.zeros(4 * k, dtype=real)
    for i, co in enumerate(coefs):
        if co is not None:
            coef[4 * i:4 * i + 4] = (*co, 1.0)
    n = geom.volume // 2
    if krylov == np.complex64:      # the single drivers round alpha and beta to float (CudaBlas: R(alpha))
        alpha, beta = np.float64(np.float32(alpha)), np.float64(np.float32(beta))
    kernel = update_kernel.get_function(f"host_ms_update_{variant}")
    kernel((n * 3,), (1,), (s, r, w, pp, xp, coef, k, alpha, beta, int(fresh), n, 0, 4, 4, 2))
    for got, exp in zip((s, r, *ps, *xs), want):
        assert got.dtype == exp.dtype and np.array_equal(got, exp)


@pytest.fixture(scope="module")
def close_kernel():
    src = resources.files("solvers").joinpath("kernels/fused_blas.cu").read_text()
    section = src[src.index("// The device-resident iterations"):src.index("#define LAT long long n")]
    return RawModule("typedef unsigned long long u64;\n" + section).get_function("ms_close")


@needs_gxx
def test_device_loop_stops_for_a_reliable_update(close_kernel):
    """ms_close keeps max |r|^2 and stops the loop once |r|^2 < delta^2 of it (the host's reliable_due);
    with delta2 = 0 (no reliable updates) it iterates on."""
    def close(g, rmax2, delta2):
        st = np.zeros(NSTATE)
        st[SLOT["res"]], st[SLOT["g"]], st[SLOT["rmax2"]], st[SLOT["delta2"]] = g, 1.0, rmax2, delta2
        st[SLOT["stop"]], st[SLOT["maxiter"]] = 1e-12, 100
        close_kernel((1,), (1,), (st,))
        return st[SLOT["status"]], st[SLOT["rmax2"]]
    assert close(0.5e-4, 1.0, 1e-4) == (1.0, 1.0)
    assert close(2e-4, 1.0, 1e-4) == (0.0, 1.0)
    assert close(3.0, 1.0, 1e-4) == (0.0, 3.0)
    assert close(0.5e-4, 1.0, 0.0) == (0.0, 1.0)


def test_bitwise_on_a_partitioned_grid():
    """The mixed first stage (its reliable updates' double products, the x_i precisions chosen from a global sum)
    reaches neighbours and sums only through the geometry: bitwise the single-process answer on a one-rank grid
    with every dimension on the halo path (exact sums, as tests/solvers/test_decomposition.py)."""
    from solvers import StaggeredDslash, project, set_reductions
    from solver_testlib import partitioned_pair, random_field

    plain, part, links = partitioned_pair()
    b = project(random_field(plain, np.random.default_rng(2)), plain, 0)
    make = MultishiftCG((0.3, 2.0), 1e-5, 2000, True, True, np.complex64, 0.01)
    old = set_reductions("exact")
    try:
        (xs1, s1), (xs2, s2) = (make(StaggeredDslash(g, *links).even_odd(0.0).normal).solve(b) for g in (plain, part))
    finally:
        set_reductions(old)
        part.grid.close()                  # its engine and shm window (the teardown check)
    assert s1.extra["reliable_updates"] == s2.extra["reliable_updates"] >= 1 and s1.iters == s2.iters
    assert all(u.dtype == v.dtype and np.array_equal(u, v) for u, v in zip(xs1, xs2))
