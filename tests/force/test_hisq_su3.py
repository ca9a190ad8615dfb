"""The SU(3) variant of the HISQ links (MILC's hisq/hisq_su3_action.h, the su3_rhmc_hisq_su3 build): W = Y det(Y)^(-1/3)
after the U(3) projection Y, and its place in the fermion force, against central differences."""
import numpy as np
import pytest

from force.hisq_force import hisq_force
from force.hisq_links import hisq_links, hisq_links_multi
from force.unitarize import su3_project
from force.unitarize_derivative import su3_projection_vjp
from lattice import CounterRNG, GaugeField, Geometry, su3


def _retr(a, b) -> float:
    return float(np.sum(a * b.swapaxes(-1, -2)).real)


def _algebra(geom, seed, scale):
    w = CounterRNG(seed).gaussian("a", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    return scale * su3.algebra_from_coefficients(np.moveaxis(w, 4, 0))


def _complex(rng, shape):
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


@pytest.fixture(scope="module")
def smooth():
    geom = Geometry((4, 4, 4, 4))
    return GaugeField(geom, su3.expm_su3(_algebra(geom, 20240611, 0.3)))


def test_su3_project():
    rng = np.random.default_rng(3)
    q, _ = np.linalg.qr(_complex(rng, (200, 3, 3)))           # random U(3) matrices
    w, c = su3_project(q)
    assert np.abs(np.linalg.det(w) - 1).max() < 1e-14
    assert np.abs(su3.dagger(w) @ w - np.eye(3)).max() < 1e-14
    assert np.abs(np.angle(c ** -3) - np.angle(np.linalg.det(q))).max() < 1e-12
    assert np.all(np.abs(np.angle(c)) <= np.pi / 3 + 1e-15)     # principal cube root, as su3_spec_unitarize
    one = np.broadcast_to(np.exp(0.3j) * np.eye(3), (2, 3, 3))
    assert np.abs(su3_project(one)[0] - np.eye(3)).max() < 1e-15


def test_su3_projection_vjp():
    """delta S = Re Tr[delta W D_W] along Y -> Y + h E (E generic complex): Re Tr[E D_Y]."""
    rng = np.random.default_rng(4)
    y, _ = np.linalg.qr(_complex(rng, (50, 3, 3)))
    d_w, e = _complex(rng, y.shape), _complex(rng, y.shape)
    d_y = su3_projection_vjp(y, d_w)
    # the five-point difference at h = 1e-4: truncation O(h^4), rounding ~1e-16 |S| / h, both far below 1e-8 of
    # this small derivative (the two-point one at h = 1e-6 had ~4e-8 of rounding and passed by chance of the bits)
    h = 1e-4
    s = [_retr(su3_project(y + k * h * e)[0], d_w) for k in (-2, -1, 1, 2)]
    fd = (8.0 * (s[2] - s[1]) - (s[3] - s[0])) / (12 * h)
    assert fd == pytest.approx(_retr(e, d_y), rel=1e-8)


def test_su3_links(smooth):
    u3 = hisq_links(smooth)
    s3 = hisq_links(smooth, group="su3")
    assert u3.Y is None and s3.Y is not None and np.array_equal(s3.Y, u3.W) and np.array_equal(s3.V, u3.V)
    assert np.abs(np.linalg.det(s3.W) - 1).max() < 1e-13
    assert np.abs(s3.W - u3.W).max() > 1e-3                     # the phase of det Y is not small on this field
    with pytest.raises(ValueError, match="unitarization group"):
        hisq_links(smooth, group="u2")


@pytest.mark.parametrize("eps_list", [(0.0,), (0.0, -0.16875)])
def test_su3_force_finite_difference(smooth, eps_list):
    """Pdot of S = sum_e Re Tr[fat^e F^e + long^e L^e] through the SU(3)-projected links, against d/dtau S(exp(tau
    Omega) U); the U(3) force misses the projection's term."""
    geom = smooth.geom
    rng = np.random.default_rng(8)
    fo = {e: _complex(rng, smooth.links.shape) for e in eps_list}
    lo = {e: _complex(rng, smooth.links.shape) for e in eps_list}

    def action(links):
        return sum(_retr(fl.fat, fo[fl.eps]) + _retr(fl.long, lo[fl.eps])
                   for fl in hisq_links_multi(GaugeField(geom, links), eps_list, group="su3"))

    pdot = hisq_force(smooth, fo, lo, group="su3")
    links = hisq_links_multi(smooth, eps_list, group="su3")[0]
    assert np.array_equal(hisq_force(smooth, fo, lo, links=links), pdot)
    omega = _algebra(geom, 101, 1.0)
    h = 1e-5
    fd = (action(su3.expm_su3(h * omega) @ smooth.links) - action(su3.expm_su3(-h * omega) @ smooth.links)) / (2 * h)
    assert fd == pytest.approx(_retr(pdot, omega), rel=1e-8)
    assert fd != pytest.approx(_retr(hisq_force(smooth, fo, lo), omega), rel=1e-3)
