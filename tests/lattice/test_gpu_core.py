"""The lattice core on CuPy gives the NumPy results to rounding (run on the device: pytest -m gpu)."""
import numpy as np
import pytest

from lattice import CounterRNG, GaugeField, Geometry, get_backend, link_trace, plaquette, polyakov_loop, su3

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def pair():
    cpu = Geometry((4, 4, 4, 8), get_backend("numpy"))
    gpu = Geometry((4, 4, 4, 8), get_backend("cupy"))
    return cpu, gpu


def test_rng_identical(pair):
    cpu, gpu = pair
    a = CounterRNG(5).gaussian("m", cpu.site_ids(), 9)
    b = CounterRNG(5).gaussian("m", gpu.site_ids(), 9)
    assert np.abs(a - gpu.backend.to_numpy(b)).max() < 1e-14


def test_field_and_observables(pair):
    cpu, gpu = pair
    uc = GaugeField.random(cpu, CounterRNG(1))
    ug = GaugeField.random(gpu, CounterRNG(1))
    assert np.abs(uc.links - gpu.backend.to_numpy(ug.links)).max() < 1e-14
    assert np.allclose(plaquette(uc), plaquette(ug), rtol=0, atol=1e-13)
    assert abs(polyakov_loop(uc) - polyakov_loop(ug)) < 1e-13
    assert abs(link_trace(uc) - link_trace(ug)) < 1e-14


def test_expm_and_reunitarize(pair):
    cpu, gpu = pair
    w = np.random.default_rng(3).normal(size=(1000, 8))
    a = su3.algebra_from_coefficients(w)
    ag = gpu.backend.asarray(a)
    assert np.abs(su3.expm_su3(a) - gpu.backend.to_numpy(su3.expm_su3(ag))).max() < 1e-14
    m = a + 0.3
    assert np.abs(su3.reunitarize(m) - gpu.backend.to_numpy(su3.reunitarize(gpu.backend.asarray(m)))).max() < 1e-14


def test_fused_link_update(pair):
    cpu, gpu = pair
    rng = np.random.default_rng(8)
    p = su3.algebra_from_coefficients(rng.normal(size=(2000, 8)) * np.repeat([1e-9, 1e-3, 0.3, 2.0], 500)[:, None])
    u = su3.reunitarize(rng.normal(size=(2000, 3, 3)) + 1j * rng.normal(size=(2000, 3, 3)))
    ref = su3.exp_update(u.copy(), p, 0.37)
    got = gpu.backend.to_numpy(su3.exp_update(gpu.backend.asarray(u), gpu.backend.asarray(p), 0.37, gpu.backend))
    assert np.abs(got - ref).max() < 1e-14
    neg = gpu.backend.to_numpy(su3.exp_update(gpu.backend.asarray(u), gpu.backend.asarray(p), -0.37, gpu.backend))
    assert np.abs(neg - su3.exp_update(u.copy(), p, -0.37)).max() < 1e-14
