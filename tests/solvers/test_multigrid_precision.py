"""Multigrid precision (issue 7): a single-precision preconditioner inside the double-precision outer GCR, and the
restarted relaxation of the near-null vectors.

* ``precision="single"``: the hierarchy's copies (M's links, the fine stencil, X^-1, the near-null vectors, the
  coarse stencils, the coarsest LU) are complex64 and every field of the K-cycle is complex64; the correction it
  returns is the double-precision one to single-precision accuracy; on MILC's lat.sample.l8888 (HISQ links,
  antiperiodic time) at m = 0.01 and 0.001 the solve meets tol 1e-10 on the true double residual with outer
  iterations within 10% of the double preconditioner's.
* :func:`relax_null_vectors`: CG on A^dag A x = 0 drives x to 0 and its recursive residual leaves the true one
  after ~150 iterations (|A v|/|v| then grows); restarted every 50 iterations from the normalized iterate (the
  residual stays true), each vector keeping its best iterate, 200 iterations are no worse than 50.
"""
import math

import numpy as np
import pytest

from lattice import CounterRNG, Geometry, get_backend
from solvers import StaggeredDslash, norm2
from solvers.multigrid import MultigridError, multigrid
from solvers.multigrid import transfer as mgtransfer
from solvers.multigrid.operators import FineStencil
from solvers.multigrid.solver import Hierarchy, MultigridParams
from tests.conftest import fixture_path

from solver_testlib import random_field, random_links, rel

TOL = 1e-10
FAST = dict(nv=16, setup_iters=50)
SMALL = dict(levels=4, blocks=[(4, 4, 4, 4), (2, 2, 2, 2)], nv=(8, 6), setup_iters=(10, 10))


def true_residual(M, x, b):
    return math.sqrt(norm2(M.geom, b - M(x)) / norm2(M.geom, b))


@pytest.fixture(scope="module")
def l8888():
    from force.hisq_links import hisq_links
    from lattice.io import read_gauge

    u, _ = read_gauge(fixture_path("lat.sample.l8888"))
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    return links, StaggeredDslash(u.geom, links.fat, links.long)


@pytest.fixture(scope="module")
def l8888_base(l8888):
    """One set of near-null vectors (m = 0.01) shared by every mass and precision below."""
    inv = multigrid(TOL, **FAST)(l8888[1].matrix(0.01))
    inv.setup()
    return inv


@pytest.fixture(scope="module")
def rand8():
    """Haar-random 8^4 links, four levels (a K-cycle GCR on level 2), single-precision preconditioner."""
    geom = Geometry((8, 8, 8, 8))
    D = StaggeredDslash(geom, *random_links(geom, seed=31))
    inv = multigrid(TOL, precision="single", **SMALL)(D.matrix(0.05))
    inv.setup()
    return inv


def _levels_stats(inv):
    return [dict(cycles=0, krylov_iters=0, solves=0, direct_solves=0, smoother_steps=0, time_incl=0.0)
            for _ in inv.hierarchy.ops]


# ------------------------------------------------------------------------------------------------ single precision
def test_single_copies_are_complex64(rand8):
    h = rand8.hierarchy
    c = h.cycle
    assert c.fine.M.dtype == np.complex64 and c.kd.Xinv.dtype == np.complex64
    assert c.ops[1].stencil.links.dtype == np.complex64
    assert [op.Y.dtype for op in c.ops[2:]] == [np.complex64] * 2
    assert [t.V.dtype for t in c.transfers] == [np.complex64] * 2 and c.lu.L.dtype == np.complex64
    # the set-up's own hierarchy stays double (refreshes and other masses start from it)
    assert h.kd.Xinv.dtype == np.complex128 and [op.Y.dtype for op in h.ops[2:]] == [np.complex128] * 2
    assert rel(c.ops[2].Y, h.ops[2].Y) < 1e-7 and rel(c.kd.Xinv, h.kd.Xinv) < 1e-7


def test_single_cycle_runs_in_complex64(rand8, monkeypatch):
    """Every field the K-cycle makes is complex64 (no silent promotion to double by a mixed product)."""
    from solvers.multigrid import solver as mgsolver

    seen = set()
    real_smooth, real_fgcr = mgsolver.gcr_smooth, mgsolver.fgcr

    def smooth(op, f, x=None, steps=2):
        out = real_smooth(op, f, x, steps)
        seen.add(("smooth", f.dtype, out.dtype))
        return out

    def fgcr(apply, precondition, geom, b, *a, **k):
        x, res = real_fgcr(apply, precondition, geom, b, *a, **k)
        seen.add(("fgcr", b.dtype, x.dtype))
        return x, res

    monkeypatch.setattr(mgsolver, "gcr_smooth", smooth)
    monkeypatch.setattr(mgsolver, "fgcr", fgcr)
    rand8._lstats = _levels_stats(rand8)
    r = random_field(rand8.geom, np.random.default_rng(1))
    e = rand8._precondition(r)
    assert e.dtype == np.complex128
    single = np.dtype(np.complex64)
    assert ("smooth", single, single) in seen and ("fgcr", single, single) in seen
    assert all(a == single and b == single for _, a, b in seen), seen


def test_single_preconditioner_is_the_double_one_rounded(rand8):
    """The same hierarchy in double and in single: the corrections agree to single-precision accuracy (not
    exactly: rounding), so the single cycle is the double one, not another method."""
    inv_d = rand8.with_mass(0.05, precision="double")
    inv_d.setup()
    assert inv_d.hierarchy.cycle.dtype == np.complex128
    r = random_field(rand8.geom, np.random.default_rng(2))
    rand8._lstats, inv_d._lstats = _levels_stats(rand8), _levels_stats(inv_d)
    e_s, e_d = rand8._precondition(r), inv_d._precondition(r)
    d = rel(e_s, e_d)
    assert 1e-9 < d < 1e-4, d


@pytest.mark.parametrize("mass", [0.01, 0.001])
def test_single_preconditioner_meets_the_double_tolerance(l8888_base, mass):
    """tol 1e-10 on the true double residual; outer iterations within 10% of the double preconditioner's."""
    b = random_field(l8888_base.geom, np.random.default_rng(3))
    out = {}
    for prec in ("double", "single"):
        inv = l8888_base.with_mass(mass, precision=prec)
        x, st = inv.solve(b)
        out[prec] = (st, x)
        assert st.converged and true_residual(l8888_base.M.dslash.matrix(mass), x, b) <= TOL
        assert st.precision == ("double" if prec == "double" else "single/double")
    (sd, xd), (ss, xs) = out["double"], out["single"]
    assert ss.iters <= math.ceil(1.1 * sd.iters), (ss.iters, sd.iters)
    assert rel(xs, xd) < 1e-7


def test_bad_precision_is_one_line(l8888):
    D = l8888[1]
    with pytest.raises(MultigridError, match=r"precision = 'quarter'.*double, single, half"):
        multigrid(TOL, precision="quarter")(D.matrix(0.1))
    with pytest.raises(MultigridError, match="complex128"):
        multigrid(TOL, precision="single")(D.matrix(0.1).converted(np.complex64))


@pytest.mark.gpu
def test_gpu_single_preconditioner(l8888):
    """On CuPy the single cycle takes the array path (the batched kernels are complex128-only) and gives the NumPy
    single solve: same tolerance, outer iterations within 10%."""
    import cupy as cp

    links, D = l8888
    geom = Geometry(tuple(D.geom.dims), get_backend("cupy"))
    Dg = StaggeredDslash(geom, cp.asarray(links.fat), cp.asarray(links.long))
    b = random_field(D.geom, np.random.default_rng(3))
    inv_c = multigrid(TOL, precision="single", **FAST)(D.matrix(0.001))
    inv_g = multigrid(TOL, precision="single", **FAST)(Dg.matrix(0.001))
    xc, sc = inv_c.solve(b)
    xg, sg = inv_g.solve(cp.asarray(b))
    assert inv_g.hierarchy.cycle.ops[2].Y.dtype == np.complex64
    assert sg.converged and true_residual(Dg.matrix(0.001), xg, cp.asarray(b)) <= TOL
    assert abs(sg.iters - sc.iters) <= max(2, 0.1 * sc.iters)
    assert rel(cp.asnumpy(xg), xc) < 1e-7


# ------------------------------------------------------------------------------------------------ relaxation
@pytest.fixture(scope="module")
def level1(l8888):
    """A = X^-1 M of l8888 at m = 0.001 and one random start vector."""
    M = l8888[1].matrix(0.001)
    op = Hierarchy(M, MultigridParams(), FineStencil(M)).ops[1]
    return op, op.random(CounterRNG(2024), 1, "relax-test")


def _quotient(op, v):
    g = op.geom
    return float(np.sqrt(mgtransfer._norms2(g, op.apply(v)) / mgtransfer._norms2(g, v))[0])


def test_relaxation_is_no_worse_with_more_iterations(level1):
    """|A v|/|v| after 200 iterations no worse than after 50 (before: 0.24 after 50, 0.41 after 200 here; 12^4:
    0.083 after 50, 0.149 after 150), and better than the random start."""
    op, x0 = level1
    q0 = _quotient(op, x0)
    q50 = _quotient(op, mgtransfer.relax_null_vectors(op, x0.copy(), 50))
    q200 = _quotient(op, mgtransfer.relax_null_vectors(op, x0.copy(), 200))
    assert q50 < 0.5 * q0 and q200 <= q50 * (1 + 1e-9), (q0, q50, q200)


def test_relaxation_restart_keeps_the_residual_true(level1):
    """A 50-iteration CG cycle from a unit vector ends with its recursive residual equal to the true -A^dag A x;
    200 iterations without a restart do not (the drift the restarts remove)."""
    op, x0 = level1
    g = op.geom

    def cycle(n):
        x = mgtransfer._unit_columns(g, x0.copy())
        x, r, done = mgtransfer._cg_normal_null(op, x, -op.apply_adjoint(op.apply(x)), n)
        assert done == n
        return rel(r, -op.apply_adjoint(op.apply(x)))

    assert cycle(mgtransfer.RELAX_RESTART) < 1e-6
    assert cycle(200) > 0.1


# ------------------------------------------------------------------------------------------------ options
DECK = """
[run]
seed = 60
trajectories = 1
[lattice]
dims = [8, 8, 8, 8]
[gauge]
action = "wilson"
beta = 6.0
[integrator]
scheme = "omelyan"
steps = 4
tau = 1.0
"""


def test_deck_precision():
    from hmc import deck as deckmod

    d = deckmod.loads(DECK + "[multigrid]\nprecision = \"single\"\n")
    assert deckmod.multigrid_options(d["multigrid"])["precision"] == "single"
    assert deckmod.multigrid_options(deckmod.loads(DECK + "[multigrid]\n")["multigrid"])["precision"] == "double"
    with pytest.raises(deckmod.DeckError, match="precision"):
        deckmod.loads(DECK + "[multigrid]\nprecision = \"quarter\"\n")


def test_hmc_solve_mg_precision(capsys):
    import json

    from hmc.cli import main

    argv = ["solve", str(fixture_path("lat.sample.l8888")), "--action", "hisq", "--time-bc", "antiperiodic",
            "--mass", "0.01", "--solver", "mg", "--random", "5", "--tol", "1e-10", "--mg-nv", "16",
            "--mg-setup-iters", "50", "--mg-precision", "single", "--no-mg-compare", "--json"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["converged"] and r["full_residual"] <= 1e-10
    assert r["precision"] == "single/double" and r["mg"]["params"]["precision"] == "single"
