"""The multigrid's per-level traffic (``hmc bench mg``'s per-level lines): every coarse application moves its
stencil once (9 blocks of n x n a site, in the cycle's precision) and a vector in and out; the level's ``bytes`` are
its applications times that, and the level line gives the rate over the level's time (what a level reaches of the
copy bandwidth). NumPy."""
import numpy as np
import pytest

from lattice import Geometry
from solvers import StaggeredDslash
from solvers.multigrid import multigrid

from solver_testlib import random_field, random_links

KW = dict(levels=4, blocks=[(4, 4, 4, 4), (2, 2, 2, 2)], nv=(8, 6), setup_iters=(10, 10), kcycle_tol=1e-3)


@pytest.fixture(scope="module")
def solves():
    geom = Geometry((8, 8, 8, 8))
    D = StaggeredDslash(geom, *random_links(geom, seed=31))
    b = random_field(geom, np.random.default_rng(2))
    out = {}
    for precision in ("double", "half"):
        inv = multigrid(1e-8, precision=precision, maxiter=6, raise_on_fail=False, **KW)(D.matrix(0.05))
        out[precision] = (inv, inv.solve(b)[1])
    return out


@pytest.mark.parametrize("precision", ["double", "half"])
def test_level_bytes_are_its_applications_times_the_stencil(solves, precision):
    inv, st = solves[precision]
    ops = inv.hierarchy.cycle.ops
    level = st.levels[2]
    op = ops[2]
    assert level["applies"] > 0 and level["bytes"] == level["applies"] * op.bytes_per_apply
    vector = 8 if precision == "half" else 16
    stencil = 9 * op.n * op.n * op.geom.volume * (4 if precision == "half" else 16)
    assert stencil + 2 * op.n * op.geom.volume * vector <= op.bytes_per_apply <= 1.1 * (
        stencil + 2 * op.n * op.geom.volume * vector)
    line = st.level_lines()[2]
    assert "stencil traffic" in line and "GB/s over the level's time" in line
    assert "stencil traffic" not in st.level_lines()[0]


def test_half_storage_moves_a_quarter_of_double(solves):
    d, h = solves["double"][0].hierarchy.cycle.ops[2], solves["half"][0].hierarchy.cycle.ops[2]
    assert 3.0 < d.bytes_per_apply / h.bytes_per_apply < 4.0
