"""The staged fat-link kernels (force/hisq_staged.py) on the device (pytest -m gpu): equal to the per-direction
staple kernels (force/hisq_cuda.py) and to the NumPy twin on CPU, on a 16^4 lattice and an asymmetric one, and
the HISQ link chain with the staged kernels switched on equals the chain with them off (to rounding: level 1's
result reaches level 2 through the U(3) projection)."""
import pytest

from force import hisq_cuda, hisq_staged, smearing as sm
from force.hisq_links import hisq_links_multi
from lattice import GaugeField, Geometry, get_backend
from lattice.placement import choose

from tests.force.test_hisq_gpu import close, noise, smooth

pytestmark = pytest.mark.gpu

TOL = 1e-13
COEFFS = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}


@pytest.mark.parametrize("dims", [(16, 16, 16, 16), (4, 6, 4, 8)])
@pytest.mark.parametrize("name", sorted(COEFFS))
def test_staged_equals_the_old_kernels_and_the_twin(dims, name):
    c = COEFFS[name]
    cpu, gpu = Geometry(dims, get_backend("numpy")), Geometry(dims, get_backend("cupy"))
    u = smooth(cpu, 3)
    for links in (u, u + 0.2 * noise(u.shape, 5)):
        dev = gpu.xp.asarray(links)
        staged = hisq_staged.fat_link(gpu, dev, c)
        close(staged, get_backend("cupy").to_numpy(hisq_cuda.fat_link(gpu, dev, c)), TOL)
        if dims != (16, 16, 16, 16):
            close(staged, sm.fat_link(cpu, links, c), TOL)


def test_hisq_links_with_the_staged_kernels():
    gpu = Geometry((8, 8, 8, 16), get_backend("cupy"))
    u = GaugeField(gpu, smooth(gpu, 19, 0.6))
    old = hisq_staged.set_enabled(False)
    try:
        ref = hisq_links_multi(u, [0.0, -0.35])
        hisq_staged.set_enabled(True)
        assert choose("hisq.fat_link", gpu, c=sm.FAT7).fn.__name__ == "_fat_link_staged"
        got = hisq_links_multi(u, [0.0, -0.35])
    finally:
        hisq_staged.set_enabled(old)
    to_numpy = get_backend("cupy").to_numpy
    for r, g in zip(ref, got):                 # level 1 feeds level 2 through the projection: rounding, amplified
        close(g.fat, to_numpy(r.fat), 1e-12)
        close(g.long, to_numpy(r.long), 1e-12)
