"""The fused Taylor link update (lattice/su3_cuda.py: taylor_update, MILC's taylor8 exponential) equals its NumPy
twin su3.expm_taylor(dt P) @ U, on the GPU (pytest -m gpu) and compiled for the host (tests/force/cuda_host.py)."""
import numpy as np
import pytest

from lattice import su3, su3_cuda
from lattice.backend import Backend, get_backend
from tests.conftest import gpu_available
from tests.force.cuda_host import FakeCuPy, compiler_available


def fields():
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 2, 4, 4, 6, 8))
    p = su3.algebra_from_coefficients(w)
    u = su3.expm_su3(su3.algebra_from_coefficients(rng.normal(size=w.shape)))
    return np.ascontiguousarray(p), np.ascontiguousarray(u)


def check(backend):
    p, u = fields()
    for dt in (0.37, -0.05):
        ref = su3.expm_taylor(dt * p) @ u
        assert np.array_equal(su3.exp_update(u.copy(), p, dt, None, su3.expm_taylor), ref)
        got = su3.exp_update(backend.asarray(u.copy()), backend.asarray(p), dt, backend, su3.expm_taylor)
        assert np.abs(backend.to_numpy(got) - ref).max() <= 1e-14
    got = su3_cuda.taylor_update(backend, backend.asarray(p), backend.asarray(u.copy()), 0.1, 3)
    assert np.abs(backend.to_numpy(got) - su3._taylor_exp(0.1 * p, 3) @ u).max() <= 1e-14


@pytest.mark.gpu
def test_taylor_update_gpu():
    check(get_backend("cupy"))


@pytest.mark.skipif(not compiler_available(), reason="needs g++ to compile the kernel for the host")
def test_taylor_update_host():
    if gpu_available():
        pytest.skip("the GPU test covers it")
    check(Backend("cupy", FakeCuPy()))


def test_exp_update_refuses_other_exponentials():
    p, u = fields()
    with pytest.raises(ValueError, match="expm_su3 and expm_taylor"):
        su3.exp_update(u, p, 0.1, None, np.exp)
