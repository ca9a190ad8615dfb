"""The staged chain rule of the HISQ fat link (force/hisq_staged_vjp.py, force/kernels/hisq_staged_vjp.cu)
compiled for the host (tests/force/cuda_host.py) equals the NumPy twin force.smearing_derivative.fat_link_vjp to
1e-13 relative, on the same random D_F, for fat7, HISQ level 2 (Lepage) and asqtad, on unitary and non-unitary
links of an asymmetric lattice; and it is the implementation lookup() picks on one GPU only when switched on."""
import numpy as np
import pytest

from force import hisq_cuda, hisq_staged_vjp as staged, smearing as sm, smearing_derivative as sd
from lattice import CounterRNG, Geometry, get_backend, su3
from lattice.backend import Backend
from lattice.placement import choose

from tests.force.cuda_host import FakeCuPy, needs_gxx, rel

pytestmark = needs_gxx

DIMS = (4, 6, 4, 8)
TOL = 1e-13
COEFFS = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}


@pytest.fixture(scope="module")
def geoms():
    return Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, Backend("cupy", FakeCuPy()))


@pytest.fixture(scope="module")
def fields(geoms):
    cpu, _ = geoms
    w = CounterRNG(3).gaussian("s", cpu.site_ids(), 32).reshape(cpu.shape + (4, 8))
    u = np.ascontiguousarray(su3.expm_su3(np.moveaxis(su3.algebra_from_coefficients(0.5 * w), -3, 0)))
    g = np.random.default_rng(3)
    noise = lambda: g.normal(size=u.shape) + 1j * g.normal(size=u.shape)
    return {"unitary": u, "complex": u + 0.2 * noise()}, noise()


@pytest.mark.parametrize("name", list(COEFFS))
def test_staged_vjp_equals_twin(geoms, fields, name):
    cpu, host = geoms
    links, d_fat = fields
    for kind, u in links.items():
        got = staged.fat_link_vjp(host, u, COEFFS[name], d_fat)
        assert rel(got, sd.fat_link_vjp(cpu, u, COEFFS[name], d_fat)) <= TOL, kind


def test_lookup_takes_staged_unless_switched_off(geoms, fields):
    _, host = geoms
    old = staged.set_enabled(None)
    try:
        assert choose("hisq.fat_link_vjp", host, c=sm.FAT7).fn is staged._fat_link_vjp_staged   # default on
        staged.set_enabled(False)
        assert choose("hisq.fat_link_vjp", host, c=sm.FAT7).fn is hisq_cuda._fat_link_vjp_unpadded
        staged.set_enabled(True)
        assert choose("hisq.fat_link_vjp", host, c=sm.FAT7).fn is staged._fat_link_vjp_staged
        prev = hisq_cuda.set_enabled(False)
        try:
            assert choose("hisq.fat_link_vjp", host, c=sm.FAT7).fn.__name__.endswith("_array")
        finally:
            hisq_cuda.set_enabled(prev)
        u, d_fat = fields[0]["complex"], fields[1]
        assert rel(sd.fat_link_vjp(host, u, sm.FAT7, d_fat), hisq_cuda.fat_link_vjp(host, u, sm.FAT7, d_fat)) <= TOL
    finally:
        staged.set_enabled(old)
