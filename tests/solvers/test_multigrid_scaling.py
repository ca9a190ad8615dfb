"""Guards of issue 7's scaling study (the notes in solvers/multigrid/__init__.py): the outer flexible GCR sees its
residual fall below the rounding floor of its |r|^2 recurrence (a long Krylov cycle stops at the tolerance instead
of running on to the next restart); the default smoothers spend no applications of M on smoothing M itself; the
K-cycle's default inner solves cost no outer iterations against exact ones (the growth with depth seen at 32^4)."""
import numpy as np
import pytest

from lattice import Geometry
from solvers.multigrid.krylov import fgcr, norm2

from solver_testlib import random_field


def test_fgcr_stops_at_tolerance_below_recurrence_floor():
    """A diagonal system with eigenvalues in [1, 4]: GCR reaches 1e-12 in ~20 directions. The recurrence
    |r|^2 - |<q, r>|^2/|q|^2 alone stalls near 1e-8 relative residual (it subtracts numbers of the size of |b|^2);
    without measuring |r|^2 below that floor the solve ran to maxiter (200) and far below the tolerance."""
    geom = Geometry((4, 4, 4, 4))
    rng = np.random.default_rng(1)
    shape = tuple(geom.shape) + (3,)
    d = rng.uniform(1.0, 4.0, shape) * np.exp(1j * rng.uniform(-0.3, 0.3, shape))
    b = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    x, res = fgcr(lambda v: d * v, lambda r: r, geom, b, 1e-12, 200, nkrylov=200, true_residual=True)
    true = np.sqrt(norm2(geom, b - d * x) / norm2(geom, b))
    assert res.converged and true <= 1e-12
    assert res.iters < 60, f"{res.iters} iterations: the residual recurrence stalled at its rounding floor"
    assert true > 1e-15, "ran far past the tolerance"


# ------------------------------------------------------------------------------------------------ the defaults
@pytest.fixture(scope="module")
def l8888_hierarchy():
    """MILC's lat.sample.l8888 (HISQ links, antiperiodic time) at m = 0.001, three levels (4^4 blocks, 2^4 coarsest
    lattice by LU), a light set-up (Nv 12, 20 iterations); a random source."""
    from tests.conftest import fixture_path
    from force.hisq_links import hisq_links
    from lattice.io import read_gauge
    from solvers import StaggeredDslash
    from solvers.multigrid import multigrid

    u, _info = read_gauge(fixture_path("lat.sample.l8888"))
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    D = StaggeredDslash(u.geom, links.fat, links.long)
    inv = multigrid(1e-10, nv=12, setup_iters=20)(D.matrix(0.001))
    b = random_field(u.geom, np.random.default_rng(3))
    return inv, b


def test_no_fine_smoother_saves_applications(l8888_hierarchy):
    """The default smoothers (0, 4): GCR on M = 2m + D itself (spectrum on the line 2m + i y) barely smooths, so
    the old level-0 steps (4, 2) cost ~9 applications of M per outer iteration for about the same outer count;
    without them ~6 (measured 12^4: 508 against 340 applications at 56 outer iterations each)."""
    inv, b = l8888_hierarchy
    _, st = inv.solve(b)
    _, old = inv.with_mass(0.001, smoother_steps=(4, 2)).solve(b)
    assert st.converged and old.converged
    assert st.fine_applies <= 6.5 * st.iters, f"{st.fine_applies} applications in {st.iters} outer iterations"
    assert st.fine_applies < 0.85 * old.fine_applies, (st.fine_applies, old.fine_applies)
    assert st.iters <= 1.2 * old.iters + 2


def test_kcycle_and_krylov_defaults():
    """The K-cycle's inner solves default to 0.05 in at most 20 iterations: GCR to 0.25 (2 to 3 iterations) leaves
    the coarse operator's smallest-eigenvalue error, and the loss grows with volume and depth (16^4, four levels:
    57 outer iterations against 53 with 0.05 and 55 with exact inner solves; 32^4, five levels: 141). Too slow to
    show on a lattice CI can afford (8^4: equal counts), so the defaults themselves are pinned here."""
    from solvers.multigrid import MultigridParams

    p = MultigridParams()
    assert p.kcycle_tol <= 0.05 and p.kcycle_maxiter >= 20
    assert tuple(p.smoother_steps)[0] == 0 and p.nkrylov >= 32 and p.setup_iters == (50,)
