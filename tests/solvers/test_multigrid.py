"""Multigrid for the HISQ operator (issue 7, docs/multigrid.md "Tests that prove it", docs/conventions.md 5.8).

Identities (Haar-random 8^4 and 4^4 links with the Naik term; exact to rounding): R P = 1, the near-null vectors
lie in range(P), the Galerkin identity A_c c = R A P c (and its adjoint) on two aggregation levels, the exact
coarse correction removes a near-null vector, X^-1 X = 1 per hypercube, X is M restricted to a hypercube, and the
free-field X^dag X = (4m^2 + 4 c1^2) 1 (c1 = 9/8, the free HISQ fat link).

Convergence, on MILC's lat.sample.l8888 (quenched Wilson beta 6.0, 8^4) with HISQ links, antiperiodic time: the
outer iteration count is flat within 30% from m = 0.1 to m = 0.001 while even-odd CG's grows; without the KD step
the same hierarchy converges far worse; MG and CG solutions agree, true residuals recomputed here. Set-up reuse
(masses, link updates), four levels with a K-cycle, GCR coarsest, a partitioned grid (halo self-exchange), bad
input.
"""
import math

import numpy as np
import pytest

from lattice import Geometry
from solvers import StaggeredDslash, cg, even_odd_inverse, norm2
from solvers.multigrid import (CoarseOperator, FineStencil, KDBlocks, MultigridError, MultigridStats, multigrid)
from solvers.multigrid.operators import HYPERCUBE
from solvers.multigrid.lattice import from_blocks, to_blocks
from solvers.multigrid.transfer import orthonormality_error, relative
from tests.conftest import fixture_path

from solver_testlib import free_links, random_field, random_links

TOL = 1e-10
MASSES = (0.1, 0.01, 0.001)
# a light set-up that keeps the suite fast; the note's numbers use the defaults (nv 24, 100 iterations)
FAST = dict(nv=16, setup_iters=50)


def true_residual(M, x, b):
    return math.sqrt(norm2(M.geom, b - M(x)) / norm2(M.geom, b))


def crandn(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def rand8():
    """Haar-random 8^4 HISQ-like links and a four-level hierarchy on them (identities only: MG does not converge
    on Haar-random links, as MILC's and QUDA's staggered MG at strong coupling)."""
    geom = Geometry((8, 8, 8, 8))
    D = StaggeredDslash(geom, *random_links(geom, seed=31))
    inv = multigrid(TOL, levels=4, blocks=[(4, 4, 4, 4), (2, 2, 2, 2)], nv=(8, 6), setup_iters=(10, 10))(
        D.matrix(0.05))
    inv.setup()
    return inv


@pytest.fixture(scope="module")
def l8888():
    from force.hisq_links import hisq_links
    from lattice.io import read_gauge

    u, info = read_gauge(fixture_path("lat.sample.l8888"))
    assert tuple(info["dims"]) == (8, 8, 8, 8)
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    return u, links, StaggeredDslash(u.geom, links.fat, links.long)


@pytest.fixture(scope="module")
def source8(l8888):
    return random_field(l8888[0].geom, np.random.default_rng(3))


@pytest.fixture(scope="module")
def mass_scan(l8888, source8):
    """MG (one set of near-null vectors, a hierarchy per mass) and even-odd CG at m = 0.1, 0.01, 0.001."""
    D = l8888[2]
    b = source8
    out = {}
    inv = None
    for m in MASSES:
        inv = multigrid(TOL, **FAST)(D.matrix(m)) if inv is None else inv.with_mass(m)
        x, st = inv.solve(b)
        xc, sc = even_odd_inverse(D.even_odd(m), cg(1e-12, 20000)).solve(b)
        out[m] = dict(inv=inv, x=x, stats=st, x_cg=xc, cg=sc)
        print(f"\nm = {m}: {st}\n  " + "\n  ".join(st.level_lines()) + f"\n  even-odd CG: {sc.iters} iterations")
    return out


# ------------------------------------------------------------------------------------------------ identities
def test_restrict_prolong_is_identity(rand8):
    rng = np.random.default_rng(1)
    for tr in rand8.hierarchy.transfers:
        c = crandn(rng, tuple(tr.cgeom.shape) + (tr.n,))
        assert relative(tr.cgeom, tr.restrict(tr.prolong(c)), c) < 1e-14
        assert orthonormality_error(tr) < 1e-13
        cb = crandn(rng, tuple(tr.cgeom.shape) + (tr.n, 3))          # batches too
        assert relative(tr.cgeom, tr.restrict(tr.prolong(cb)), cb) < 1e-14


def test_null_vectors_lie_in_range_of_P(rand8):
    sub = rand8.subspace
    assert len(sub.vectors) == 2
    for tr, V in zip(rand8.hierarchy.transfers, sub.vectors):
        for j in range(V.shape[-1]):
            v = V[..., j]
            assert relative(tr.fine_geom, tr.prolong(tr.restrict(v)), v) < 1e-14


@pytest.mark.parametrize("lattice", ["8^4", "4^4"])
def test_galerkin_identity_with_naik(rand8, lattice):
    """The assembled 9-point stencil applied to c equals R A P c (and the adjoint stencil R A^dag P c), with the
    Naik term on; on 4^4 the one coarse site is its own neighbour in every direction."""
    if lattice == "8^4":
        inv = rand8
    else:
        geom = Geometry((4, 4, 4, 4))
        D = StaggeredDslash(geom, *random_links(geom, seed=32))
        assert D.naik
        inv = multigrid(TOL, nv=6, setup_iters=5)(D.matrix(0.02))
        inv.setup()
    h = inv.hierarchy
    rng = np.random.default_rng(2)
    for l, tr in enumerate(h.transfers, start=1):
        fine, coarse = h.ops[l], h.ops[l + 1]
        assert isinstance(coarse, CoarseOperator) and coarse.Y.shape[0] == 9
        c = crandn(rng, tuple(tr.cgeom.shape) + (tr.n,))
        err = relative(tr.cgeom, coarse.apply(c), tr.restrict(fine.apply(tr.prolong(c))))
        err_adj = relative(tr.cgeom, coarse.apply_adjoint(c), tr.restrict(fine.apply_adjoint(tr.prolong(c))))
        print(f"{lattice} level {l + 1}: Galerkin {err:.2e}, adjoint {err_adj:.2e}")
        assert err < 1e-13 and err_adj < 1e-13


def test_coarse_correction_removes_null_vectors(rand8):
    """(1 - P A_c^-1 R A) v = 0 for a near-null vector v, A_c^-1 exact (dense, here)."""
    h = rand8.hierarchy
    tr, A, Ac = h.transfers[0], h.ops[1], h.ops[2]
    dense = Ac.sparse_matrix().toarray()
    lu_inv = np.linalg.inv(dense)
    V = rand8.subspace.vectors[0]
    for j in (0, V.shape[-1] - 1):
        v = V[..., j]
        rc = tr.restrict(A.apply(v))
        y = (lu_inv @ rc.ravel()).reshape(rc.shape)
        assert relative(tr.fine_geom, tr.prolong(y), v) < 1e-13       # |v - P A_c^-1 R A v| / |v|
    # the solver's own coarsest solve (sparse LU, on level 3 here) does the same
    tr3, A2 = h.transfers[1], h.ops[2]
    v = rand8.subspace.vectors[1][..., 0]
    y = h.lu.solve(tr3.restrict(A2.apply(v)).ravel()).reshape(tuple(tr3.cgeom.shape) + (tr3.n,))
    assert relative(tr3.fine_geom, tr3.prolong(y), v) < 1e-13


def test_kd_inverse_and_hypercube_restriction():
    geom = Geometry((8, 8, 8, 8))           # 8 wide: a 3-hop cannot wrap back into its own hypercube
    D = StaggeredDslash(geom, *random_links(geom, seed=33))
    m = 0.03
    M = D.matrix(m)
    kd = KDBlocks(FineStencil(M))
    eye = np.eye(48)
    assert np.abs(kd.Xinv @ kd.X - eye).max() < 1e-12                  # X^-1 X = 1 per block
    psi = random_field(geom, np.random.default_rng(4))
    assert relative(geom, kd.apply_inv(kd.apply_X(psi)), psi) < 1e-13
    # X is M restricted to a hypercube: for psi on one hypercube, (M psi) there equals X psi
    blocks = to_blocks(np.zeros(geom.shape + (3,), complex), HYPERCUBE)
    for hc in (0, 7, blocks.shape[0] - 1):
        one = np.zeros_like(blocks)
        one[hc] = to_blocks(psi, HYPERCUBE)[hc]
        f = from_blocks(one, HYPERCUBE, geom.shape)
        assert np.abs(to_blocks(M(f), HYPERCUBE)[hc] - to_blocks(kd.apply_X(f), HYPERCUBE)[hc]).max() < 1e-14
    # X^-1 of the adjoint: <a, X^-1 b> = <X^-dag a, b>
    a = random_field(geom, np.random.default_rng(5))
    assert abs(np.vdot(a, kd.apply_inv(psi)) - np.vdot(kd.apply_inv_adjoint(a), psi)) < 1e-12 * np.abs(
        np.vdot(a, kd.apply_inv(psi))) + 1e-12


@pytest.mark.parametrize("mass", [0.1, 0.001])
def test_free_field_XdagX_proportional_to_one(mass):
    geom = Geometry((4, 4, 4, 4))
    D = StaggeredDslash(geom, *free_links(geom))
    kd = KDBlocks(FineStencil(D.matrix(mass)))
    XX = kd.X.conj().swapaxes(-1, -2) @ kd.X
    c = 4 * mass ** 2 + 4 * (9 / 8) ** 2           # M = 2m + D normalization, free HISQ fat link 9/8
    assert np.abs(XX - c * np.eye(48)).max() < 1e-13


# ------------------------------------------------------------------------------------------------ convergence
def test_outer_iterations_flat_in_mass_while_cg_grows(mass_scan):
    its = {m: mass_scan[m]["stats"].iters for m in MASSES}
    cg_its = {m: mass_scan[m]["cg"].iters for m in MASSES}
    print(f"\nMG outer iterations {its}; even-odd CG iterations {cg_its}")
    assert max(its.values()) <= 1.3 * min(its.values())
    assert cg_its[0.001] > cg_its[0.1]
    for m in MASSES:
        st = mass_scan[m]["stats"]
        assert isinstance(st, MultigridStats) and st.converged
        assert [d["level"] for d in st.levels] == [0, 1, 2]
        assert st.levels[0]["iters"] == st.iters and st.levels[1]["cycles"] == st.iters
        assert st.levels[2]["direct_solves"] == st.iters
        assert st.fine_applies == st.levels[0]["applies"] + st.levels[1]["applies"] > st.iters
        assert st.solve_time > 0
    assert mass_scan[0.1]["stats"].setup == "built" and mass_scan[0.1]["stats"].setup_time > 0
    assert mass_scan[0.01]["stats"].setup == "rebuilt" and mass_scan[0.01]["stats"].setup_fine_applies == 32


def test_multigrid_equals_cg(l8888, source8, mass_scan):
    D, b = l8888[2], source8
    for m in MASSES:
        M = D.matrix(m)
        r = mass_scan[m]
        res = true_residual(M, r["x"], b)                    # recomputed here
        assert res <= TOL and abs(res - r["stats"].true_residual) <= 1e-3 * res
        # CG stops on the even-site system (MILC's rule, tol 1e-12): |b - M x| = |r_e|/(2m) can be larger
        assert true_residual(M, r["x_cg"], b) <= 1e-12 * 5 / (2 * m)
        diff = relative(D.geom, r["x"], r["x_cg"])
        print(f"m = {m}: |x_mg - x_cg|/|x_cg| = {diff:.2e}, MG true residual {res:.2e}")
        assert diff < 1e-8


def test_without_kd_converges_far_worse(l8888, source8, mass_scan):
    """Negative control: the same hierarchy (blocks, nv, set-up iterations, smoothers) on M itself. With the KD step
    the solve converges in N outer iterations; without it, 2N iterations leave the residual orders of magnitude
    above the tolerance (at m = 0.01 it needs about 250)."""
    m = 0.01
    D = l8888[2]
    kd_iters = mass_scan[m]["stats"].iters
    cap = 2 * kd_iters
    x, st = multigrid(TOL, maxiter=cap, kd=False, raise_on_fail=False, **FAST)(D.matrix(m)).solve(source8)
    print(f"\nwithout KD: {st}; with KD: {kd_iters} iterations")
    assert st.levels[1]["operator"] == "M (no KD)"
    assert not st.converged and st.iters == cap and st.true_residual > 1e4 * TOL


def test_setup_reuse_masses_and_link_updates(l8888, source8):
    """Near-null vectors kept across masses (only X^-1 and the coarse operators are rebuilt) and refreshed after a
    link update (here the Naik epsilon changes the fat and long links)."""
    from force.hisq_links import hisq_links

    u, links, _ = l8888
    D = StaggeredDslash(u.geom, links.fat, links.long)         # its own operator: the links change below
    b = source8
    inv = multigrid(TOL, refresh_iters=10, **FAST)(D.matrix(0.1))
    x, st = inv.solve(b)
    probes = 2 * 16                                            # the Galerkin probes: one application per column
    # per vector: A^dag A x at the start, A and A^dag per CG iteration, A x of the result (its |A x|/|x|)
    assert st.setup == "built" and st.setup_fine_applies == 16 * (2 * 50 + 3) + probes
    vectors = inv.subspace.vectors[0]
    assert inv.setup() == "reused"
    x, st2 = inv.solve(b, x)                                   # from the solution: converged at once
    assert st2.setup == "reused" and st2.setup_time == 0 and st2.iters == 0 and st2.converged
    inv2 = inv.with_mass(0.02)
    assert inv2.setup() == "rebuilt" and inv2.subspace is inv.subspace and inv.subspace.vectors[0] is vectors
    assert inv2.hierarchy.kd.mass == 0.02 and inv.hierarchy.kd.mass == 0.1
    new = hisq_links(u, eps=-0.05, time_bc="antiperiodic")
    D.set_links(new.fat, new.long)
    x, st4 = inv.solve(b)
    assert st4.setup == "refreshed" and st4.setup_fine_applies == 16 * (2 * 10 + 3) + probes
    assert st4.converged and true_residual(D.matrix(0.1), x, b) <= TOL
    assert inv.subspace.vectors[0] is not vectors
    assert st4.iters <= 1.3 * st.iters + 2
    assert inv2.setup() == "rebuilt"                          # the other mass follows: rebuilt, not refreshed
    assert inv2._pending[-1][2] == probes
    print(f"\nbuilt: {st.iters} iterations; after the link update, refreshed: {st4.iters}")


def test_four_levels_kcycle_gcr_coarsest(l8888, source8):
    """Four levels: the level-2 solve is a K-cycle (flexible GCR to kcycle_tol, at most kcycle_maxiter iterations,
    preconditioned by the level-2 cycle), the coarsest (level 3) is solved by GCR."""
    D, b = l8888[2], source8
    m = 0.01
    inv = multigrid(TOL, levels=4, nv=(16, 12), setup_iters=(50, 30), maxiter=150, coarsest="gcr")(D.matrix(m))
    x, st = inv.solve(b)
    assert st.converged and true_residual(D.matrix(m), x, b) <= TOL
    assert st.extra["coarsest"] == "gcr"
    assert [d["level"] for d in st.levels] == [0, 1, 2, 3]
    assert st.levels[2]["krylov_iters"] >= st.iters and st.levels[2]["cycles"] == st.levels[2]["krylov_iters"]
    assert st.levels[3]["krylov_iters"] > 0 and st.levels[3]["lattice"] == "1x1x1x1"
    print("\n" + "\n".join(st.level_lines()))


def test_partitioned_grid_gives_the_same_hierarchy(l8888, source8):
    """Every neighbour access goes through Geometry.shift (fine) and CoarseGeometry.shift (coarse): on a grid whose
    dimensions are partitioned (one rank exchanging halos with itself) the vectors, the coarse operator and the
    iterates are those of the plain grid, to rounding."""
    from comms import ProcessGrid

    _, links, D = l8888
    try:
        part = Geometry((8, 8, 8, 8), grid=ProcessGrid(partitioned="xyzt"))
    except Exception as exc:            # no MPI library for the self-exchange
        pytest.skip(f"partitioned one-rank grid unavailable: {exc}")
    try:
        D2 = StaggeredDslash(part, links.fat, links.long)
        kw = dict(nv=8, setup_iters=20, maxiter=6, raise_on_fail=False, coarsest="gcr")
        i1, i2 = multigrid(TOL, **kw)(D.matrix(0.01)), multigrid(TOL, **kw)(D2.matrix(0.01))
        x1, s1 = i1.solve(source8)
        x2, s2 = i2.solve(source8)
        assert all(part.grid.partitioned)
        Y1, Y2 = i1.hierarchy.ops[2].Y, i2.hierarchy.ops[2].Y
        assert np.abs(Y1 - Y2).max() < 1e-12 * np.abs(Y1).max()
        assert relative(part, x2, x1) < 1e-10 and abs(s1.residual - s2.residual) < 1e-6 * s1.residual
        # per-level time split: the coarse stencil's shifts are halo exchanges only on the partitioned grid
        assert s1.levels[2]["halo_exchanges"] == 0 and s2.levels[2]["halo_exchanges"] > 0
        for d in s2.levels:
            assert d["reductions"] > 0
            assert abs(d["compute_time"] + d["halo_time"] + d["reduce_time"] - d["time"]) <= 1e-9 + 1e-6 * d["time"]
        assert "halo" in s2.level_lines()[2] and "reductions" in s2.level_lines()[0]
    finally:
        part.grid.close()                  # its engine and shm window (the teardown check)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("blocks,naik,match", [
    ([(3, 4, 4, 4)], True, "block extent 3 in direction x is odd"),
    ([(4, 4, 6, 4)], True, "block extent 6 in direction z does not tile the local extent 8"),
    ([(4, 2, 4, 4)], True, "block extent 2 in direction y is narrower than 3"),
    ([(4, 4, 4, 4), (2, 2, 2, 3)], True, "level 3: block extent 3 in direction t does not tile"),
    ([(4, 4, 4, 4), (0, 2, 2, 2)], True, "level 3: block extent 0 in direction x must be positive"),
])
def test_bad_blocks_are_one_line_errors(blocks, naik, match):
    geom = Geometry((8, 8, 8, 8))
    fat, long = free_links(geom)
    D = StaggeredDslash(geom, fat, long if naik else None)
    with pytest.raises(MultigridError, match=match) as e:
        multigrid(TOL, levels=1 + len(blocks) + 1, blocks=blocks)(D.matrix(0.1))
    assert "\n" not in str(e.value)


def test_other_bad_parameters():
    geom = Geometry((8, 8, 8, 8))
    fat, long = free_links(geom)
    D = StaggeredDslash(geom, fat, long)
    M = D.matrix(0.1)
    for kw, match in [(dict(levels=2), "at least 3"), (dict(levels=3, blocks=[(4, 4, 4, 4)] * 2), "blocks: 2 given"),
                      (dict(nv=0), "nv = 0"), (dict(tol=2.0), "tolerance"), (dict(coarsest="qr"), "coarsest")]:
        with pytest.raises(MultigridError, match=match):
            multigrid(**kw)(M)
    # without the Naik term two-site-wide aggregates are allowed (one-link hops reach only the neighbour)
    inv = multigrid(TOL, blocks=[(2, 4, 4, 4)])(StaggeredDslash(geom, fat).matrix(0.1))
    assert inv.params.blocks == ((2, 4, 4, 4),)
    with pytest.raises(TypeError, match="StaggeredMatrix"):
        multigrid()(D.even_odd(0.1).normal)


def test_composes_as_an_operator(mass_scan, source8):
    """inv(b) is M^-1 b; its adjoint is (M^dag)^-1 = eps M^-1 eps."""
    inv = mass_scan[0.1]["inv"]
    M = inv.op
    x = inv(source8)
    assert true_residual(M, x, source8) <= TOL
    y = inv.adjoint()(source8)
    assert true_residual(M.adjoint(), y, source8) <= 10 * TOL
