"""The operator and the solvers reach neighbours only through Geometry.shift and sum only through Geometry.sum:
on a grid whose dimensions are partitioned (one rank exchanging halos with itself, the whole pack/exchange/unpack
path of comms.halo) they give bitwise the single-process results."""
import numpy as np
import pytest

from solvers import StaggeredDslash, cg, mixed_cg, multishift_cg, project, set_reductions

from solver_testlib import partitioned_pair, random_field


@pytest.fixture(scope="module")
def pair():
    plain, part, links = partitioned_pair()
    return StaggeredDslash(plain, *links), StaggeredDslash(part, *links)


@pytest.fixture
def exact_sums():
    old = set_reductions("exact")
    yield
    set_reductions(old)


def test_dslash_bitwise_on_partitioned_grid(pair):
    d1, d2 = pair
    assert all(d2.geom.grid.partitioned) and not any(d1.geom.grid.partitioned)
    psi = random_field(d1.geom, np.random.default_rng(1))
    assert np.array_equal(d1(psi), d2(psi))
    assert np.array_equal(d1.even_odd(0.1).normal(psi), d2.even_odd(0.1).normal(psi))


def test_solvers_bitwise_on_partitioned_grid(pair, exact_sums):
    d1, d2 = pair
    b = project(random_field(d1.geom, np.random.default_rng(2)), d1.geom, 0)
    for solver in (cg(1e-8, 2000), mixed_cg(1e-8, 2000)):
        x1, s1 = solver(d1.even_odd(0.4).normal).solve(b)
        x2, s2 = solver(d2.even_odd(0.4).normal).solve(b)
        assert np.array_equal(x1, x2) and s1.iters == s2.iters and s1.true_residual == s2.true_residual
    xs1 = multishift_cg([0.64, 2.0], 1e-8)(d1.even_odd(0.0).normal)(b)
    xs2 = multishift_cg([0.64, 2.0], 1e-8)(d2.even_odd(0.0).normal)(b)
    assert all(np.array_equal(u, v) for u, v in zip(xs1, xs2))
