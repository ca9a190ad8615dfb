"""The batched solve phase (solvers/multigrid/batched.py): k right-hand sides through one outer flexible GCR and
K-cycle with per-column coefficients give the k single solves' solutions to the tolerance and the same outer
iteration counts (within 1), on MILC's lat.sample.l8888 (measured: 55 and 55, solutions equal to 4e-16)."""
import numpy as np
import pytest

from solvers import StaggeredDslash
from solvers.multigrid import multigrid
from solvers.multigrid.batched import col_sums, solve_columns
from tests.conftest import fixture_path

from solver_testlib import random_field, rel


@pytest.fixture(scope="module")
def l8888_inv():
    from force.hisq_links import hisq_links
    from lattice.io import read_gauge

    u, _ = read_gauge(fixture_path("lat.sample.l8888"))
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    inv = multigrid(1e-10, nv=8, setup_iters=20)(StaggeredDslash(u.geom, links.fat, links.long).matrix(0.01))
    inv.setup()
    return inv


def test_column_sums_are_per_column_dots():
    rng = np.random.default_rng(1)
    from lattice import Geometry

    geom = Geometry((4, 4, 4, 4))
    a = rng.standard_normal((4, 4, 4, 4, 3, 2)) + 1j * rng.standard_normal((4, 4, 4, 4, 3, 2))
    b = rng.standard_normal(a.shape) + 1j * rng.standard_normal(a.shape)
    got = col_sums(geom, [(a, b)])[0]
    assert np.allclose(got, [np.vdot(a[..., j], b[..., j]) for j in range(2)], rtol=1e-13)


def test_batched_solve_equals_single_solves(l8888_inv):
    inv = l8888_inv
    rng = np.random.default_rng(3)
    bs = [random_field(inv.geom, rng) for _ in range(2)]
    X, info = solve_columns(inv, np.stack(bs, axis=-1))
    assert max(info["true_residual"]) <= 1e-10
    for j, b in enumerate(bs):
        x, st = inv.solve(b)
        assert abs(info["iters"][j] - st.iters) <= 1, (info["iters"], st.iters)
        assert rel(X[..., j], x) < 1e-8
