"""HISQ and asqtad fermion links (docs/conventions.md 1.2-1.5, 4.3, 5.3): phases, smearing, U(3) projection.

Reference data: MILC's sample lattices and the asqtad fat/long links ``fat.l8``, ``long.l8`` (fixtures/milc/).
"""
import itertools

import numpy as np
import pytest

from force import phases
from force.hisq_links import FermionLinks, asqtad_links, hisq_links, hisq_links_multi
from force.smearing import (FAT7, HISQ_EPS_CORRECTION, HISQ_LEVEL2, PathCoefficients, asqtad_coefficients,
                            fat_link, hisq_level2_coefficients, naik_link)
from force.unitarize import u3_project_svd, u3_unitarize
from lattice import CounterRNG, GaugeField, Geometry, su3
from lattice.gauge import random_gauge_transformation
from lattice.io import read_color_matrices, read_gauge
from tests.conftest import fixture_path

EPS_F211 = -0.16875  # -27/40 (0.5)^2, the f211 test's Naik epsilon (docs/conventions.md 1.4)


# helpers ---------------------------------------------------------------------------------------------------
def _links_array(site_major):
    """(nt, nz, ny, nx, 4, 3, 3) -> (4, nt, nz, ny, nx, 3, 3)."""
    return np.ascontiguousarray(np.moveaxis(site_major, 4, 0))


def _transform(geom, a, g, hops=1):
    """A_mu(x) -> g(x) A_mu(x) g(x + hops*mu)^dag for a link-like field."""
    return np.stack([g @ a[mu] @ su3.dagger(geom.shift(g, mu, hops)) for mu in range(4)])


def _unitarity(w):
    return float(np.abs(w @ su3.dagger(w) - np.eye(3)).max())


def _path_product(geom, links, path):
    """Product along a path of signed directions (+(d+1) forward, -(d+1) backward) starting at every site x."""
    pos = [0, 0, 0, 0]
    out = None
    for s in path:
        d = abs(s) - 1
        if s < 0:
            pos[d] -= 1
        m = links[d]
        for nu, k in enumerate(pos):
            if k:
                m = geom.shift(m, nu, k)
        if s < 0:
            m = su3.dagger(m)
        else:
            pos[d] += 1
        out = m if out is None else out @ m
    return out


def _explicit_fat(geom, links, c):
    """F[U; c] by summing MILC's path table explicitly: genuine Lepage paths, no "-6 cL" (independent check of
    the nested-staple evaluation and of the multiplicities 6, 24, 48, 6)."""
    out = np.empty_like(links)
    counts = {}
    for mu in range(4):
        m = mu + 1
        others = [d + 1 for d in range(4) if d != mu]
        acc = c.one_link * links[mu]
        n3 = n5 = n7 = nl = 0
        for nu in others:
            for a in (nu, -nu):
                acc = acc + c.three_staple * _path_product(geom, links, [a, m, -a])
                acc = acc + c.lepage * _path_product(geom, links, [a, a, m, -a, -a])
                n3 += 1
                nl += 1
        for nu, rho in itertools.permutations(others, 2):
            for a, b in itertools.product((nu, -nu), (rho, -rho)):
                acc = acc + c.five_staple * _path_product(geom, links, [a, b, m, -b, -a])
                n5 += 1
        for nu, rho, sig in itertools.permutations(others, 3):
            for a, b, e in itertools.product((nu, -nu), (rho, -rho), (sig, -sig)):
                acc = acc + c.seven_staple * _path_product(geom, links, [a, b, e, m, -e, -b, -a])
                n7 += 1
        out[mu] = acc
        counts = {"3-staple": n3, "5-staple": n5, "7-staple": n7, "lepage": nl}
    return out, counts


# fixtures --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hisq_lattice():
    u, _ = read_gauge(fixture_path("lat.sample.l6666.hisq"), reunitarize=True)
    return u


@pytest.fixture(scope="module")
def hisq_fl(hisq_lattice):
    return hisq_links(hisq_lattice)


@pytest.fixture(scope="module")
def random_lattice():
    geom = Geometry((4, 4, 4, 4))
    return GaugeField.random(geom, CounterRNG(4242))


# phases ----------------------------------------------------------------------------------------------------
def test_phases_milc_convention():
    geom = Geometry((4, 4, 4, 6))
    x, y, z, t = geom.coordinates()
    eta = phases.staggered_phases(geom, "antiperiodic")
    assert np.array_equal(eta[0], (-1.0) ** t)
    assert np.array_equal(eta[1], (-1.0) ** (t + x))
    assert np.array_equal(eta[2], (-1.0) ** (t + x + y))
    assert np.array_equal(eta[3], np.where(t == 5, -1.0, 1.0))
    assert np.array_equal(phases.staggered_phases(geom, "periodic")[3], np.ones(geom.shape))
    # Naik: eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu); the t path x -> x+3t crosses the boundary from t = 3, 4, 5
    nk = phases.naik_phases(geom, "antiperiodic")
    for mu in range(3):
        assert np.array_equal(nk[mu], eta[mu])
    assert np.array_equal(nk[3], np.where(t >= 3, -1.0, 1.0))
    assert np.array_equal(phases.naik_phases(geom, "periodic")[3], np.ones(geom.shape))
    # equal to the product of shifted phases
    for mu in range(4):
        prod = eta[mu] * geom.shift(eta[mu], mu, 1) * geom.shift(eta[mu], mu, 2)
        assert np.array_equal(nk[mu], prod)
    with pytest.raises(ValueError):
        phases.staggered_phases(geom, "open")


# coefficients and free field -------------------------------------------------------------------------------
def test_coefficient_tables():
    assert FAT7.as_tuple() == (1 / 8, 0.0, 1 / 16, 1 / 64, 1 / 384, 0.0)
    # MILC's printed (phased) path coefficients
    assert np.allclose(FAT7.milc_signed(), (0.125, 0.0, -0.0625, 0.015625, -0.002604167, 0.0), atol=1e-9)
    assert np.allclose(HISQ_LEVEL2.milc_signed(), (1.0, -1 / 24, -1 / 16, 1 / 64, -1 / 384, -1 / 8))
    assert HISQ_EPS_CORRECTION.as_tuple()[:2] == (1 / 8, -1 / 24)
    c = hisq_level2_coefficients(EPS_F211)
    assert c.one_link == pytest.approx(1 + EPS_F211 / 8) and c.naik == pytest.approx(-(1 + EPS_F211) / 24)
    # asqtad: MILC's asqtad_action.h, coefficient / u0^(length-1) (ks_action_paths.c, TADPOLE_IMPROVE)
    u0 = 0.502
    a = asqtad_coefficients(u0)
    milc = (1 / 8 + 6 / 16 + 1 / 8, -1 / 24, -1 / 16, 1 / 64, -1 / 384, -1 / 16)
    lengths = (1, 3, 3, 5, 7, 5)
    assert np.allclose(a.milc_signed(), [cc / u0 ** (n - 1) for cc, n in zip(milc, lengths)], rtol=1e-15)
    # free-field normalisation: level 1 gives 1 (so W = 1), level 2 9/8 + eps/8, fat + 3 Naik = 1
    assert FAT7.free_field_value() == pytest.approx(1.0, abs=1e-15)
    for eps in (0.0, EPS_F211):
        c = hisq_level2_coefficients(eps)
        assert c.free_field_value() == pytest.approx(9 / 8 + eps / 8, abs=1e-15)
        assert c.free_field_value() + 3 * c.naik == pytest.approx(1.0, abs=1e-15)
    assert asqtad_coefficients(1.0).free_field_value() + 3 * asqtad_coefficients(1.0).naik == pytest.approx(1.0)


@pytest.mark.parametrize("eps", [0.0, EPS_F211])
@pytest.mark.parametrize("time_bc", ["antiperiodic", "periodic"])
def test_unit_gauge_hisq(eps, time_bc):
    geom = Geometry((4, 4, 4, 4))
    fl = hisq_links(GaugeField.unit(geom), eps=eps, time_bc=time_bc)
    eye = np.eye(3)
    assert np.abs(fl.V - eye).max() < 1e-15          # 1/8 + 6/16 + 24/64 + 48/384 = 1
    assert np.abs(fl.W - eye).max() < 1e-15
    assert fl.unitarize.n_svd == 0 and fl.unitarize.min_eigenvalue == pytest.approx(1.0)
    eta = phases.staggered_phases(geom, time_bc)
    etal = phases.naik_phases(geom, time_bc)
    # X = c1 + 6 c3 + 6 cL + 24 c5 + 48 c7 = 1 + 6/16 - 6/8 + 24/64 + 48/384 + eps/8 = 9/8 + eps/8
    xval = 9 / 8 + eps / 8
    assert np.abs(fl.fat - xval * eta[..., None, None] * eye).max() < 1e-14
    assert np.abs(fl.long + (1 + eps) / 24 * etal[..., None, None] * eye).max() < 1e-15
    assert np.abs(fl.unphased_fat() - xval * eye).max() < 1e-14
    assert np.abs(fl.unphased_long() + (1 + eps) / 24 * eye).max() < 1e-15


def test_unit_gauge_asqtad():
    geom = Geometry((4, 4, 4, 4))
    u0 = 0.87
    fl = asqtad_links(GaugeField.unit(geom), u0)
    eta = phases.staggered_phases(geom)
    xval = 5 / 8 + 6 / (16 * u0 ** 2) + 24 / (64 * u0 ** 4) + 48 / (384 * u0 ** 6) - 6 / (16 * u0 ** 4)
    assert np.abs(fl.fat - xval * eta[..., None, None] * np.eye(3)).max() < 1e-14
    assert np.abs(fl.unphased_long() + 1 / (24 * u0 ** 2) * np.eye(3)).max() < 1e-15
    assert fl.V is None and fl.W is None


# smearing organisation -------------------------------------------------------------------------------------
def test_fat_link_equals_explicit_path_sum(random_lattice):
    """The nested-staple (Horner) evaluation equals the explicit sum over MILC's 6 + 24 + 48 + 6 paths."""
    u = random_lattice
    c = PathCoefficients(one_link=0.3, three_staple=0.11, five_staple=0.07, seven_staple=0.05, lepage=-0.13)
    got = fat_link(u.geom, u.links, c)
    ref, counts = _explicit_fat(u.geom, u.links, c)
    assert counts == {"3-staple": 6, "5-staple": 24, "7-staple": 48, "lepage": 6}
    assert np.abs(got - ref).max() < 1e-13


def test_phased_smearing_with_milc_signs(hisq_lattice, hisq_fl):
    """Smearing the phased links (BC included) with MILC's signed coefficients, projecting and smearing again
    gives our fat and long links (phases applied afterwards) — docs/conventions.md 1.3."""
    u = hisq_lattice
    geom = u.geom
    eta = phases.staggered_phases(geom)
    up = phases.apply_phases(u.links, eta)
    vp = fat_link(geom, up, PathCoefficients(*FAT7.milc_signed()))
    assert np.abs(vp - phases.apply_phases(hisq_fl.V, eta)).max() < 1e-14
    wp, _ = u3_unitarize(vp)
    c2 = PathCoefficients(*HISQ_LEVEL2.milc_signed())
    xp = fat_link(geom, wp, c2)
    lp = naik_link(geom, wp, c2.naik)
    assert np.abs(xp - hisq_fl.fat).max() < 1e-13
    assert np.abs(lp - hisq_fl.long).max() < 1e-14


# HISQ on MILC's sample lattice -----------------------------------------------------------------------------
def test_hisq_gauge_covariance(hisq_lattice, hisq_fl):
    u = hisq_lattice
    geom = u.geom
    g = random_gauge_transformation(geom, CounterRNG(777))
    ut = u.gauge_transform(g)
    fl_t = hisq_links(ut)
    assert np.abs(fl_t.V - _transform(geom, hisq_fl.V, g)).max() < 1e-12
    assert np.abs(fl_t.W - _transform(geom, hisq_fl.W, g)).max() < 1e-12
    assert np.abs(fl_t.unphased_fat() - _transform(geom, hisq_fl.unphased_fat(), g)).max() < 1e-12
    assert np.abs(fl_t.unphased_long() - _transform(geom, hisq_fl.unphased_long(), g, 3)).max() < 1e-12
    # the phased links transform the same way (the phases are +-1 scalars)
    assert np.abs(fl_t.fat - _transform(geom, hisq_fl.fat, g)).max() < 1e-12
    assert np.abs(fl_t.long - _transform(geom, hisq_fl.long, g, 3)).max() < 1e-12


def test_hisq_projection_unitary(hisq_fl):
    fl = hisq_fl
    assert fl.unitarize.n_svd == 0
    assert fl.unitarize.min_eigenvalue == pytest.approx(0.0867, abs=5e-5)  # docs/conventions.md 1.5
    assert _unitarity(fl.W) < 1e-14
    # U(3), not SU(3): det W is a phase, not 1
    det = np.linalg.det(fl.W)
    assert np.abs(np.abs(det) - 1).max() < 1e-14
    assert np.abs(det - 1).max() > 1e-3


@pytest.mark.parametrize("name,eps", [("lat.sample.l6666.hisq", 0.0), ("lat.sample.hisq.f211b670.l6666", EPS_F211)])
def test_long_link_norm(name, eps):
    """sum_x,mu ||long||_F^2 = 4V * 3 (1+eps)^2 / 576 (docs/conventions.md 4.3): 27.0 on 6^4 with eps 0."""
    u, _ = read_gauge(fixture_path(name), reunitarize=True)
    fl = hisq_links(u, eps=eps)
    expected = 4 * u.geom.volume * 3 * (1 + eps) ** 2 / 576
    if eps == 0.0:
        assert expected == 27.0
    got = float(np.sum(np.abs(fl.long) ** 2))
    assert got == pytest.approx(expected, rel=1e-13)


def test_multi_epsilon(hisq_lattice):
    u = hisq_lattice
    eps_list = [0.0, EPS_F211, 0.1]
    multi = hisq_links_multi(u, eps_list)
    assert [m.eps for m in multi] == eps_list
    assert all(m.W is multi[0].W and m.V is multi[0].V for m in multi)
    for m in multi:
        single = hisq_links(u, eps=m.eps)
        assert np.abs(single.fat - m.fat).max() == 0.0 and np.abs(single.long - m.long).max() == 0.0
        # X_0 + eps X_p3 equals smearing W directly with the eps coefficients
        c = hisq_level2_coefficients(m.eps)
        assert np.abs(m.unphased_fat() - fat_link(u.geom, m.W, c)).max() < 1e-14
        assert np.abs(m.unphased_long() - naik_link(u.geom, m.W, c.naik)).max() < 1e-15
        assert isinstance(m, FermionLinks) and m.coefficients == c


def test_time_bc_periodic(hisq_lattice, hisq_fl):
    per = hisq_links(hisq_lattice, time_bc="periodic")
    nt = hisq_lattice.geom.dims[3]
    assert np.array_equal(per.fat[:3], hisq_fl.fat[:3]) and np.array_equal(per.long[:3], hisq_fl.long[:3])
    assert np.array_equal(per.fat[3, :nt - 1], hisq_fl.fat[3, :nt - 1])
    assert np.array_equal(per.fat[3, nt - 1], -hisq_fl.fat[3, nt - 1])
    assert np.array_equal(per.long[3, :nt - 3], hisq_fl.long[3, :nt - 3])
    assert np.array_equal(per.long[3, nt - 3:], -hisq_fl.long[3, nt - 3:])
    assert np.array_equal(per.unphased_fat(), hisq_fl.unphased_fat())


# U(3) projection -------------------------------------------------------------------------------------------
def _reference_eigh(v):
    """W = V Q^(-1/2), Q = V^dag V, from numpy's eigh, matrix by matrix."""
    flat = v.reshape(-1, 3, 3)
    out = np.empty_like(flat)
    for i, m in enumerate(flat):
        e, vec = np.linalg.eigh(m.conj().T @ m)
        out[i] = m @ (vec * e ** -0.5) @ vec.conj().T
    return out.reshape(v.shape)


def test_unitarize_matches_reference(hisq_fl):
    v = hisq_fl.V
    w, info = u3_unitarize(v)
    assert info.n_svd == 0 and info.n == v.size // 9
    assert np.abs(w - _reference_eigh(v)).max() < 1e-13
    assert np.abs(w - hisq_fl.W).max() == 0.0
    # the analytic formula and the SVD agree where both apply
    assert np.abs(w - u3_project_svd(v)).max() < 1e-13
    # min eigenvalue of V^dag V
    e = np.linalg.eigvalsh(su3.dagger(v) @ v)
    assert info.min_eigenvalue == pytest.approx(e.min(), rel=1e-12)


def test_unitarize_svd_fallback():
    rng = np.random.default_rng(5)
    def haar(n):
        z = rng.normal(size=(n, 3, 3)) + 1j * rng.normal(size=(n, 3, 3))
        q, r = np.linalg.qr(z)
        return q * (np.diagonal(r, axis1=-2, axis2=-1) / np.abs(np.diagonal(r, axis1=-2, axis2=-1)))[:, None, :]
    n = 12
    a, b = haar(n), haar(n)
    sig = np.tile([1.3, 0.9, 0.6], (n, 1))
    sig[3] = [1.2, 0.8, 1e-5]       # nearly singular: |det V|^2 ~ 1e-10 < 1e-8 -> SVD, W unique
    sig[7] = [1.1, 0.7, 0.0]        # rank 2: det V = 0 -> SVD
    sig[9] = [0.9, 0.0, 0.0]        # rank 1
    v = (a * sig[:, None, :]) @ su3.dagger(b)
    v = v.reshape(3, 4, 3, 3)       # any leading shape
    w, info = u3_unitarize(v)
    mask = info.svd_mask.reshape(-1)
    assert info.n_svd == 3 and set(np.flatnonzero(mask)) == {3, 7, 9}
    wf, vf = w.reshape(-1, 3, 3), v.reshape(-1, 3, 3)
    assert _unitarity(wf) < 1e-14
    # the non-singular sites keep the analytic result, bit for bit
    with np.errstate(invalid="ignore", divide="ignore"):  # the analytic formula fails on the singular sites
        w_an, info_an = u3_unitarize(v, allow_svd=False)
    assert info_an.n_svd == 0 and info_an.svd_mask is None
    keep = ~mask
    assert np.array_equal(wf[keep], w_an.reshape(-1, 3, 3)[keep])
    assert np.abs(wf[keep] - (a @ su3.dagger(b))[keep]).max() < 1e-13
    # nearly singular: W = A B^dag, unique; equal to the construction up to its conditioning (eps / sigma_min)
    assert np.abs(wf[3] - a[3] @ su3.dagger(b[3])).max() < 1e-10
    # every fallback site: A B^dag from numpy's SVD of V; W is a polar factor, V = W (V^dag V)^(1/2)
    for i in (3, 7, 9):
        aa, _, bh = np.linalg.svd(vf[i])
        assert np.abs(wf[i] - aa @ bh).max() < 1e-14
        _, s, bh2 = np.linalg.svd(vf[i])
        root = (su3.dagger(bh2) * s) @ bh2          # (V^dag V)^(1/2), unique (positive semi-definite)
        assert np.abs(wf[i] @ root - vf[i]).max() < 1e-14
    assert info.min_eigenvalue < 1e-20


# asqtad against MILC ---------------------------------------------------------------------------------------
def test_asqtad_matches_milc_fat_long():
    """Asqtad fat and long links on lat.sample.l8 (u0 = 0.502) against MILC's fat.l8 and long.l8.

    How MILC stores them (SciDAC files written with ``save_color_matrix_scidac``; datatype QDP_F3_ColorMatrix,
    single precision, record XML "Fat links" / "Long links"): 4 colour matrices per site in MILC's site order (x
    fastest), directions x, y, z, t (XUP..TUP), each row-major (re, im). The links are the ones the Dirac operator
    uses: the KS phases *and* the antiperiodic time-BC signs are folded in (fat: eta_mu(x); long: eta_mu(x)
    eta_mu(x+mu) eta_mu(x+2mu), so the t long links on the last three time slices carry the extra -1), and the
    tadpole factors are in the coefficients (5/8, -1/(24 u0^2), ...).

    The files were computed from the links *as stored* in lat.sample.l8 (single precision, not re-unitarized):
    our double-precision result from ``read_gauge(reunitarize=False)``, rounded to float32, equals the files
    bit for bit. With MILC's double-precision re-unitarization applied first the links move by ~6.5e-8 (the
    stored links' unitarity violation) and the agreement drops to ~1e-7 of the largest element.
    """
    u, info = read_gauge(fixture_path("lat.sample.l8"), reunitarize=False)
    assert info["dims"] == (8, 8, 8, 8)
    fl = asqtad_links(u, 0.502)
    fat = _links_array(read_color_matrices(fixture_path("fat.l8")))
    lng = _links_array(read_color_matrices(fixture_path("long.l8")))
    for ours, milc in ((fl.fat, fat), (fl.long, lng)):
        assert np.abs(ours - milc).max() / np.abs(milc).max() < 1e-7
        assert np.array_equal(ours.real.astype(np.float32), milc.real.astype(np.float32))
        assert np.array_equal(ours.imag.astype(np.float32), milc.imag.astype(np.float32))
    # the phases and the BC are part of the stored links: without them the agreement is lost
    assert np.abs(fl.unphased_long() - lng).max() > 0.1
    # reunitarized input: single-precision agreement
    ur, _ = read_gauge(fixture_path("lat.sample.l8"), reunitarize=True)
    flr = asqtad_links(ur, 0.502)
    for ours, milc in ((flr.fat, fat), (flr.long, lng)):
        assert np.abs(ours - milc).max() / np.abs(milc).max() < 1e-6
