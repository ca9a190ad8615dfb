"""The staged fat-link kernels (force/hisq_staged.py, force/kernels/hisq_staged.cu) compiled for the host
(tests/force/cuda_host.py) equal the NumPy twin force.smearing.fat_link, and lattice.placement picks them only
where their switch is on (tests/force/test_hisq_staged_gpu.py repeats the comparison on the device)."""
import numpy as np
import pytest

from comms.config import RunConfig
from force import hisq_staged, smearing as sm
from lattice import Geometry, get_backend
from lattice.backend import Backend
from lattice.placement import choose

from tests.force.cuda_host import FakeCuPy, compiler_available
from tests.force.test_hisq_cuda_host import DIMS, TOL, close, fields

pytestmark = pytest.mark.skipif(not compiler_available(), reason="needs g++ to compile the kernels for the host")

COEFFS = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87),
          "level2_eps": sm.hisq_level2_coefficients(-0.3)}


@pytest.fixture(scope="module")
def geoms():
    return Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, Backend("cupy", FakeCuPy()))


@pytest.mark.parametrize("name", sorted(COEFFS))
def test_staged_fat_link_equals_the_twin(geoms, name):
    """Unitary links U and a non-unitary V (as level 2 sees after a projection with fallback): 1e-13 relative."""
    c = COEFFS[name]
    cpu, host = geoms
    u, v, _ = fields(cpu)
    for links in (u, v):
        close(hisq_staged.fat_link(host, links, c), sm.fat_link(cpu, links, c), TOL)


def test_each_term_alone(geoms):
    """Every coefficient on its own (the others zero), so that a wrong path of one kind cannot hide behind the
    others' larger terms; the 3-staple- and Lepage-only tables go through the kernels directly (lookup() gives
    them the array code)."""
    cpu, host = geoms
    _, v, _ = fields(cpu, 9)
    for field in ("one_link", "three_staple", "five_staple", "seven_staple", "lepage"):
        c = sm.PathCoefficients(**{"one_link": 0.0, field: 0.7})
        close(hisq_staged.fat_link(host, v, c), sm._fat_link_array(cpu, v, c), TOL)


def test_placement_picks_the_staged_kernel_only_when_switched_on(geoms):
    _, host = geoms
    on, off = RunConfig(), RunConfig(hisq_staged=False)   # on by default
    assert choose("hisq.fat_link", host, on, c=sm.FAT7).fn.__name__ == "_fat_link_staged"
    assert choose("hisq.fat_link", host, off, c=sm.FAT7).fn.__name__ == "_fat_link_unpadded"
    assert choose("hisq.fat_link", host, RunConfig(hisq_staged=True, hisq_kernels=False),
                  c=sm.FAT7).fn.__name__ == "_fat_link_array"
    three = sm.PathCoefficients(one_link=1.0, three_staple=0.5)
    assert choose("hisq.fat_link", host, on, c=three).fn.__name__ == "_fat_link_array"
    old = hisq_staged.set_enabled(True)
    try:
        u, _, _ = fields(geoms[0], 4)
        close(sm.fat_link(host, u, sm.HISQ_LEVEL2), sm.fat_link(geoms[0], u, sm.HISQ_LEVEL2), TOL)
        assert choose("hisq.fat_link", host, c=sm.FAT7).fn.__name__ == "_fat_link_staged"
    finally:
        hisq_staged.set_enabled(old)


def test_intermediates_are_the_staples(geoms):
    """Stage 1 alone: A_p = S_nu[U_mu]_mu for p = 3 mu + j (the pair order the later stages index by)."""
    cpu, host = geoms
    u, _, _ = fields(cpu, 6)
    s = sm.StapleOperator(cpu, u)
    a = np.empty((12, 9, cpu.local_volume), dtype=u.dtype)                   # element-major, as the kernels keep it
    hisq_staged.launch(host, "hisq_staged.cu", "staged_a", 12 * cpu.local_volume, (hisq_staged.element_major(np, u), a))
    a = a.transpose(0, 2, 1).reshape((12,) + u.shape[1:])
    for mu in range(4):
        for j, nu in enumerate(d for d in range(4) if d != mu):
            close(a[3 * mu + j], s(nu, mu, u[mu]), TOL)


def test_bench_smear_times_both_paths(geoms, monkeypatch):
    """``hmc bench smear``'s timing core on the host build: both paths run and agree."""
    from bench.smear import coefficients, smooth_links, time_fat_link

    _, host = geoms
    monkeypatch.setattr(host.backend, "synchronize", lambda: None)      # the stand-in has no streams
    got = time_fat_link(host, smooth_links(host), coefficients("level2"), repeat=1)
    assert got["old_s"] > 0 and got["staged_s"] > 0 and got["staged_rel_diff"] <= TOL
