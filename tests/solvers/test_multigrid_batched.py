"""Batched right-hand sides through the multigrid's coarse kernels (issue 18): on the CPU one application of a
k-column block (k <= EXACT_COLUMNS, the right-hand sides solved together) equals k single applications bitwise -- the
coarse 9-point stencil and its adjoint, the restriction and prolongation on both aggregation levels, and the
Kahler-Dirac X^-1 blocks. A four-level hierarchy on Haar-random 8^4 links with the Naik term (identities only)."""
import numpy as np
import pytest

from lattice import Geometry
from solvers import StaggeredDslash
from solvers.multigrid import multigrid
from solvers.multigrid.lattice import EXACT_COLUMNS, bmm

from solver_testlib import random_links


@pytest.fixture(scope="module")
def hierarchy():
    geom = Geometry((8, 8, 8, 8))
    D = StaggeredDslash(geom, *random_links(geom, seed=31))
    inv = multigrid(1e-10, levels=4, blocks=[(4, 4, 4, 4), (2, 2, 2, 2)], nv=(8, 6), setup_iters=(5, 5))(
        D.matrix(0.05))
    inv.setup()
    return inv.hierarchy


def columns(rng, shape, k):
    return rng.standard_normal(shape + (k,)) + 1j * rng.standard_normal(shape + (k,))


def assert_columnwise(apply, v):
    out = apply(v)
    for j in range(v.shape[-1]):
        assert np.array_equal(out[..., j], apply(np.ascontiguousarray(v[..., j]))), j


@pytest.mark.parametrize("k", [2, 5, 12, EXACT_COLUMNS])
def test_k_columns_equal_k_single_applications_bitwise(hierarchy, k):
    h, rng = hierarchy, np.random.default_rng(k)
    for op in h.ops[2:]:                                          # both coarse levels: 16 and 12 unknowns per site
        v = columns(rng, op.shape, k)
        assert_columnwise(op.apply, v)
        assert_columnwise(op.apply_adjoint, v)
    for l, tr in enumerate(h.transfers, start=1):
        assert_columnwise(tr.restrict, columns(rng, h.ops[l].shape, k))
        assert_columnwise(tr.prolong, columns(rng, h.ops[l + 1].shape, k))
    assert_columnwise(h.kd.apply_inv, columns(rng, h.ops[1].shape, k))
    assert_columnwise(h.kd.apply_inv_adjoint, columns(rng, h.ops[1].shape, k))


def test_wider_batches_use_blas_and_agree_to_rounding():
    """Past EXACT_COLUMNS (the set-up's Nv and 2 Nv columns) the product is BLAS's: the same to rounding."""
    rng = np.random.default_rng(2)
    A = columns(rng, (10, 12), 12)
    for k in (EXACT_COLUMNS, EXACT_COLUMNS + 1):
        B = columns(rng, (10, 12), k)
        out = bmm(np, A, B)
        assert out.flags.c_contiguous and out.shape == (10, 12, k)
        assert np.abs(out - A @ B).max() <= 1e-13 * np.abs(A @ B).max()
