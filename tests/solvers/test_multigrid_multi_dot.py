"""The multigrid's batched inner products (solvers/multigrid/kernels/multi_dot.cu through krylov.local_dots),
compiled for the host (tests/force/cuda_host.py, one thread a block): every pair's sum conj(a) b equals NumPy's in
double, for double and single fields, across launches of several chunks, and the same bits on every call. On the
device the blocks' shared-memory tree runs too (tests/solvers/test_multigrid_kernels.py, GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from lattice import Geometry
from lattice.backend import Backend
from solvers.multigrid import krylov
from tests.force.cuda_host import FakeCuPy, needs_gxx



@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(krylov, "DOT_THREADS", 1)        # the host build runs one thread a block
    monkeypatch.setattr(krylov, "DOT_BLOCKS", 7)         # several elements a thread: the grid-stride loop
    return Geometry((4, 4, 4, 4), Backend("cupy", FakeCuPy()))


def _fields(k, dtype, seed=0, shape=(256, 24)):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dtype) for _ in range(k)]


def _reference(pairs):
    return np.array([np.vdot(a.astype(np.complex128), b.astype(np.complex128)) for a, b in pairs])


@needs_gxx
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_smoother_gram_and_right_hand_side(host, dtype):
    """The GCR smoother's 14 products of 4 steps: the upper triangle of <Q_i, Q_j>, then <Q_i, r>."""
    *Q, r = _fields(5, dtype)
    pairs = [(Q[i], Q[j]) for i in range(4) for j in range(i, 4)] + [(Q[i], r) for i in range(4)]
    got = krylov.local_dots(host, pairs)
    assert got.dtype == np.complex128 and got.shape == (14,)
    want = _reference(pairs)
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()
    assert np.array_equal(got, krylov.local_dots(host, pairs))
    assert ("cuda_function", "solvers.multigrid", "multi_dot.cu", krylov._DOT_KERNEL[np.dtype(dtype)]) in \
        host.backend.kernels                              # the kernel, not the array path


@needs_gxx
def test_gram_schmidt_coefficients_in_several_launches(host):
    """<Q_i, q> for 20 kept directions: three launches (at most 9 fields, 15 pairs each), in order."""
    *Q, q = _fields(21, np.complex128, seed=3)
    pairs = [(Q[i], q) for i in range(20)]
    assert [len(c) for _, c, _ in krylov._dot_chunks(pairs)] == [8, 8, 4]
    got = krylov.local_dots(host, pairs)
    want = _reference(pairs)
    assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()


def test_chunks_respect_the_limits_and_keep_the_order():
    f = _fields(6, np.complex128, shape=(2,))
    pairs = [(f[i], f[j]) for i in range(6) for j in range(6)]
    chunks = krylov._dot_chunks(pairs)
    assert [p for _, c, _ in chunks for p in c] == pairs
    assert [s for s, _, _ in chunks] == list(np.cumsum([0] + [len(c) for _, c, _ in chunks[:-1]]))
    assert all(len(c) <= krylov.DOT_PAIRS and len(v) <= krylov.DOT_FIELDS for _, c, v in chunks)


def test_numpy_fields_keep_the_array_path():
    geom = Geometry((4, 4, 4, 4))
    a, b = _fields(2, np.complex128, seed=5)
    got = krylov.local_dots(geom, [(a, b), (b, b)])
    assert np.array_equal(got, np.array([(a.conj() * b).sum(), (b.conj() * b).sum()]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_gpu_blocks_equal_numpy(dtype):
    """On the device, 128 threads a block and the shared-memory tree: NumPy's sums in double, a 4^4 x 96 level's
    fields (the 32^4 hierarchy's level 3) and a larger one, the same bits twice."""
    import cupy as cp

    from lattice import get_backend

    geom = Geometry((4, 4, 4, 4), get_backend("cupy"))
    for shape in ((256, 96), (4096, 96)):
        *Q, r = _fields(5, dtype, seed=7, shape=shape)
        pairs = [(Q[i], Q[j]) for i in range(4) for j in range(i, 4)] + [(Q[i], r) for i in range(4)]
        dev = [(cp.asarray(a), cp.asarray(b)) for a, b in pairs]
        got = krylov.local_dots(geom, dev)
        want = _reference(pairs)
        assert np.abs(got.get() - want).max() <= 1e-12 * np.abs(want).max()
        assert cp.array_equal(got, krylov.local_dots(geom, dev))
