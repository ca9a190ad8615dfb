"""The operator and solvers on CuPy give the NumPy results (run on the device: pytest -m gpu)."""
import time

import numpy as np
import pytest

from lattice import Geometry, get_backend
from solvers import StaggeredDslash, cg, even_odd_inverse, mixed_cg, multishift_cg, project

from solver_testlib import random_field, random_links, rel

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair():
    cpu = Geometry((4, 4, 4, 8), get_backend("numpy"))
    gpu = Geometry((4, 4, 4, 8), get_backend("cupy"))
    fat, long = random_links(cpu, seed=5)
    xp = gpu.xp
    return StaggeredDslash(cpu, fat, long), StaggeredDslash(gpu, xp.asarray(fat), xp.asarray(long))


def test_operators_match(pair):
    dc, dg = pair
    be = dg.geom.backend
    psi = random_field(dc.geom, np.random.default_rng(1))
    pg = dg.xp.asarray(psi)
    assert rel(be.to_numpy(dg(pg)), dc(psi)) < 1e-14
    for m in (0.0, 0.1):
        assert rel(be.to_numpy(dg.even_odd(m).normal(pg)), dc.even_odd(m).normal(psi)) < 1e-14
    assert rel(be.to_numpy(dg.matrix(0.1).adjoint()(pg)), dc.matrix(0.1).adjoint()(psi)) < 1e-14
    s = dg.converted(np.complex64)
    out = s(pg.astype(np.complex64))
    assert out.dtype == np.complex64 and rel(be.to_numpy(out), dc(psi)) < 1e-6


def test_solvers_match(pair):
    dc, dg = pair
    be = dg.geom.backend
    b = project(random_field(dc.geom, np.random.default_rng(2)), dc.geom, 0)
    bg = dg.xp.asarray(b)
    for solver in (cg(1e-10, 3000), mixed_cg(1e-10, 3000)):
        xc, sc = solver(dc.even_odd(0.05).normal).solve(b)
        xg, sg = solver(dg.even_odd(0.05).normal).solve(bg)
        assert sg.converged and sg.true_residual <= 1e-10 and abs(sg.iters - sc.iters) <= 2
        assert rel(be.to_numpy(xg), xc) < 1e-8
    xs = multishift_cg([0.01, 0.3], 1e-10)(dg.even_odd(0.0).normal)(bg)
    ref = multishift_cg([0.01, 0.3], 1e-10)(dc.even_odd(0.0).normal)(b)
    assert all(rel(be.to_numpy(u), v) < 1e-8 for u, v in zip(xs, ref))
    full = random_field(dc.geom, np.random.default_rng(3))
    x = even_odd_inverse(dg.even_odd(0.1), mixed_cg(1e-10, 3000))(dg.xp.asarray(full))
    assert rel(be.to_numpy(dg.matrix(0.1)(x)), full) < 1e-8


def test_numpy_body_speed_on_gpu():
    """Not a requirement: how fast the NumPy body runs on CuPy before a CUDA kernel replaces it."""
    geom = Geometry((16, 16, 16, 16), get_backend("cupy"))
    cpu = Geometry((16, 16, 16, 16), get_backend("numpy"))
    fat, long = random_links(cpu, seed=6)
    d = StaggeredDslash(geom, geom.xp.asarray(fat), geom.xp.asarray(long))
    for dtype in (np.complex128, np.complex64):
        a = d.converted(dtype).even_odd(0.1).normal
        psi = geom.xp.asarray(project(random_field(cpu, np.random.default_rng(4)), cpu, 0)).astype(dtype)
        a(psi)
        geom.backend.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            a(psi)
        geom.backend.synchronize()
        dt = (time.perf_counter() - t0) / 10
        print(f"\n16^4 even-odd normal operator, NumPy body on CuPy, {np.dtype(dtype)}: {dt * 1e3:.2f} ms, "
              f"{a.flops / dt / 1e9:.1f} GFlop/s")
