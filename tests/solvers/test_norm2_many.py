"""solvers.operator.norm2_many: the norms of several vectors with one host copy on a GPU (the refinement's true
residuals), the same numbers as norm2 of each, on NumPy, on a GPU backend (here the host shim's FakeCuPy, whose
copies are counted) and in the "exact" reduction mode."""
import numpy as np
import pytest

from lattice import Geometry, get_backend
from lattice.backend import Backend
from solvers.operator import norm2, norm2_many, set_reductions
from tests.force.cuda_host import FakeCuPy

DIMS = (4, 4, 4, 6)


class Shim(FakeCuPy):
    """FakeCuPy with cupy's asnumpy (NumPy's reductions give scalars, which Backend.to_numpy hands to it)."""

    asnumpy = staticmethod(np.asarray)


def gpu_shim():
    return Backend("cupy", Shim())


def vectors(dtype, n=5):
    rng = np.random.default_rng(3)
    return [np.ascontiguousarray((rng.normal(size=DIMS[::-1] + (3,)) + 1j * rng.normal(size=DIMS[::-1] + (3,))
                                  ).astype(dtype) * 10.0 ** k) for k in range(n)]


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("backend", ["numpy", "gpu shim"])
def test_the_same_numbers_as_norm2(backend, dtype):
    be = get_backend("numpy") if backend == "numpy" else gpu_shim()
    geom = Geometry(DIMS, be)
    vs = vectors(dtype)
    assert norm2_many(geom, vs) == [norm2(geom, v) for v in vs]
    assert norm2_many(geom, []) == []


def test_one_host_copy_on_a_gpu(monkeypatch):
    geom = Geometry(DIMS, gpu_shim())
    copies = []
    real = geom.backend.to_numpy
    monkeypatch.setattr(type(geom.backend), "to_numpy", lambda self, a: copies.append(1) or real(a))
    norm2_many(geom, vectors(np.complex128))
    assert len(copies) == 1


def test_exact_sums_take_norm2_each():
    geom = Geometry(DIMS, gpu_shim())
    old = set_reductions("exact")
    try:
        vs = vectors(np.complex128, 3)
        assert norm2_many(geom, vs) == [norm2(geom, v) for v in vs]
    finally:
        set_reductions(old)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_gpu_the_same_numbers_as_norm2(dtype):
    geom = Geometry(DIMS, get_backend("cupy"))
    vs = [geom.backend.asarray(v) for v in vectors(dtype)]
    assert norm2_many(geom, vs) == [norm2(geom, v) for v in vs]
