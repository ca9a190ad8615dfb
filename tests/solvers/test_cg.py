"""CG, mixed-precision CG, multishift CG and the even-odd inverse (docs/conventions.md 1.6, 5.8)."""
import math

import numpy as np
import pytest

from lattice import Geometry
from solvers import (FunctionOperator, InverseOperator, Operator, SolverBreakdownError, SolverConvergenceError,
                     StaggeredDslash, cg, epsilon, even_odd_inverse, mixed_cg, multishift_cg, project)

from solver_testlib import random_field, random_links, rel

TOL = 1e-10


def true_residual(op, x, b):
    return np.linalg.norm((b - op(x)).ravel()) / np.linalg.norm(b.ravel())


@pytest.fixture(scope="module")
def d6():
    geom = Geometry((6, 6, 6, 6))
    return StaggeredDslash(geom, *random_links(geom, seed=11))


@pytest.fixture(scope="module")
def d4():
    geom = Geometry((4, 4, 4, 4))
    return StaggeredDslash(geom, *random_links(geom, seed=12))


def even_source(d, seed):
    return project(random_field(d.geom, np.random.default_rng(seed)), d.geom, 0)


# mass 0.1 on 6^4 (about 300 iterations); mass 0.01 on 4^4 (about 600: Haar-random links at 6^4 need ~3000)
CASES = [("d6", 0.1), ("d4", 0.01)]


SOLVERS = {"cg": cg(TOL, 5000), "cg-hs": cg(TOL, 5000, single_reduction=False), "mixed": mixed_cg(TOL, 5000)}


@pytest.mark.parametrize("lattice,mass", CASES)
@pytest.mark.parametrize("solver", list(SOLVERS))
def test_cg_reaches_true_residual(request, lattice, mass, solver):
    d = request.getfixturevalue(lattice)
    a = d.even_odd(mass).normal
    b = even_source(d, 1)
    inv = SOLVERS[solver](a)
    x, st = inv.solve(b)
    res = true_residual(a, x, b)            # recomputed here, in double precision
    assert st.converged and res <= TOL
    assert abs(st.true_residual - res) < 1e-3 * res
    assert inv.stats is st and inv.history[-1] is st
    assert st.time > 0 and st.flops > st.iters * a.flops
    assert np.all(x[np.broadcast_to(d.geom.parity()[..., None] == 1, x.shape)] == 0)   # stays on even sites
    assert x.dtype == np.complex128
    if solver != "mixed":
        assert st.precision == "double" and st.restarts == 0
        assert st.milc_iters == st.iters + 2                             # MILC: initial and final residual count
        assert st.matvecs == st.iters + (2 if solver == "cg" else 1)
    else:
        assert st.precision == "single/double" and st.restarts >= 5       # reliable updates happened
        ref = cg(TOL, 5000)(a).solve(b)[1]
        # m = 0.1: the Krylov space survives the reliable updates. m = 0.01 on 4^4: double CG converges in about
        # 630 iterations on a 1152-dimensional space (finite termination), which single precision cannot exploit
        assert st.iters <= (1.1 if mass == 0.1 else 2.5) * ref.iters
    print(f"\n{solver} m={mass}: {st}")


def test_cg_full_lattice_normal_equations(d4):
    m = 0.1
    M = d4.matrix(m)
    b = random_field(d4.geom, np.random.default_rng(2))
    x = cg(TOL, 5000)(M.normal())(M.adjoint()(b))
    assert true_residual(M.normal(), x, M.adjoint()(b)) <= TOL
    assert true_residual(M, x, b) < 1e-7


def test_inverse_follows_link_updates():
    """An inverse built once (as HMC does) solves with the links of the moment, also in mixed precision."""
    geom = Geometry((4, 4, 4, 4))
    d = StaggeredDslash(geom, *random_links(geom, seed=13))
    a = d.even_odd(0.2).normal
    invs = [cg(TOL, 2000)(a), mixed_cg(TOL, 2000)(a)]
    b = even_source(d, 14)
    d.set_links(*random_links(geom, seed=15))
    for inv in invs:
        assert true_residual(a, inv(b), b) <= TOL


def test_cg_is_an_operator(d4):
    a = d4.even_odd(0.1).normal
    inv = cg(1e-12, 2000)(a)
    assert isinstance(inv, Operator) and isinstance(inv, InverseOperator)
    assert inv.adjoint() is inv and inv.hermitian and inv.dtype == np.complex128
    b = even_source(d4, 3)
    assert rel(a(inv(b)), b) < 1e-11
    # composition: (A^-1 A) b = b
    assert rel((inv * a)(b), b) < 1e-9


def test_one_host_reduction_per_iteration(d4, monkeypatch):
    """Every global sum goes through geom.sum, and there is one per iteration (plus a few per solve)."""
    geom = d4.geom
    calls = []
    orig = geom.sum
    monkeypatch.setattr(geom, "sum", lambda a: calls.append(1) or orig(a))
    a = d4.even_odd(0.3).normal
    b = even_source(d4, 4)
    st = cg(TOL, 2000)(a).solve(b)[1]
    assert len(calls) <= st.iters + 4
    calls.clear()
    st = mixed_cg(TOL, 2000, single_reduction=True)(a).solve(b)[1]
    assert len(calls) <= st.iters + 4 * st.restarts + 4
    calls.clear()
    st = mixed_cg(TOL, 2000)(a).solve(b)[1]          # Hestenes-Stiefel inner iteration: two per iteration
    assert len(calls) <= 2 * st.iters + 3 * st.restarts + 4
    calls.clear()
    st = multishift_cg([0.04, 0.5], TOL, check_residual=False)(d4.even_odd(0.0).normal).solve(b)[1]
    assert len(calls) <= st.iters + 3


def test_initial_guess_and_zero_source(d4):
    a = d4.even_odd(0.1).normal
    b = even_source(d4, 5)
    inv = cg(TOL, 2000)(a)
    x, st0 = inv.solve(b)
    x1, st1 = inv.solve(b, x0=x)
    assert st1.iters == 0 and st1.converged and rel(x1, x) == 0
    x2, st2 = inv.solve(b, x0=x + 1e-6 * even_source(d4, 6))
    assert st2.converged and 0 < st2.iters < st0.iters and true_residual(a, x2, b) <= TOL
    z, stz = inv.solve(np.zeros_like(b))
    assert stz.converged and stz.iters == 0 and not z.any()
    xs = multishift_cg([0.1, 1.0], TOL)(a)(np.zeros_like(b))
    assert all(not v.any() for v in xs)


def test_nonconvergence(d4):
    a = d4.even_odd(0.01).normal
    b = even_source(d4, 7)
    with pytest.raises(SolverConvergenceError, match=r"did not converge: 7 iterations \(maxiter 7\).*wanted 1\.0e-10") \
            as err:
        cg(TOL, 7)(a)(b)
    assert err.value.stats.iters == 7 and not err.value.stats.converged and err.value.x is not None
    assert "residual" in str(err.value)
    x, st = cg(TOL, 7, raise_on_fail=False)(a).solve(b)
    assert not st.converged and st.iters == 7 and st.true_residual > TOL
    assert "NOT converged" in st.milc_line()
    x, st = mixed_cg(TOL, 7, raise_on_fail=False)(a).solve(b)
    assert not st.converged and st.iters == 7
    with pytest.raises(SolverConvergenceError, match="multishift CG did not converge: 5 iterations"):
        multishift_cg([0.0, 1.0], TOL, maxiter=5)(a)(b)
    xs, st = multishift_cg([0.0, 1.0], TOL, maxiter=5, raise_on_fail=False)(a).solve(b)
    assert not st.converged and len(xs) == 2


def test_breakdown_and_wrong_operators(d4):
    a = d4.even_odd(0.1).normal
    neg = FunctionOperator(d4.geom, lambda v: -a(v), hermitian=True, name="-A")
    with pytest.raises(SolverBreakdownError, match="not Hermitian positive definite"):
        cg(TOL, 100)(neg)(even_source(d4, 8))
    with pytest.raises(ValueError, match="not Hermitian"):
        cg(TOL)(d4.matrix(0.1))
    with pytest.raises(ValueError, match="not Hermitian"):
        multishift_cg([0.1], TOL)(d4)
    with pytest.raises(NotImplementedError, match="cannot be converted"):
        mixed_cg(TOL)(FunctionOperator(d4.geom, a, hermitian=True))


@pytest.fixture(scope="module")
def multishift_case(d6):
    a = d6.even_odd(0.0).normal                  # massless, as in RHMC: the shifts are 4 m^2 (and poles)
    shifts = [0.5, 4 * 0.1 ** 2, 2.0, 4 * 0.2 ** 2]     # MILC's offsets 4 m^2 and poles; base shift not first
    b = even_source(d6, 9)
    inv = multishift_cg(shifts, TOL, 5000)(a)
    xs, st = inv.solve(b)
    return a, shifts, b, xs, st


def test_multishift_equals_single_shift_cg(multishift_case):
    a, shifts, b, xs, st = multishift_case
    assert st.converged and st.milc_iters == st.iters + 1 and st.matvecs == st.iters + 1
    assert len(xs) == len(shifts)
    for s, x, tr, est in zip(shifts, xs, st.true_residuals, st.residuals):
        op = a.shifted(s)
        ref, rst = cg(1e-12, 5000)(op).solve(b)
        assert rel(x, ref) < 1e-8, (s, rel(x, ref))
        assert true_residual(op, x, b) <= TOL and abs(tr - true_residual(op, x, b)) < 1e-3 * tr
        assert est <= TOL
        if s == min(shifts):
            single = cg(TOL, 5000)(op).solve(b)[1]
            assert abs(single.iters - st.iters) <= 1      # the base system follows single-shift CG
    print(f"\n{st}\n  true residuals per shift {['%.2e' % r for r in st.true_residuals]}")


@pytest.fixture(scope="module")
def full_solution(d4):
    """x = (M^dag M)^-1 M^dag b by CG on the full lattice."""
    m = 0.1
    M = d4.matrix(m)
    b = random_field(d4.geom, np.random.default_rng(11))
    return m, b, cg(1e-12, 5000)(M.normal())(M.adjoint()(b))


@pytest.mark.parametrize("parity", [0, 1])
@pytest.mark.parametrize("inner", [cg, mixed_cg])
def test_even_odd_solve_equals_full_cg(d4, full_solution, parity, inner):
    m, b, ref = full_solution
    M = d4.matrix(m)
    minv = even_odd_inverse(d4.even_odd(m, parity), inner(1e-12, 5000))
    x, st = minv.solve(b)
    assert rel(x, ref) < 1e-9
    assert st.converged and st.inner.converged and st.true_residual <= 1e-12          # the even-site system
    assert st.full_residual == pytest.approx(true_residual(M, x, b), rel=1e-3)
    assert st.full_residual < 1e-12 * np.linalg.norm(M.adjoint()(b)) / (2 * m * np.linalg.norm(b)) * 1.01
    # the inverse composes: M (M^-1 b) = b, and (M^-1)^dag = (M^dag)^-1
    assert rel(M(x), b) < 1e-9
    assert rel(M.adjoint()(minv.adjoint()(b)), b) < 1e-9


def test_point_propagator_epsilon_hermiticity(d4):
    """G = M^-1 satisfies G(x, y) = eps(x) eps(y) G(y, x)^dag (docs/conventions.md 5.8)."""
    geom = d4.geom
    m = 0.2
    minv = even_odd_inverse(d4.even_odd(m), cg(1e-12, 5000))
    coords = [(0, 0, 0, 0), (1, 0, 0, 0), (3, 2, 1, 3)]     # even, odd, odd
    eps = epsilon(geom)[..., 0]
    cols = {}
    for c in coords:
        x, y, z, t = c
        g = np.empty((3,) + geom.shape + (3,), dtype=np.complex128)   # g[b][site][a] = G(site, c)_{ab}
        for col in range(3):
            src = np.zeros(geom.shape + (3,), dtype=np.complex128)
            src[t, z, y, x, col] = 1.0
            g[col] = minv(src)
        cols[c] = g
    worst, scale = 0.0, 0.0
    for cx in coords:
        for cy in coords:
            gxy = cols[cy][:, cx[3], cx[2], cx[1], cx[0], :].T     # G(x, y)_{ab}
            gyx = cols[cx][:, cy[3], cy[2], cy[1], cy[0], :].T     # G(y, x)_{ab}
            sign = eps[cx[3], cx[2], cx[1], cx[0]] * eps[cy[3], cy[2], cy[1], cy[0]]
            worst = max(worst, np.abs(gxy - sign * gyx.conj().T).max())
            scale = max(scale, np.abs(gxy).max())
    assert worst < 1e-10 * scale
    # the source site itself: G(y, y) = G(y, y)^dag, i.e. its anti-Hermitian part vanishes
    print(f"\npoint propagator: max |G(x,y) - eps eps G(y,x)^dag| = {worst:.2e} (max |G| = {scale:.2e})")


def test_stats_reporting(d4):
    a = d4.even_odd(0.1).normal
    st = cg(TOL, 2000)(a).solve(even_source(d4, 12))[1]
    line = st.milc_line()
    assert line.startswith(" OK converged final_rsq=") and f"iters= {st.iters + 2}" in line
    assert "converged in" in str(st) and st.gflops > 0
    assert math.isclose(st.residual, st.true_residual, rel_tol=1e-3)
