"""The staged chain rule of the HISQ fat link (force/hisq_staged_vjp.py) on the device equals the NumPy twin and
the per-direction kernels (run on the device: pytest -m gpu; the host-compiled check is
tests/force/test_hisq_staged_vjp_host.py)."""
import numpy as np
import pytest

from force import hisq_cuda, hisq_staged_vjp as staged, smearing as sm, smearing_derivative as sd
from lattice import Geometry, get_backend
from lattice.placement import choose

from tests.force.test_hisq_gpu import close, fields, noise

pytestmark = pytest.mark.gpu

DIMS = (4, 6, 4, 8)
COEFFS = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}


@pytest.mark.parametrize("kind", ["unitary", "complex"])
@pytest.mark.parametrize("name", list(COEFFS))
def test_staged_vjp_on_device(kind, name):
    cpu, gpu = Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, get_backend("cupy"))
    c = COEFFS[name]
    links = fields(cpu)[kind]
    d = noise(links.shape, 7)
    u_dev, d_dev = gpu.xp.asarray(links), gpu.xp.asarray(d)
    old = staged.set_enabled(True)
    try:
        assert choose("hisq.fat_link_vjp", gpu, c=c).fn is staged._fat_link_vjp_staged
        got = sd.fat_link_vjp(gpu, u_dev, c, d_dev)
    finally:
        staged.set_enabled(old)
    close(got, sd.fat_link_vjp(cpu, links, c, d))
    per_direction = get_backend("cupy").to_numpy(hisq_cuda.fat_link_vjp(gpu, u_dev, c, d_dev))
    close(got, np.asarray(per_direction))
