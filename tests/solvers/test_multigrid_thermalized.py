"""Issue 7's must-show point on a field made here, without the MILC fixtures (docs/multigrid.md "Tests that prove it"):
on a thermalized 8^4 HISQ configuration the multigrid outer iteration count is flat within 30% from m = 0.1 down
to m = 0.001 while even-odd CG's grows, and without the Kahler-Dirac step the same hierarchy converges far worse.

test_multigrid.py shows the same on MILC's lat.sample.l8888 (and skips without ../shared/fixtures). Here the
field is quenched Wilson beta 6.0 from a cold start and 15 pure-gauge MD trajectories (Omelyan, 10 steps, tau 1,
no accept/reject: warm-ups), the start of bench/mg.py (hmc bench mg); its plaquette is checked to be within 1% of the
equilibrium value 0.5937. Slow (about 40 s on one core): the field alone takes ~13 s.
"""
import math

import numpy as np
import pytest

from lattice import CounterRNG, GaugeField, Geometry
from lattice.gauge import plaquette
from solvers import StaggeredDslash, cg, even_odd_inverse, norm2
from solvers.multigrid import multigrid

from solver_testlib import random_field

pytestmark = pytest.mark.slow

TOL = 1e-10
MASSES = (0.1, 0.01, 0.001)
FAST = dict(nv=16, setup_iters=50)
PLAQ_EQUILIBRIUM = 0.5937          # <ReTr P>/3, quenched Wilson beta 6.0


@pytest.fixture(scope="module")
def thermalized8():
    from force.hisq_links import hisq_links
    from hmc.assemble import make_gauge_action
    from hmc.integrators import Level, build_schedule
    from hmc.monomials import GaugeMonomial
    from hmc.trajectory import hmc_trajectory

    geom = Geometry((8, 8, 8, 8))
    rng = CounterRNG(7)
    u = GaugeField.unit(geom)
    mon = [GaugeMonomial(make_gauge_action({"action": "wilson", "beta": 6.0}))]
    sched = build_schedule([Level("omelyan", 10, ["gauge"])], 1.0)
    plaqs = []
    for _ in range(15):
        u, _res = hmc_trajectory(u, rng, mon, sched, metropolis=False)
        plaqs.append(sum(plaquette(u)) / 6.0)
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    return plaqs, StaggeredDslash(geom, links.fat, links.long)


@pytest.fixture(scope="module")
def scan(thermalized8):
    D = thermalized8[1]
    b = random_field(D.geom, np.random.default_rng(3))
    out, inv = {}, None
    for m in MASSES:
        inv = multigrid(TOL, **FAST)(D.matrix(m)) if inv is None else inv.with_mass(m)
        x, st = inv.solve(b)
        _, sc = even_odd_inverse(D.even_odd(m), cg(1e-12, 20000)).solve(b)
        out[m] = dict(x=x, stats=st, cg=sc)
    return b, out


def test_field_is_thermalized_in_the_plaquette(thermalized8):
    plaqs = thermalized8[0]
    print(f"\nplaquette history {[round(p, 4) for p in plaqs]}")
    assert plaqs[0] > 0.8                                       # it started cold ...
    assert all(abs(p / PLAQ_EQUILIBRIUM - 1) < 0.01 for p in plaqs[-3:])    # ... and reached equilibrium


def test_outer_iterations_flat_while_cg_grows(thermalized8, scan):
    D = thermalized8[1]
    b, out = scan
    its = {m: out[m]["stats"].iters for m in MASSES}
    cg_its = {m: out[m]["cg"].iters for m in MASSES}
    print(f"\nMG outer iterations {its}; even-odd CG iterations {cg_its}")
    assert max(its.values()) <= 1.3 * min(its.values())
    # CG grows, though only by ~15% on 8^4: the finite volume keeps the lowest eigenvalue of D near 0.01
    assert cg_its[0.1] < cg_its[0.01] <= cg_its[0.001]
    for m in MASSES:
        M = D.matrix(m)
        res = math.sqrt(norm2(D.geom, b - M(out[m]["x"])) / norm2(D.geom, b))    # recomputed here
        assert out[m]["stats"].converged and res <= TOL


def test_without_kd_far_worse(thermalized8, scan):
    """Negative control: the same hierarchy on M itself; twice the KD solve's outer iterations leave the residual
    orders of magnitude above the tolerance."""
    D = thermalized8[1]
    b, out = scan
    m = 0.01
    cap = 2 * out[m]["stats"].iters
    _, st = multigrid(TOL, maxiter=cap, kd=False, raise_on_fail=False, **FAST)(D.matrix(m)).solve(b)
    print(f"\nwithout KD: {st}; with KD: {out[m]['stats'].iters} iterations")
    assert st.levels[1]["operator"] == "M (no KD)"
    assert not st.converged and st.iters == cap and st.true_residual > 1e4 * TOL
