"""The staged chain rule of the HISQ fat link (force/hisq_staged_vjp.py) on the device equals the NumPy twin and
the per-direction kernels, and the HISQ force that reuses the smearing's kept intermediates equals the one that
recomputes them (run on the device: pytest -m gpu; the host-compiled check is
tests/force/test_hisq_staged_vjp_host.py)."""
import dataclasses

import numpy as np
import pytest

from force import hisq_cuda, hisq_staged_vjp as staged, smearing as sm, smearing_derivative as sd
from force.hisq_force import hisq_force
from force.hisq_links import hisq_links_multi
from lattice import GaugeField, Geometry, get_backend
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


def test_force_with_kept_intermediates_on_device():
    """On the device the HISQ force of links built by the staged kernels reuses their kept intermediates
    (force.hisq_links.FermionLinks.kept) and gives the momenta of the force with nothing kept, to the bit (the
    same kernels on the same inputs), and the NumPy force to rounding."""
    cpu, gpu = Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, get_backend("cupy"))
    links = fields(cpu)["unitary"]
    rng = np.random.default_rng(11)
    noise_of = lambda: rng.normal(size=links.shape) + 1j * rng.normal(size=links.shape)
    fat, long = {0.0: noise_of(), -0.35: noise_of()}, {0.0: noise_of(), -0.35: noise_of()}
    u = GaugeField(gpu, gpu.xp.asarray(links))
    fl = hisq_links_multi(u, [0.0, -0.35])
    assert set(fl[0].kept) == {sm.FAT7, sm.HISQ_LEVEL2}
    dev = {k: gpu.xp.asarray(v) for k, v in fat.items()}, {k: gpu.xp.asarray(v) for k, v in long.items()}
    got = hisq_force(u, *dev, links=fl[0])
    bare = hisq_force(u, *dev, links=dataclasses.replace(fl[0], kept={}))
    to_host = get_backend("cupy").to_numpy
    assert np.array_equal(to_host(got), to_host(bare))
    close(got, hisq_force(GaugeField(cpu, links), fat, long), 1e-10)
