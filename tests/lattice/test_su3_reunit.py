"""MILC's reunitarization as one kernel a link (lattice/kernels/su3_reunit.cu, su3_cuda.reunitarize; the path of
GaugeField.reunitarize on a GPU) against its twin su3.reunitarize: on the GPU (pytest -m gpu) and compiled for the
host (tests/force/cuda_host.py), links a little off SU(3) as an MD step leaves them, and far off."""
import numpy as np
import pytest

from lattice import GaugeField, Geometry, su3, su3_cuda
from lattice.backend import Backend, get_backend
from lattice.placement import lookup
from tests.conftest import gpu_available
from tests.force.cuda_host import FakeCuPy, compiler_available

DIMS = (4, 4, 4, 6)


def links(drift):
    """SU(3) links times (1 + drift x noise): off the group by ~drift."""
    rng = np.random.default_rng(5)
    shape = (4,) + DIMS[::-1]
    u = su3.expm_su3(su3.algebra_from_coefficients(rng.normal(size=shape + (8,))))
    noise = rng.normal(size=u.shape) + 1j * rng.normal(size=u.shape)
    return np.ascontiguousarray(u + drift * noise @ u)


def check(backend, tol):
    for drift in (1e-12, 1e-6, 0.3):
        u = links(drift)
        ref = su3.reunitarize(u)
        got = backend.to_numpy(su3_cuda.reunitarize(backend, backend.asarray(u)))
        assert np.abs(got - ref).max() <= tol
        assert su3.unitarity_violation(got) < 1e-14
        assert np.array_equal(backend.to_numpy(backend.asarray(u)), u)          # a new array: the input kept


@pytest.mark.gpu
def test_reunitarize_kernel_gpu():
    check(get_backend("cupy"), 1e-15)


@pytest.mark.skipif(not compiler_available(), reason="needs g++ to compile the kernel for the host")
def test_reunitarize_kernel_host():
    if gpu_available():
        pytest.skip("the GPU test covers it")
    check(Backend("cupy", FakeCuPy()), 1e-15)


@pytest.mark.skipif(not compiler_available(), reason="needs g++ to compile the kernel for the host")
def test_gauge_field_takes_the_kernel_on_a_gpu_geometry():
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    cpu = Geometry(DIMS)
    assert lookup("gauge.reunitarize", host).__name__ == "_reunitarize_kernel"
    assert lookup("gauge.reunitarize", cpu).__name__ == "_reunitarize_array"
    u = links(1e-6)
    got = GaugeField(host, u.copy()).reunitarize().links
    assert np.abs(got - GaugeField(cpu, u.copy()).reunitarize().links).max() <= 1e-15
