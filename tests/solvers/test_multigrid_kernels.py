"""The batched multigrid kernels (solvers.multigrid.cuda): the coarse 9-point stencil and the Kahler-Dirac X^-1 as
one kernel each, reading neighbours and hypercube sites through index tables.

CPU: the tables are right (the same contractions with NumPy fancy indexing equal the array path of
CoarseOperator and KDBlocks, single vectors and batches, on two aggregation levels). GPU (pytest -m gpu): the
kernels equal the array path on CuPy and the NumPy results, and a whole multigrid solve on CuPy with the kernels
equals the NumPy one."""
import time

import numpy as np
import pytest

from lattice import Geometry, get_backend
from solvers import StaggeredDslash
from solvers.multigrid import cuda as mgcuda
from solvers.multigrid import multigrid

from solver_testlib import random_links, rel

KW = dict(levels=4, blocks=[(4, 4, 4, 4), (2, 2, 2, 2)], nv=(6, 4), setup_iters=(5, 5))


def crandn(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


@pytest.fixture(scope="module")
def cpu_hierarchy():
    geom = Geometry((8, 8, 8, 8), get_backend("numpy"))
    fat, long = random_links(geom, seed=31)
    inv = multigrid(1e-10, **KW)(StaggeredDslash(geom, fat, long).matrix(0.05))
    inv.setup()
    return fat, long, inv


def test_reference_contractions_equal_the_array_path(cpu_hierarchy):
    _, _, inv = cpu_hierarchy
    h = inv.hierarchy
    rng = np.random.default_rng(4)
    for op in h.ops[2:]:
        nb = mgcuda.neighbour_table(op.geom)
        for shape in (op.shape, op.shape + (3,)):
            v = crandn(rng, shape)
            assert rel(mgcuda.stencil_reference(op.Y, v, nb), op.apply(v)) < 1e-14
            assert rel(mgcuda.stencil_reference(op.adjoint_stencil(), v, nb), op.apply_adjoint(v)) < 1e-14
    kd = h.kd
    hc = mgcuda.hypercube_table(kd.geom)
    for shape in (tuple(kd.geom.shape) + (3,), tuple(kd.geom.shape) + (3, 2)):
        v = crandn(rng, shape)
        assert rel(mgcuda.block_apply_reference(kd.Xinv, v, hc), kd.apply_inv(v)) < 1e-14
        assert rel(mgcuda.block_apply_reference(kd.X, v, hc), kd.apply_X(v)) < 1e-14


def test_kernels_serve_gpu_fields_of_one_precision_only(cpu_hierarchy):
    _, _, inv = cpu_hierarchy
    op = inv.hierarchy.ops[2]
    assert not mgcuda.applies(op.geom, op.Y)              # NumPy fields: the array path
    old = mgcuda.set_emulation(True)                      # NumPy standing in for CuPy
    try:
        assert mgcuda.applies(op.geom, op.Y) and mgcuda.applies(op.geom, op.Y.astype(np.complex64))
        assert not mgcuda.applies(op.geom, op.Y, op.Y.astype(np.complex64))     # mixed precisions
        assert not mgcuda.applies(op.geom, op.Y.real)                           # not complex
    finally:
        mgcuda.set_emulation(old)


@pytest.mark.gpu
def test_gpu_kernels_equal_numpy(cpu_hierarchy):
    import cupy as cp

    fat, long, inv_c = cpu_hierarchy
    geom = Geometry((8, 8, 8, 8), get_backend("cupy"))
    inv_g = multigrid(1e-10, **KW)(StaggeredDslash(geom, cp.asarray(fat), cp.asarray(long)).matrix(0.05))
    inv_g.setup()
    rng = np.random.default_rng(5)
    for l, (oc, og) in enumerate(zip(inv_c.hierarchy.ops[2:], inv_g.hierarchy.ops[2:])):
        assert rel(cp.asnumpy(og.Y), oc.Y) < 1e-10, l        # the same hierarchy, built on the GPU
        for shape in (oc.shape, oc.shape + (3,)):
            v = crandn(rng, shape)
            vg = cp.asarray(v)
            assert mgcuda.applies(og.geom, og.Y, vg)
            k = og.apply(vg)
            old = mgcuda.set_kernels(False)
            a = og.apply(vg)
            mgcuda.set_kernels(old)
            assert rel(cp.asnumpy(k), cp.asnumpy(a)) < 1e-14
            assert rel(k.get(), oc.apply(v)) < 1e-10              # the NumPy operator
    kd = inv_g.hierarchy.kd
    for shape in (tuple(geom.shape) + (3,), tuple(geom.shape) + (3, 4)):
        v = cp.asarray(crandn(rng, shape))
        k = kd.apply_inv(v)
        old = mgcuda.set_kernels(False)
        a = kd.apply_inv(v)
        mgcuda.set_kernels(old)
        assert rel(k.get(), a.get()) < 1e-14
        assert rel(k.get(), inv_c.hierarchy.kd.apply_inv(v.get())) < 1e-12


@pytest.mark.gpu
def test_gpu_multigrid_solve_equals_numpy_and_times_the_kernels():
    """A three-level solve (random links are no test of convergence: a few outer iterations) on CuPy with the
    kernels gives the NumPy iterates to rounding; prints the per-application time of the coarse stencil with and
    without the kernel."""
    import cupy as cp

    kw = dict(nv=8, setup_iters=10, maxiter=5, raise_on_fail=False)
    cpu = Geometry((8, 8, 8, 8), get_backend("numpy"))
    gpu = Geometry((8, 8, 8, 8), get_backend("cupy"))
    fat, long = random_links(cpu, seed=8)
    b = crandn(np.random.default_rng(6), tuple(cpu.shape) + (3,))
    xc, sc = multigrid(1e-10, **kw)(StaggeredDslash(cpu, fat, long).matrix(0.1)).solve(b)
    inv = multigrid(1e-10, **kw)(StaggeredDslash(gpu, cp.asarray(fat), cp.asarray(long)).matrix(0.1))
    xg, sg = inv.solve(cp.asarray(b))
    assert sg.iters == sc.iters and rel(xg.get(), xc) < 1e-9
    op = inv.hierarchy.ops[2]
    v = cp.asarray(crandn(np.random.default_rng(7), op.shape))
    times = {}
    for on in (True, False):
        old = mgcuda.set_kernels(on)
        op.apply(v)
        cp.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            op.apply(v)
        cp.cuda.runtime.deviceSynchronize()
        times[on] = (time.perf_counter() - t0) / 200
        mgcuda.set_kernels(old)
    print(f"\ncoarse stencil {op.geom.dims} n={op.n}: kernel {times[True] * 1e6:.1f} us, array path "
          f"{times[False] * 1e6:.1f} us per application")


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_dense_coarsest_inverse_equals_sparse_lu(dtype):
    """The GPU's coarsest solve (precision.DenseInverse: the explicit inverse, made in double and rounded to the
    cycle's precision) equals SuperLU's solve of the same coarse operator, here with NumPy in place of CuPy."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    from solvers.multigrid.precision import DenseInverse

    g = np.random.default_rng(5)
    n = 200
    A = (sp.random(n, n, density=0.05, random_state=7, dtype=np.float64) * (1 + 1j) + 4 * sp.eye(n)).astype(dtype)
    b = (g.normal(size=n) + 1j * g.normal(size=n)).astype(dtype)
    dense = DenseInverse(np, A.toarray())
    assert dense.inv.dtype == dtype and dense.on_device
    ref = splu(A.tocsc()).solve(b)
    tol = 1e-13 if dtype == np.complex128 else 1e-5
    assert np.linalg.norm(dense.solve(b) - ref) <= tol * np.linalg.norm(ref)
