"""The staged chain rule of the HISQ fat link (force/hisq_staged_vjp.py, force/kernels/hisq_staged_vjp.cu)
compiled for the host (tests/force/cuda_host.py) equals the NumPy twin force.smearing_derivative.fat_link_vjp to
1e-13 relative, on the same random D_F, for fat7, HISQ level 2 (Lepage) and asqtad, on unitary and non-unitary
links of an asymmetric lattice; it is the implementation lookup() picks on one GPU unless switched off; and it
reuses the intermediates a staged build of the same links kept (bit for bit), in the HISQ force too."""
import dataclasses

import numpy as np
import pytest

from force import hisq_cuda, hisq_staged, hisq_staged_vjp as staged, smearing as sm, smearing_derivative as sd
from force.hisq_force import hisq_force_terms
from force.hisq_links import hisq_links_multi
from lattice import CounterRNG, GaugeField, Geometry, get_backend, su3
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


def test_kept_intermediates_are_reused_bit_for_bit(geoms, fields, monkeypatch):
    """A staged build's intermediates (force.smearing.fat_link's ``keep``) serve the chain rule of the very same
    links and coefficients: stages 1 and 2 are skipped and D_U is the same to the bit; other links (a copy) or
    other coefficients recompute them."""
    _, host = geoms
    u, d_fat = fields[0]["complex"], fields[1]
    forward = hisq_staged.forward
    calls = []
    monkeypatch.setattr(hisq_staged, "forward", lambda *a: calls.append(a[2]) or forward(*a))
    for c in (sm.FAT7, sm.HISQ_LEVEL2):
        keep = {}
        sm.fat_link(host, u, c, keep)
        assert set(keep) == {c} and keep[c].serves(u, c) and not keep[c].serves(u.copy(), c)
        want = staged.fat_link_vjp(host, u, c, d_fat)
        del calls[:]
        assert np.array_equal(sd.fat_link_vjp(host, u, c, d_fat, keep), want) and calls == []
        assert np.array_equal(sd.fat_link_vjp(host, u.copy(), c, d_fat, keep), want) and calls == [c]
    other = sm.HISQ_LEVEL2 * 0.5
    assert rel(sd.fat_link_vjp(host, u, other, d_fat, keep), sd.fat_link_vjp(geoms[0], u, other, d_fat)) <= TOL
    assert calls[-1] == other


def test_hisq_force_reuses_the_links_intermediates(geoms, fields, monkeypatch):
    """hisq_links_multi keeps both levels' intermediates (shared by the epsilon groups) and the force of those
    links reuses them (no forward stage runs): the momenta to the bit of the force with nothing kept."""
    _, host = geoms
    u = GaugeField(host, fields[0]["unitary"])
    fl = hisq_links_multi(u, [0.0, -0.3])
    assert set(fl[0].kept) == {sm.FAT7, sm.HISQ_LEVEL2} and fl[1].kept is fl[0].kept
    assert fl[0].kept[sm.FAT7].serves(u.links, sm.FAT7) and fl[0].kept[sm.HISQ_LEVEL2].serves(fl[0].W, sm.HISQ_LEVEL2)
    g = np.random.default_rng(4)
    noise = lambda: g.normal(size=u.links.shape) + 1j * g.normal(size=u.links.shape)
    fat, long = {0.0: noise(), -0.3: noise()}, {0.0: noise(), -0.3: noise()}
    forward = hisq_staged.forward
    calls = []
    monkeypatch.setattr(hisq_staged, "forward", lambda *a: calls.append(a[2]) or forward(*a))
    got = hisq_force_terms(u, fat, long, links=fl[0])
    assert calls == []
    want = hisq_force_terms(u, fat, long, links=dataclasses.replace(fl[0], kept={}))
    assert calls == [sm.HISQ_LEVEL2, sm.FAT7]
    assert np.array_equal(got.d_u, want.d_u) and np.array_equal(got.pdot, want.pdot)
