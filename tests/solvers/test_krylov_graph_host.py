"""The scalar kernels of the device-resident solver iterations (solvers/kernels/fused_blas.cu, section "device-
resident iterations"), compiled for the host (tests/force/cuda_host.py), against the host-driven solvers' own
methods: bitwise the same beta, p^dag A p, alpha, zetas and per-shift coefficients, the same stop tests and freezing.
"""
from __future__ import annotations

import types
from importlib import resources

import numpy as np
import pytest

from solvers.cg import _CGRun
from solvers.krylov_graph import NSTATE, SLOT
from solvers.multishift import _MultishiftRun
from tests.force.cuda_host import RawModule, needs_gxx

pytestmark = needs_gxx
S = SLOT


@pytest.fixture(scope="module")
def kernels():
    src = resources.files("solvers").joinpath("kernels/fused_blas.cu").read_text()
    start = src.index("// The device-resident iterations")
    section = src[start:src.index("#define LAT long long n")]
    return RawModule("typedef unsigned long long u64;\n" + section)


def _call(k, name, *args):
    k.get_function(name)((1,), (1,), args)


def _state(**kv):
    st = np.zeros(NSTATE)
    for n, v in kv.items():
        st[S[n]] = v
    return st


@pytest.mark.parametrize("seed", range(20))
def test_cg_direction_and_close_equal_the_host_steps(kernels, seed):
    rng = np.random.default_rng(seed)
    g, g_old, d, alpha_old = rng.uniform(0.1, 2.0, 4) * 10.0 ** rng.integers(-8, 3, 4)
    fresh = bool(rng.integers(2))
    host = types.SimpleNamespace(ps=object(), fresh=fresh, beta=0.37, g=g, g_old=g_old, d=d, alpha_old=alpha_old,
                                 cg_step=True)
    pap = _CGRun._direction_fused(host)
    st = _state(g=g, g_old=g_old, d=d, alpha_old=alpha_old, beta=0.37, fresh=fresh)
    _call(kernels, "cg_direction", st)
    if not pap > 0:
        assert st[S["status"]] == 2 and st[S["pap"]] == pap
        return
    assert st[S["pap"]] == pap and st[S["beta"]] == host.beta and st[S["alpha"]] == g / pap
    assert st[S["step_fresh"]] == fresh and st[S["fresh"]] == 0
    g_new, d_new = rng.uniform(0.01, 1.0, 2) * g
    st[S["res"]], st[S["res"] + 1] = g_new, d_new
    stop, delta2, rmax2, maxiter, k = g_new * rng.choice([0.5, 2.0]), rng.choice([0.0, 0.1]), g, 50, 7
    st[S["stop"]], st[S["delta2"]], st[S["rmax2"]], st[S["maxiter"]], st[S["k"]] = stop, delta2, rmax2, maxiter, k
    _call(kernels, "cg_close", st)
    due = _CGRun.true_residual_due(types.SimpleNamespace(g=g_new, stop=stop, delta2=delta2, rmax2=max(rmax2, g_new),
                                                         k=k + 1, inv=types.SimpleNamespace(maxiter=maxiter)))
    assert (st[S["g"]], st[S["d"]], st[S["g_old"]], st[S["k"]]) == (g_new, d_new, g, k + 1)
    assert st[S["alpha_old"]] == g / pap and st[S["rmax2"]] == max(rmax2, g_new)
    assert st[S["status"]] == (1 if due else 0)


def test_cg_breakdown_and_frozen_state(kernels):
    st = _state(g=1.0, g_old=1.0, d=0.5, alpha_old=1.0, beta=0.0)     # pAp = 0.5 - 1 < 0
    _call(kernels, "cg_direction", st)
    assert st[S["status"]] == 2 and st[S["pap"]] == -0.5
    frozen = st.copy()
    st[S["res"]] = 123.0
    _call(kernels, "cg_close", st)
    _call(kernels, "cg_direction", st)
    frozen[S["res"]] = 123.0
    assert np.array_equal(st, frozen)
    st = _state(g=1.0, d=1.0, fresh=1, maxiter=9)
    _call(kernels, "cg_direction", st)
    st[S["res"]] = np.inf
    _call(kernels, "cg_close", st)
    assert st[S["status"]] == 3


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("stopping", [False, True])
def test_multishift_coefficients_equal_the_host(kernels, single, seed, stopping):
    """Every step's zetas and coefficients bitwise the host's; with a shift stop (``stop_converged``) the same
    shifts stop at the same iteration with the same residual."""
    rng = np.random.default_rng(100 + seed)
    n = 5
    real = np.float32 if single else np.float64
    shift_stop = 1e-12 if stopping else 0.0      # (below the base shift's g: the solver's stop is above it)
    host = types.SimpleNamespace(z=[1.0] * n, z_prev=[1.0] * n, k=0, r=None, n=n, alpha_prev=1.0,
                                 rel=sorted(rng.uniform(0, 3, n)), blas=True, g=1.0, shift_stop=shift_stop, finished={})
    host.rel[0] = 0.0
    z, zp, fin = np.ones(n), np.ones(n), np.zeros(2 * n)
    rel = np.asarray(host.rel)
    coef = np.zeros(4 * n, dtype=real)
    st = _state(alpha_old=1.0, g=1.0, d=1.3, shift_stop=shift_stop)
    g_old = 1.0
    for k in range(60):          # (60 steps: enough to meet a q where pow(q, 2) != q * q)
        g, d = st[S["g"]], st[S["d"]]
        beta = 0.0 if k == 0 else g / g_old
        pap = d if k == 0 else d - beta * g / host.alpha_prev
        alpha = g / pap
        host.g = g
        want = _MultishiftRun._shift_updates(host, alpha, beta)
        _call(kernels, "ms_direction_single" if single else "ms_direction_double", st, z, zp, rel, coef, fin, n)
        assert st[S["status"]] == 0 and st[S["alpha"]] == alpha and st[S["beta"]] == beta
        assert list(z) == host.z and list(zp) == host.z_prev
        assert {i: (fin[2 * i], int(fin[2 * i + 1])) for i in range(n) if fin[2 * i] > 0} == host.finished
        for i, co in enumerate(want):
            assert tuple(coef[4 * i:4 * i + 4]) == ((*map(real, co), real(1)) if co else (0, 0, 0, 0))
        host.k, host.alpha_prev, g_old = k + 1, alpha, g
        st[S["res"]], st[S["res"] + 1] = g * 0.7, g * 0.9 * rng.uniform(0.9, 1.1)
        st[S["stop"]], st[S["maxiter"]] = 1e-30, 100
        _call(kernels, "ms_close", st)
        assert st[S["k"]] == k + 1 and st[S["alpha_old"]] == alpha and st[S["g_old"]] == g
    if stopping:
        assert 0 < len(host.finished) < n                # some heavy shifts stopped, never the base one


def test_multishift_stops_like_the_host_loop(kernels):
    st = _state(g=1.0, d=2.0, alpha_old=1.0, stop=0.5, maxiter=3)
    z, zp, rel, coef = np.ones(1), np.ones(1), np.zeros(1), np.zeros(4)
    _call(kernels, "ms_direction_double", st, z, zp, rel, coef, np.zeros(2), 1)
    st[S["res"]], st[S["res"] + 1] = 0.5, 1.0
    _call(kernels, "ms_close", st)
    assert st[S["status"]] == 1          # g = stop: the host loop's g > stop fails


def test_rank_sum_adds_in_order(kernels):
    vals = np.asarray([1e16, 1.0, 1.0, -1e16, -1e16, 2.0, 1.0, 3.0])
    dst = np.zeros(2)
    _call(kernels, "rank_sum", vals, 4, dst)
    assert dst[0] == ((1e16 + 1.0) + -1e16) + 1.0 and dst[1] == ((1.0 + -1e16) + 2.0) + 3.0


def test_held_iterations_is_an_even_divisor_or_the_whole_batch():
    """HMC_SOLVER_GRAPH_CAPTURE: a graph holds c iterations where c divides HMC_SOLVER_GRAPH and is even (the peer
    sums and credit-free exchanges need an even count per graph); an odd batch (rings, credits) takes any divisor;
    otherwise the one graph of the whole batch."""
    from solvers.krylov_graph import held_iterations

    assert [held_iterations(8, c) for c in (0, 2, 4, 8, 3, 6, 16)] == [8, 2, 4, 8, 8, 8, 8]
    assert [held_iterations(9, c) for c in (0, 3, 1, 2)] == [9, 3, 1, 9]
    assert held_iterations(1, 0) == 1 and held_iterations(2, 1) == 2
