"""Half-precision coarse stencils (solvers/multigrid/half.py, ``precision="half"``): the 16-bit encoding with a
scale per block, the kernel's NumPy twin against the decoded-float32 reference, the kernel compiled for the host
(tests/force/cuda_host.py) against the twin, and a half solve on MILC's lat.sample.l8888 within a few outer
iterations of double."""
import math

import numpy as np
import pytest

from lattice import Geometry
from lattice.backend import Backend
from solvers import StaggeredDslash, norm2
from solvers.multigrid import cuda as mgcuda
from solvers.multigrid import half, multigrid
from solvers.multigrid.lattice import CoarseGeometry
from solvers.multigrid.operators import CoarseOperator, Counter
from tests.conftest import fixture_path, gpu_available
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_field, rel


def crandn(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def coarse_op(n=6, seed=1):
    geom = CoarseGeometry(Geometry((8, 8, 8, 8)), (4, 4, 2, 2))          # coarse 2x2x4x4
    rng = np.random.default_rng(seed)
    Y = crandn(rng, (9,) + tuple(geom.shape) + (n, n))
    Y *= 10.0 ** rng.uniform(-3, 1, size=(9,) + tuple(geom.shape))[..., None, None]    # blocks of any size
    return CoarseOperator(geom, Y, Counter(), 2)


def test_encoding_error_is_half_a_step_of_each_block():
    op = coarse_op()
    Yq, scale = half.encode(np, op.Y)
    assert Yq.dtype == np.int16 and scale.dtype == np.float32 and np.abs(Yq).max() == half.QMAX
    err = half.decode(np, Yq, scale) - op.Y
    bound = 0.51 * scale[..., None, None] + 1e-7 * np.abs(op.Y)           # half a step, plus float32 rounding
    assert (np.abs(err.real) <= bound).all() and (np.abs(err.imag) <= bound).all()
    assert rel(half.decode(np, Yq, scale), op.Y) > 1e-7                 # it is a rounding, not a copy


def test_half_operator_twin_equals_decoded_reference():
    op = coarse_op()
    h = half.HalfCoarseOperator(op)
    nb = mgcuda.neighbour_table(op.geom)
    rng = np.random.default_rng(2)
    for shape in (op.shape, op.shape + (3,)):
        v = crandn(rng, shape).astype(np.complex64)
        ref = CoarseOperator(op.geom, h.Y, Counter(), 2).apply(v)             # decoded float32, array path
        assert rel(half.stencil_reference(h.Yq, h.scale, v, nb), ref) < 1e-6
        assert rel(h.apply(v), ref) < 1e-6 and h.apply(v).dtype == np.complex64
        assert 1e-7 < rel(h.apply(v), op.apply(v)) < 1e-4                   # close to the exact stencil


@needs_gxx
def test_half_kernel_on_the_host_equals_twin():
    if gpu_available():
        pytest.skip("the GPU test covers it")
    op = coarse_op(n=4)
    h = half.HalfCoarseOperator(op)
    be = Backend("cupy", FakeCuPy())
    nb = mgcuda.neighbour_table(op.geom)
    rng = np.random.default_rng(3)
    for shape in (op.shape, op.shape + (2,)):
        v = np.ascontiguousarray(crandn(rng, shape).astype(np.complex64))
        got = half.stencil(be, h.Yq, h.scale, v, nb)
        assert rel(got, half.stencil_reference(h.Yq, h.scale, v, nb)) < 1e-6


@pytest.fixture(scope="module")
def l8888():
    from force.hisq_links import hisq_links
    from lattice.io import read_gauge

    u, _ = read_gauge(fixture_path("lat.sample.l8888"))
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    return links, StaggeredDslash(u.geom, links.fat, links.long)


def test_half_solve_meets_the_tolerance_within_a_few_outer_iterations(l8888):
    """One set-up, solved with the double and the half preconditioner (nv 16: 46 outer iterations at m = 0.01 in
    double, single and half)."""
    M = l8888[1].matrix(0.01)
    b = random_field(M.geom, np.random.default_rng(3))
    base = multigrid(1e-10, nv=8, setup_iters=20)(M)
    out = {}
    for prec in ("double", "half"):
        x, st = base.with_mass(0.01, precision=prec).solve(b)
        assert math.sqrt(norm2(M.geom, b - M(x)) / norm2(M.geom, b)) <= 1e-10
        out[prec] = st.iters
    assert abs(out["half"] - out["double"]) <= 3, out


@pytest.mark.gpu
def test_gpu_half_kernel_and_solve(l8888):
    """On CuPy the half kernel equals its twin (1 and 3 columns), and a half solve meets the tolerance with the
    NumPy half solve's outer iterations (within 2)."""
    import cupy as cp

    from lattice import get_backend

    op = coarse_op()
    h = half.HalfCoarseOperator(op)
    be = get_backend("cupy")
    nb = cp.asarray(mgcuda.neighbour_table(op.geom))
    rng = np.random.default_rng(4)
    for shape in (op.shape, op.shape + (3,)):
        v = crandn(rng, shape).astype(np.complex64)
        got = half.stencil(be, cp.asarray(h.Yq), cp.asarray(h.scale), cp.asarray(v), nb)
        assert rel(got.get(), half.stencil_reference(h.Yq, h.scale, v, nb.get())) < 1e-6
    links, D = l8888
    geom = Geometry(tuple(D.geom.dims), be)
    Dg = StaggeredDslash(geom, cp.asarray(links.fat), cp.asarray(links.long))
    b = random_field(D.geom, np.random.default_rng(3))
    _, sc = multigrid(1e-10, nv=8, setup_iters=20, precision="half")(D.matrix(0.01)).solve(b)
    inv = multigrid(1e-10, nv=8, setup_iters=20, precision="half")(Dg.matrix(0.01))
    _, sg = inv.solve(cp.asarray(b))
    assert isinstance(inv.hierarchy.cycle.ops[2], half.HalfCoarseOperator)
    assert sg.converged and abs(sg.iters - sc.iters) <= 2
