"""HISQ and asqtad fermion-force chain rule (docs/conventions.md 1.3-1.5, 3.4, 5.2).

Every derivative is checked against central differences of the forward code (force/smearing.py,
force/unitarize.py, force/hisq_links.py): the staple adjoint, each smearing level, the Naik term, the U(3)
projection (with and without MILC's force filter), the intermediates D_W and D_V, and the momentum derivative
Pdot = TA[U G^dag] along U -> exp(tau Omega) U. The asqtad force is also compared with MILC's own output
(``check_fermion_force``, fixtures/milc/colormatrix.mom.sample.l8).
"""
import numpy as np
import pytest

from force import phases
from force.hisq_force import (asqtad_force, asqtad_link_derivative, hisq_force, hisq_force_terms,
                              hisq_level2_vjp)
from force.hisq_links import asqtad_links, hisq_links, hisq_links_multi
from force.smearing import (FAT7, HISQ_EPS_CORRECTION, HISQ_LEVEL2, PathCoefficients, asqtad_coefficients,
                            fat_link, naik_link)
from force.smearing_derivative import StapleAdjoint, fat_link_vjp, naik_link_vjp
from force.unitarize import u3_unitarize
from force.unitarize_derivative import FORCE_FILTER, u3_unitarize_regularized, u3_unitarize_vjp
from lattice import CounterRNG, GaugeField, Geometry, su3
from lattice.gauge import random_gauge_transformation
from lattice.io import read_color_matrices, read_color_vector, read_gauge
from tests.conftest import fixture_path

EPS_F211 = -0.16875  # -27/40 (0.5)^2 (docs/conventions.md 1.4)
EPS_GROUPS = (0.0, EPS_F211)


# helpers ---------------------------------------------------------------------------------------------------
def _retr(a, b) -> float:
    """sum Re Tr[a b] over all leading axes."""
    return float(np.sum(a * b.swapaxes(-1, -2)).real)


def _algebra_field(geom, rng, stream):
    w = rng.gaussian(stream, geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    return su3.algebra_from_coefficients(np.moveaxis(w, 4, 0))


def _complex(rng, shape):
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


def _central(f, h):
    return (f(h) - f(-h)) / (2 * h)


def _richardson(f, h):
    """Central difference with the h^2 term removed: (4 D(h/2) - D(h)) / 3."""
    return (4 * _central(f, h / 2) - _central(f, h)) / 3


def _dtau(action, links, omega, h=1e-5, richardson=False):
    """d/dtau action(exp(tau Omega) U) at tau = 0."""
    f = lambda t: action(su3.expm_su3(t * omega) @ links)  # noqa: E731
    return _richardson(f, h) if richardson else _central(f, h)


def _predicted(pdot, omega) -> float:
    """sum Tr(Pdot Omega) (real for anti-Hermitian matrices)."""
    return _retr(pdot, omega)


def _hisq_action(geom, fat_outer, long_outer, time_bc="antiperiodic"):
    """S(U) = sum_e sum Re Tr[fat^e(U) F_fat^e + long^e(U) F_long^e], through force/hisq_links.py."""
    eps_list = sorted(set(fat_outer) | set(long_outer))

    def action(links):
        out = 0.0
        for fl in hisq_links_multi(GaugeField(geom, links), eps_list, time_bc):
            if fl.eps in fat_outer:
                out += _retr(fl.fat, fat_outer[fl.eps])
            if fl.eps in long_outer:
                out += _retr(fl.long, long_outer[fl.eps])
        return out

    return action


def _outer(rng, links, eps_list=EPS_GROUPS):
    return ({e: _complex(rng, links.shape) for e in eps_list}, {e: _complex(rng, links.shape) for e in eps_list})


def _transform(geom, a, g, hops=1):
    """A_mu(x) -> g(x) A_mu(x) g(x + hops mu)^dag."""
    out = np.empty_like(a)
    for mu in range(4):
        out[mu] = g @ a[mu] @ su3.dagger(geom.shift(g, mu, hops))
    return out


def _transform_outer(geom, f, g, hops=1):
    """An outer product F_mu(x) ~ Z(x + hops mu) Z(x)^dag -> g(x + hops mu) F_mu(x) g(x)^dag."""
    out = np.empty_like(f)
    for mu in range(4):
        out[mu] = geom.shift(g, mu, hops) @ f[mu] @ su3.dagger(g)
    return out


def _min_eig_vdv(v) -> float:
    return float(np.linalg.eigvalsh(su3.dagger(v) @ v).min())


# fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def geom():
    return Geometry((4, 4, 4, 4))


@pytest.fixture(scope="module")
def smooth(geom):
    """Links exp(0.3 * random algebra) on 4^4: smooth, far from the unit field, no force filter."""
    return GaugeField(geom, su3.expm_su3(0.3 * _algebra_field(geom, CounterRNG(20240611), "smooth")))


@pytest.fixture(scope="module")
def complex_links(geom, smooth):
    """A generic (non-unitary) complex link field: the smearing derivatives must be exact for any links."""
    return smooth.links + 0.3 * _complex(np.random.default_rng(11), smooth.links.shape)


@pytest.fixture(scope="module")
def milc_hisq():
    u, _ = read_gauge(fixture_path("lat.sample.l6666.hisq"), reunitarize=True)
    return u


# the staple operator and the smearing levels ---------------------------------------------------------------
def test_staple_adjoint(geom, complex_links):
    """S_nu^T is the adjoint of A -> S_nu[A] (exactly), and its link part is the derivative through U_nu."""
    rng = np.random.default_rng(1)
    links = complex_links
    a, d = _complex(rng, links.shape[1:]), _complex(rng, links.shape[1:])
    e_links = _complex(rng, links.shape)
    for nu, mu in [(1, 0), (3, 2), (0, 3)]:
        s = StapleAdjoint(geom, links)
        d_a = s.vjp(nu, mu, a, d)
        d_links = s.link_derivative()
        assert _retr(s(nu, mu, a), d) == pytest.approx(_retr(a, d_a), rel=1e-13)
        assert np.all(d_links[[k for k in range(4) if k != nu]] == 0)
        fd = _central(lambda h: _retr(StapleAdjoint(geom, links + h * e_links)(nu, mu, a), d), 1e-5)
        assert fd == pytest.approx(_retr(e_links, d_links), rel=1e-9)
    with pytest.raises(ValueError):
        StapleAdjoint(geom, links).vjp(1, 1, a, d)


def test_staple_operator_is_the_staple(geom, complex_links):
    """S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu), written out with
    shifts; the adjoint class applies the same forward operator."""
    from force.smearing import StapleOperator

    a = _complex(np.random.default_rng(2), complex_links.shape[1:])
    sh, dag = geom.shift, su3.dagger
    for nu, mu in [(2, 1), (0, 3)]:
        u = complex_links[nu]
        want = (u @ sh(a, nu, 1) @ dag(sh(u, mu, 1))
                + dag(sh(u, nu, -1)) @ sh(a, nu, -1) @ sh(sh(u, nu, -1), mu, 1))
        got = StapleOperator(geom, complex_links)(nu, mu, a)
        assert np.abs(got - want).max() <= 1e-13 * np.abs(want).max()
        assert np.array_equal(StapleAdjoint(geom, complex_links)(nu, mu, a), got)


@pytest.mark.parametrize("name,c", [
    ("fat7", FAT7),
    ("hisq_level2", HISQ_LEVEL2),
    ("asqtad_u0_0.9", asqtad_coefficients(0.9)),
    ("three_staple_only", PathCoefficients(one_link=0.3, three_staple=0.7)),
    ("lepage_only", PathCoefficients(one_link=0.0, lepage=-0.5)),
    ("seven_staple_only", PathCoefficients(one_link=0.0, seven_staple=1.0)),
])
def test_fat_link_vjp(geom, complex_links, name, c):
    """Each smearing level alone: d/dh sum Re Tr[F[U + h E] D] = sum Re Tr[E D_U], for non-unitary U."""
    rng = np.random.default_rng(3)
    d = _complex(rng, complex_links.shape)
    e = _complex(rng, complex_links.shape)
    d_u = fat_link_vjp(geom, complex_links, c, d)
    fd = _richardson(lambda h: _retr(fat_link(geom, complex_links + h * e, c), d), 1e-4)
    assert fd == pytest.approx(_retr(e, d_u), rel=1e-9)


def test_naik_link_vjp(geom, complex_links):
    rng = np.random.default_rng(4)
    d, e = _complex(rng, complex_links.shape), _complex(rng, complex_links.shape)
    d_u = naik_link_vjp(geom, complex_links, -1 / 24, d)
    fd = _richardson(lambda h: _retr(naik_link(geom, complex_links + h * e, -1 / 24), d), 1e-4)
    assert fd == pytest.approx(_retr(e, d_u), rel=1e-10)


# the U(3) projection -------------------------------------------------------------------------------------------
def _test_matrices(rng, n=64):
    """V: near-unitary, generic, and exactly degenerate (V = c x unitary, V^dag V = c^2 1) matrices."""
    unit = su3.expm_su3(su3.algebra_from_coefficients(rng.normal(size=(n, 8))))
    v = 0.6 * unit + 0.25 * _complex(rng, (n, 3, 3))
    v[:4] = 0.8 * unit[:4]              # degenerate eigenvalues: MILC's |S| < 1e-14 branch
    v[4:8] = 2.0 * _complex(rng, (4, 3, 3))
    return v


def test_u3_unitarize_vjp(geom):
    rng = np.random.default_rng(5)
    v = _test_matrices(rng)
    d_w, e = _complex(rng, v.shape), _complex(rng, v.shape)
    d_v, info = u3_unitarize_vjp(v, d_w)
    assert info.n_filtered == 0 and info.min_eigenvalue > FORCE_FILTER
    assert info.min_eigenvalue == pytest.approx(_min_eig_vdv(v), rel=1e-12)
    f = lambda h: _retr(u3_unitarize(v + h * e)[0], d_w)  # noqa: E731  (MILC's analytic projection)
    assert _richardson(f, 1e-4) == pytest.approx(_retr(e, d_v), rel=1e-9)
    # matrix by matrix, including the degenerate ones. The cubic-formula eigenvalues carry rounding of ~1e-13
    # (acos near degenerate roots), which a difference quotient with h = 1e-4 turns into up to ~3e-9.
    for i in (0, 3, 5, 20):
        one = slice(i, i + 1)
        fi = lambda h: _retr(u3_unitarize(v[one] + h * e[one])[0], d_w[one])  # noqa: E731
        assert _richardson(fi, 1e-4) == pytest.approx(_retr(e[one], d_v[one]), rel=1e-8)
    # any leading shape; no filter requested gives the same here
    d_v2, info2 = u3_unitarize_vjp(v.reshape(4, 16, 3, 3), d_w.reshape(4, 16, 3, 3), force_filter=None)
    assert info2.mask is None and np.allclose(d_v2.reshape(v.shape), d_v, rtol=0, atol=1e-13)


def test_force_filter_matrices():
    """MILC's filter (5e-5): where min eig V^dag V < 5e-5 the result is the exact derivative of
    V (V^dag V + 5e-5)^(-1/2), not of W; elsewhere nothing changes."""
    rng = np.random.default_rng(6)
    v = _test_matrices(rng, 16)
    a, _, bh = np.linalg.svd(v[9])
    v[9] = (a * np.array([1.2, 0.8, 3e-3])) @ bh       # g_min = 9e-6 < 5e-5
    v[10] = (a * np.array([1.1, 0.9, 8e-3])) @ bh      # g_min = 6.4e-5: not filtered
    d_w, e = _complex(rng, v.shape), _complex(rng, v.shape)
    d_f, info = u3_unitarize_vjp(v, d_w)
    d_x, info_x = u3_unitarize_vjp(v, d_w, force_filter=None)
    assert info.n_filtered == 1 and np.flatnonzero(info.mask) == [9]
    assert info.min_eigenvalue == pytest.approx(9e-6, rel=1e-6)
    assert info_x.n_filtered == 0
    keep = ~info.mask
    assert np.array_equal(d_f[keep], d_x[keep])
    e9 = np.zeros_like(e)
    e9[9] = e[9]
    # references by eigen-decomposition (MILC's analytic formula loses ~1/g_min of its accuracy here)
    h = 1e-5
    exact = _richardson(lambda t: _retr(u3_unitarize_regularized(v + t * e9, 0.0), d_w), h)
    regular = _richardson(lambda t: _retr(u3_unitarize_regularized(v + t * e9, FORCE_FILTER), d_w), h)
    assert exact == pytest.approx(_retr(e9, d_x), rel=1e-6)
    assert regular == pytest.approx(_retr(e9, d_f), rel=1e-6)
    assert abs(_retr(e9, d_f) - exact) > 0.1 * abs(exact)   # the filter changes the force


# the HISQ chain ---------------------------------------------------------------------------------------------
def test_hisq_intermediates(geom, smooth):
    """D_W (level 2 for two epsilon groups, one-link eps W/8 and Naik terms, phases folded in) and D_V
    (through the U(3) projection) against central differences in generic complex directions."""
    rng = np.random.default_rng(7)
    fo, lo = _outer(rng, smooth.links)
    terms = hisq_force_terms(smooth, fo, lo)
    fl = hisq_links(smooth)
    v, w = fl.V, fl.W
    eta, eta_long = phases.staggered_phases(geom), phases.naik_phases(geom)

    def s_w(w_links):
        x0 = fat_link(geom, w_links, HISQ_LEVEL2)
        l0 = naik_link(geom, w_links, HISQ_LEVEL2.naik)
        out = 0.0
        for e in EPS_GROUPS:
            out += _retr(phases.apply_phases(x0 + e * HISQ_EPS_CORRECTION.one_link * w_links, eta), fo[e])
            out += _retr(phases.apply_phases((1 + e) * l0, eta_long), lo[e])
        return out

    e_dir = _complex(rng, w.shape)
    assert _richardson(lambda h: s_w(w + h * e_dir), 1e-4) == pytest.approx(_retr(e_dir, terms.d_w), rel=1e-9)
    assert np.array_equal(hisq_level2_vjp(geom, w, fo, lo), terms.d_w)
    fd_v = _richardson(lambda h: s_w(u3_unitarize(v + h * e_dir)[0]), 1e-4)
    assert fd_v == pytest.approx(_retr(e_dir, terms.d_v), rel=1e-8)
    assert terms.filter.n_filtered == 0 and terms.filter.min_eigenvalue > FORCE_FILTER
    # the derivative with respect to U in a complex direction (not only along the group)
    fd_u = _richardson(lambda h: _hisq_action(geom, fo, lo)(smooth.links + h * e_dir), 1e-4)
    assert fd_u == pytest.approx(_retr(e_dir, terms.d_u), rel=1e-8)


@pytest.mark.parametrize("time_bc", ["antiperiodic", "periodic"])
def test_hisq_force_finite_difference(geom, smooth, time_bc):
    """Pdot against d/dtau S(exp(tau Omega) U), S = sum_e sum Re Tr[fat^e F_fat^e + long^e F_long^e] with
    eps = 0 and -0.16875, on a smooth 4^4 field (force filter not active)."""
    v = hisq_links(smooth).V
    assert _min_eig_vdv(v) > FORCE_FILTER
    rng = np.random.default_rng(8)
    fo, lo = _outer(rng, smooth.links)
    pdot = hisq_force(smooth, fo, lo, time_bc)
    assert np.abs(pdot - su3.traceless_antihermitian(pdot)).max() < 1e-14
    action = _hisq_action(geom, fo, lo, time_bc)
    for k in range(2):
        omega = _algebra_field(geom, CounterRNG(100 + k), "direction")
        predicted = _predicted(pdot, omega)
        assert _dtau(action, smooth.links, omega) == pytest.approx(predicted, rel=1e-8)


def test_hisq_force_milc_lattice(milc_hisq):
    """The same on MILC's lat.sample.l6666.hisq (min eig V^dag V = 0.0867), two epsilon groups."""
    u = milc_hisq
    geom = u.geom
    fl = hisq_links(u)
    assert fl.unitarize.min_eigenvalue > FORCE_FILTER
    rng = np.random.default_rng(9)
    fo, lo = _outer(rng, u.links)
    terms = hisq_force_terms(u, fo, lo, links=fl)
    assert terms.filter.n_filtered == 0
    assert np.array_equal(terms.pdot, hisq_force(u, fo, lo))   # reusing V and W changes nothing
    omega = _algebra_field(geom, CounterRNG(86658), "direction")
    assert _dtau(_hisq_action(geom, fo, lo), u.links, omega) == pytest.approx(_predicted(terms.pdot, omega),
                                                                                rel=1e-8)


def test_hisq_force_epsilon_groups(geom, smooth):
    """The force is linear in the outer products: two groups = the sum of the groups taken one by one; a bare
    array means eps = 0; no outer products, no force."""
    rng = np.random.default_rng(10)
    fo, lo = _outer(rng, smooth.links)
    both = hisq_force(smooth, fo, lo)
    one_by_one = sum(hisq_force(smooth, {e: fo[e]}, {e: lo[e]}) for e in EPS_GROUPS)
    assert np.abs(both - one_by_one).max() < 1e-12 * np.abs(both).max()
    assert np.array_equal(hisq_force(smooth, fo[0.0], lo[0.0]), hisq_force(smooth, {0.0: fo[0.0]}, {0.0: lo[0.0]}))
    only_long = hisq_force(smooth, None, {EPS_F211: lo[EPS_F211]})
    only_fat = hisq_force(smooth, {EPS_F211: fo[EPS_F211]}, None)
    single = hisq_force(smooth, {EPS_F211: fo[EPS_F211]}, {EPS_F211: lo[EPS_F211]})
    assert np.abs(only_long + only_fat - single).max() < 1e-12 * np.abs(single).max()
    assert np.abs(hisq_force(smooth, {}, {})).max() == 0.0


# asqtad ----------------------------------------------------------------------------------------------------
def test_asqtad_force_finite_difference(geom, smooth):
    rng = np.random.default_rng(12)
    f_fat, f_long = _complex(rng, smooth.links.shape), _complex(rng, smooth.links.shape)
    pdot = asqtad_force(smooth, 0.9, f_fat, f_long)

    def action(links):
        fl = asqtad_links(GaugeField(geom, links), 0.9)
        return _retr(fl.fat, f_fat) + _retr(fl.long, f_long)

    for k in range(2):
        omega = _algebra_field(geom, CounterRNG(200 + k), "direction")
        assert _dtau(action, smooth.links, omega) == pytest.approx(_predicted(pdot, omega), rel=1e-8)
    assert np.array_equal(asqtad_force(smooth, 0.9, {0.0: f_fat}, {0.0: f_long}), pdot)
    with pytest.raises(ValueError):
        asqtad_link_derivative(smooth, 0.9, {0.1: f_fat}, None)


def test_asqtad_force_matches_milc():
    """MILC's ``check_fermion_force`` (ks_imp_utilities/test/check_fermion_force.2): lat.sample.l8, asqtad with
    u0 = 0.502, eps = 1, one term with residue nflavors/4 = 1 and multi_x = the stored source
    ksvector.src.sample.l8 on *all* sites (MILC's force expects multi_x = X on even and D_oe X on odd sites; the
    check passes the source as it is). Its answer, colormatrix.mom.sample.l8 (single precision, checksums
    75cd4ee7 1fc07e0e as in the sample output), is Pdot for the outer products of docs/conventions.md 3.4,
    F_fat_mu(x) = 2 eps(x) Z(x+mu) Z(x)^dag and F_long_mu(x) = 2 eps(x) Z(x+3mu) Z(x)^dag, with Z = the source."""
    u, _ = read_gauge(fixture_path("lat.sample.l8"), reunitarize=True)
    geom = u.geom
    z = read_color_vector(fixture_path("ksvector.src.sample.l8"))
    milc = np.ascontiguousarray(np.moveaxis(read_color_matrices(fixture_path("colormatrix.mom.sample.l8")), 4, 0))
    parity_sign = np.where(geom.parity() == 0, 1.0, -1.0)[..., None, None]
    outer = lambda k: np.stack([2 * parity_sign * (geom.shift(z, mu, k)[..., :, None] * z.conj()[..., None, :])
                                for mu in range(4)])  # noqa: E731
    pdot = asqtad_force(u, 0.502, outer(1), outer(3))
    scale = np.abs(milc).max()
    assert np.abs(pdot - milc).max() < 2e-7 * scale                  # float32 storage of the answer
    # MILC's own criterion, per link: |diff| <= 1e-5 |mom|
    norm = np.sqrt(np.sum(np.abs(milc) ** 2, axis=(-2, -1)))
    diff = np.sqrt(np.sum(np.abs(pdot - milc) ** 2, axis=(-2, -1)))
    assert np.all(diff <= 1e-5 * norm)


# the force filter on a lattice -------------------------------------------------------------------------------
def test_force_filter_on_rough_lattice():
    """A hot (Haar-random) 4^4 start has one link with min eig V^dag V = 2.76e-5 < 5e-5: the filter acts
    there only. Without the filter the force is the exact derivative; with it (MILC's default) it is not."""
    geom = Geometry((4, 4, 4, 4))
    u = GaugeField.random(geom, CounterRNG(4))
    fl = hisq_links(u)
    assert fl.unitarize.n_svd == 0
    assert fl.unitarize.min_eigenvalue == pytest.approx(2.757e-5, rel=1e-3)
    rng = np.random.default_rng(13)
    fo, lo = _outer(rng, u.links, (0.0,))
    filtered = hisq_force_terms(u, fo, lo, links=fl)
    exact = hisq_force_terms(u, fo, lo, links=fl, force_filter=None)
    assert filtered.filter.n_filtered == 1 and exact.filter.n_filtered == 0
    mask = filtered.filter.mask
    assert np.array_equal(filtered.d_v[~mask], exact.d_v[~mask])
    assert np.array_equal(filtered.d_w, exact.d_w)
    omega = _algebra_field(geom, CounterRNG(300), "direction")
    fd = _dtau(_hisq_action(geom, fo, lo), u.links, omega, h=1e-5, richardson=True)
    assert fd == pytest.approx(_predicted(exact.pdot, omega), rel=1e-6)
    assert abs(_predicted(filtered.pdot, omega) - fd) > 0.1 * abs(fd)


# gauge covariance ------------------------------------------------------------------------------------------
def test_gauge_covariance(geom, smooth):
    """U -> g U g(x+mu)^dag and F_mu(x) -> g(x+mu) F g(x)^dag (long: g(x+3mu)) give Pdot -> g Pdot g^dag."""
    g = random_gauge_transformation(geom, CounterRNG(777))
    ut = smooth.gauge_transform(g)
    rng = np.random.default_rng(14)
    fo, lo = _outer(rng, smooth.links)
    fo_t = {e: _transform_outer(geom, f, g) for e, f in fo.items()}
    lo_t = {e: _transform_outer(geom, f, g, 3) for e, f in lo.items()}
    terms = hisq_force_terms(smooth, fo, lo)
    terms_t = hisq_force_terms(ut, fo_t, lo_t)
    scale = np.abs(terms.pdot).max()
    rotated = np.stack([g @ terms.pdot[mu] @ su3.dagger(g) for mu in range(4)])
    assert np.abs(terms_t.pdot - rotated).max() < 1e-12 * scale
    # the link derivatives transform like the outer products: D_mu(x) -> g(x+mu) D g(x)^dag
    for a, b in ((terms.d_v, terms_t.d_v), (terms.d_w, terms_t.d_w), (terms.d_u, terms_t.d_u)):
        assert np.abs(b - _transform_outer(geom, a, g)).max() < 1e-12 * np.abs(a).max()
    # asqtad
    p = asqtad_force(smooth, 0.9, fo[0.0], lo[0.0])
    pt = asqtad_force(ut, 0.9, fo_t[0.0], lo_t[0.0])
    rotated = np.stack([g @ p[mu] @ su3.dagger(g) for mu in range(4)])
    assert np.abs(pt - rotated).max() < 1e-12 * np.abs(p).max()
