"""SU(3) algebra, RNG and observables of the lattice core."""
import numpy as np
import pytest
from scipy.linalg import expm

from lattice import CounterRNG, GaugeField, Geometry, link_trace, plaquette, polyakov_loop, su3
from lattice.gauge import random_gauge_transformation
from lattice.rng import philox4x32


def test_philox_known_answers():
    """Random123's known-answer vectors for Philox4x32-10."""
    z = np.zeros(1, dtype=np.uint64)
    assert [int(w[0]) for w in philox4x32(z, z, z, z, 0, 0)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    f = np.full(1, 0xFFFFFFFF, dtype=np.uint64)
    assert [int(w[0]) for w in philox4x32(f, f, f, f, 0xFFFFFFFF, 0xFFFFFFFF)] == \
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def test_rng_depends_only_on_global_site():
    rng = CounterRNG(11)
    ids = np.arange(1000)
    full = rng.gaussian("s", ids, 7, draw=3)
    part = rng.gaussian("s", ids[250:600], 7, draw=3)
    assert np.array_equal(full[250:600], part)
    assert not np.array_equal(full, rng.gaussian("s", ids, 7, draw=4))
    assert not np.array_equal(full, rng.gaussian("t", ids, 7, draw=3))


def test_rng_gaussian_moments():
    g = CounterRNG(3).gaussian("m", np.arange(200000), 4)
    n = g.size
    assert abs(g.mean()) < 5 / np.sqrt(n)
    assert abs(g.var() - 1) < 5 * np.sqrt(2 / n)
    assert abs((g ** 4).mean() - 3) < 0.05


@pytest.mark.parametrize("scale", [1e-10, 1e-5, 0.1, 1.0, 4.0])
def test_expm_exact(scale):
    rng = np.random.default_rng(5)
    a = su3.algebra_from_coefficients(rng.normal(size=(200, 8)) * scale)
    e = su3.expm_su3(a)
    ref = np.array([expm(x) for x in a])
    assert np.abs(e - ref).max() < 4e-15 * max(1.0, scale)
    assert su3.unitarity_violation(e) < 1e-14


def test_reunitarize_is_milc_gram_schmidt():
    rng = np.random.default_rng(2)
    m = rng.normal(size=(50, 3, 3)) + 1j * rng.normal(size=(50, 3, 3))
    u = su3.reunitarize(m)
    assert su3.unitarity_violation(u) < 1e-14
    # row 0 is the normalized row 0 of the input, row 1 lies in the span of rows 0 and 1
    r0 = m[:, 0] / np.linalg.norm(m[:, 0], axis=-1, keepdims=True)
    assert np.allclose(u[:, 0], r0)
    v = su3.reunitarize(u)
    assert np.abs(v - u).max() < 1e-15


def test_algebra_roundtrip_and_projection():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(10, 8))
    p = su3.algebra_from_coefficients(w)
    assert np.allclose(su3.algebra_coefficients(p), w)
    assert np.allclose(p, -su3.dagger(p))
    assert np.abs(su3.trace(p)).max() < 1e-15
    assert np.allclose(0.5 * np.einsum("...ij,...ij->...", p.conj(), p).real, 0.5 * (w ** 2).sum(-1))
    m = rng.normal(size=(10, 3, 3)) + 1j * rng.normal(size=(10, 3, 3))
    ta = su3.traceless_antihermitian(m)
    assert np.allclose(ta, -su3.dagger(ta)) and np.abs(su3.trace(ta)).max() < 1e-15


def test_unit_gauge_observables():
    geom = Geometry((4, 4, 4, 6))
    u = GaugeField.unit(geom)
    assert plaquette(u) == (3.0, 3.0)
    assert link_trace(u) == 1.0
    assert polyakov_loop(u) == 3.0


def test_observables_gauge_invariant():
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(9)
    u = GaugeField.random(geom, rng)
    v = u.gauge_transform(random_gauge_transformation(geom, rng))
    assert np.allclose(plaquette(u), plaquette(v), rtol=0, atol=1e-13)
    assert abs(polyakov_loop(u) - polyakov_loop(v)) < 1e-13
    assert abs(link_trace(u) - link_trace(v)) > 1e-6  # the link trace is not gauge invariant


def test_geometry_rejects_bad_lattice():
    from lattice.geometry import GeometryError

    with pytest.raises(GeometryError, match="even"):
        Geometry((4, 4, 5, 4))
    with pytest.raises(GeometryError, match="four"):
        Geometry((4, 4, 4))


def test_site_ids_milc_order():
    geom = Geometry((4, 6, 2, 8))
    ids = geom.site_ids()
    assert ids.shape == (8, 2, 6, 4)
    assert np.array_equal(ids.ravel(), np.arange(geom.volume))
    x, y, z, t = geom.coordinates()
    assert ids[3, 1, 2, 1] == 1 + 4 * (2 + 6 * (1 + 2 * 3))
