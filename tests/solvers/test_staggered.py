"""The HISQ staggered operator D, M = 2m + D and its even-odd form (docs/conventions.md 1.2, 1.6)."""
import itertools

import numpy as np
import pytest

from lattice import Geometry, su3
from solvers import (EvenOddNormal, ParityHop, StaggeredDslash, StaggeredNormal, epsilon, project,
                     register_hop_kernel)
from solvers import staggered as stg

from solver_testlib import free_links, random_field, random_links, random_matrices, rel, vdot


def reference_dslash(geom, fat, long, psi):
    """D psi straight from docs/conventions.md 1.6, no precomputation."""
    out = np.zeros_like(psi)
    mv = lambda u, v: (u @ v[..., None])[..., 0]
    for mu in range(4):
        out += mv(fat[mu], geom.shift(psi, mu, 1))
        out -= mv(su3.dagger(geom.shift(fat[mu], mu, -1)), geom.shift(psi, mu, -1))
        if long is not None:
            out += mv(long[mu], geom.shift(psi, mu, 3))
            out -= mv(su3.dagger(geom.shift(long[mu], mu, -3)), geom.shift(psi, mu, -3))
    return out


@pytest.mark.parametrize("naik", [True, False])
def test_dslash_matches_formula(geom4, naik):
    rng = np.random.default_rng(1)
    fat, long = random_matrices(geom4, rng), random_matrices(geom4, rng)
    long = long if naik else None
    d = StaggeredDslash(geom4, fat, long)
    psi = random_field(geom4, rng)
    assert rel(d(psi), reference_dslash(geom4, fat, long, psi)) < 1e-14
    assert d.flops == (1146 if naik else 570) * geom4.volume


def test_dslash_on_asymmetric_lattice():
    """Direction bookkeeping: a 4x6x2x8 lattice (x, y, z, t) catches any mixed-up axis."""
    geom = Geometry((4, 6, 2, 8))
    rng = np.random.default_rng(2)
    fat, long = random_matrices(geom, rng), random_matrices(geom, rng)
    psi = random_field(geom, rng)
    assert rel(StaggeredDslash(geom, fat, long)(psi), reference_dslash(geom, fat, long, psi)) < 1e-14


def test_antihermitian(geom4):
    """<phi, D psi> = -<D phi, psi> for arbitrary complex link matrices; adjoint() is -D."""
    rng = np.random.default_rng(3)
    d = StaggeredDslash(geom4, random_matrices(geom4, rng), random_matrices(geom4, rng))
    phi, psi = random_field(geom4, rng), random_field(geom4, rng)
    lhs, rhs = vdot(phi, d(psi)), -vdot(d(phi), psi)
    assert abs(lhs - rhs) < 1e-13 * abs(lhs)
    assert rel(d.adjoint()(phi), -d(phi)) == 0.0
    assert abs(vdot(phi, d(psi)) - vdot(d.adjoint()(phi), psi)) < 1e-13 * abs(lhs)


def test_even_to_odd(geom4):
    """D maps even-site fields to odd-site fields and back; D = D_eo + D_oe block by block."""
    rng = np.random.default_rng(4)
    fat, long = random_links(geom4)
    d = StaggeredDslash(geom4, fat, long)
    par = geom4.parity()[..., None]
    psi = random_field(geom4, rng)
    pe, po = project(psi, geom4, 0), project(psi, geom4, 1)
    de = d(pe)
    assert np.all(de[np.broadcast_to(par == 0, de.shape)] == 0)        # exactly zero on even sites
    assert np.all(d(po)[np.broadcast_to(par == 1, de.shape)] == 0)
    d_eo, d_oe = ParityHop(d, 0), ParityHop(d, 1)
    assert rel(d_oe(psi), de) < 1e-15                 # D_oe reads only the even part of its input
    assert rel(d_eo(psi) + d_oe(psi), d(psi)) < 1e-15
    # (D_eo)^dag = -D_oe
    phi = random_field(geom4, rng)
    assert abs(vdot(phi, d_eo(psi)) - vdot(d_eo.adjoint()(phi), psi)) < 1e-13 * abs(vdot(phi, d_eo(psi)))


def test_eps_d_eps(geom4):
    rng = np.random.default_rng(5)
    d = StaggeredDslash(geom4, random_matrices(geom4, rng), random_matrices(geom4, rng))
    eps = epsilon(geom4)
    psi = random_field(geom4, rng)
    assert rel(eps * d(eps * psi), -d(psi)) < 1e-15


def test_matrix_and_normal_operators(geom4):
    """M = 2m + D, M^dag = 2m - D, M^dag M = 4m^2 - D^2, and on even sites A_m = 4m^2 - D_eo D_oe = (M^dag M)_ee."""
    rng = np.random.default_rng(6)
    fat, long = random_links(geom4)
    d = StaggeredDslash(geom4, fat, long)
    m = 0.137
    M = d.matrix(m)
    psi, phi = random_field(geom4, rng), random_field(geom4, rng)
    assert rel(M(psi), 2 * m * psi + d(psi)) < 1e-15
    assert rel(M.adjoint()(psi), 2 * m * psi - d(psi)) < 1e-15
    assert abs(vdot(phi, M(psi)) - vdot(M.adjoint()(phi), psi)) < 1e-13 * abs(vdot(phi, M(psi)))
    nrm = M.normal()
    assert isinstance(nrm, StaggeredNormal) and nrm.hermitian
    assert rel(nrm(psi), M.adjoint()(M(psi))) < 1e-14
    eo = d.even_odd(m)
    a = eo.normal
    pe = project(psi, geom4, 0)
    assert rel(a(psi), nrm(pe)) < 1e-14                       # the odd part of the input is ignored
    assert rel(a(pe), 4 * m * m * pe - eo.D_eo(eo.D_oe(pe))) < 1e-14
    assert np.all(a(psi)[np.broadcast_to(geom4.parity()[..., None] == 1, psi.shape)] == 0)
    q = vdot(pe, a(pe))
    assert abs(q.imag) < 1e-12 * q.real and q.real > 4 * m * m * vdot(pe, pe).real
    assert a.flops == (2 * 1146 + 12) * geom4.volume / 2 and a.sites == geom4.volume // 2
    # MILC's ks_multicg_mass: the massless operator shifted by 4 m^2 is A_m
    assert rel(d.even_odd(0.0).normal.shifted(4 * m * m)(pe), a(pe)) < 1e-14
    # odd-parity version
    ao = EvenOddNormal(d, m, parity=1)
    po = project(psi, geom4, 1)
    assert rel(ao(po), nrm(po)) < 1e-14


def _dense(op, geom, sites):
    """Dense matrix of ``op`` restricted to the given flat site indices (3 colours each)."""
    n = len(sites) * 3
    out = np.empty((n, n), dtype=np.complex128)
    for col, (s, c) in enumerate(itertools.product(sites, range(3))):
        e = np.zeros(geom.shape + (3,), dtype=np.complex128)
        e.reshape(-1, 3)[s, c] = 1.0
        out[:, col] = op(e).reshape(-1, 3)[sites].ravel()
    return out


def free_spectrum(geom, c1, cn, antiperiodic):
    """Eigenvalues of -D^2 = D^dag D for the free HISQ operator: sum_mu (2 c1 sin p_mu + 2 cn sin 3p_mu)^2 with
    p_mu = 2 pi n / L_mu, and p_t = (2n + 1) pi / L_t for antiperiodic time, 3 colours each."""
    ps = [2 * np.pi * np.arange(n) / n for n in geom.dims]
    if antiperiodic:
        ps[3] = ps[3] + np.pi / geom.dims[3]
    f = [(2 * c1 * np.sin(p) + 2 * cn * np.sin(3 * p)) ** 2 for p in ps]
    lam = f[0][:, None, None, None] + f[1][None, :, None, None] + f[2][None, None, :, None] + f[3][None, None, None, :]
    return np.sort(np.repeat(lam.ravel(), 3))


@pytest.mark.parametrize("antiperiodic", [True, False])
def test_free_field_spectrum(geom4, antiperiodic):
    """Unit gauge with MILC's phases, c1 = 9/8, Naik -1/24: the spectrum of D^dag D = -D^2 (full lattice) and of
    -D_eo D_oe (even sites; the same eigenvalues with half the multiplicity) against the momentum-space formula."""
    c1, cn = 9 / 8, -1 / 24
    fat, long = free_links(geom4, c1, cn, antiperiodic)
    d = StaggeredDslash(geom4, fat, long)
    expect = free_spectrum(geom4, c1, cn, antiperiodic)
    dm = _dense(d, geom4, np.arange(geom4.volume))            # the 768 x 768 matrix of D
    assert np.abs(dm + dm.conj().T).max() < 1e-15             # anti-Hermitian
    even = np.repeat(3 * np.where(geom4.parity().ravel() == 0)[0], 3) + np.tile(np.arange(3), geom4.volume // 2)
    odd = np.setdiff1d(np.arange(3 * geom4.volume), even)
    d2 = dm @ dm
    assert np.abs(d2[np.ix_(even, odd)]).max() == 0           # D^2 does not mix parities
    # -D^2 is block diagonal: its spectrum is that of -D_eo D_oe (even) and of -D_oe D_eo (odd)
    ev = np.linalg.eigvalsh(-d2[np.ix_(even, even)])
    od = np.linalg.eigvalsh(-d2[np.ix_(odd, odd)])
    full = np.sort(np.concatenate([ev, od]))
    assert np.abs(full - expect).max() < 1e-12 * expect.max()
    assert np.abs(ev - expect[::2]).max() < 1e-12 * expect.max()   # even block: each eigenvalue, half as often
    # the even-odd operator itself is that block (checked on 8 even sites)
    a = _dense(d.even_odd(0.0).normal, geom4, np.where(geom4.parity().ravel() == 0)[0][:8])
    assert np.abs(a + d2[np.ix_(even, even)][:24, :24]).max() < 1e-14
    if antiperiodic:
        assert ev.min() > 0.1          # antiperiodic time: no zero modes in the free theory
    print(f"\nfree spectrum ({'anti' if antiperiodic else ''}periodic t): max deviation "
          f"{np.abs(full - expect).max():.1e} (full), {np.abs(ev - expect[::2]).max():.1e} (even)")


def test_single_precision_operator(geom6):
    rng = np.random.default_rng(7)
    fat, long = random_links(geom6)
    d = StaggeredDslash(geom6, fat, long)
    s = d.converted(np.complex64)
    assert s.dtype == np.complex64 and s.precision == "single" and d.precision == "double"
    assert d.converted(np.complex64) is s and s.converted(np.complex128) is not None
    psi = random_field(geom6, rng)
    out = s(psi.astype(np.complex64))
    assert out.dtype == np.complex64
    assert rel(out, d(psi)) < 1e-6
    for op in (d.even_odd(0.05).normal, d.matrix(0.05), d.matrix(0.05).normal()):
        o32 = op.converted(np.complex64)
        assert o32.dtype == np.complex64 and o32.flops == op.flops
        assert rel(o32(psi.astype(np.complex64)), op(psi)) < 1e-6
    sd = StaggeredDslash(geom6, fat, long, dtype=np.complex64)
    assert rel(sd(psi), d(psi)) < 1e-6


def test_links_and_fields_are_checked(geom4):
    fat, long = random_links(geom4)
    with pytest.raises(ValueError, match="expected"):
        StaggeredDslash(geom4, fat[:, :2], long)
    d = StaggeredDslash(geom4, fat, long)
    with pytest.raises(ValueError, match="nt, nz, ny, nx, 3"):
        d(np.zeros((4, 4, 4, 4, 2), dtype=complex))
    with pytest.raises(ZeroDivisionError):
        d.even_odd(0.0).reconstruct(np.zeros(geom4.shape + (3,)), np.zeros(geom4.shape + (3,)))


def test_set_links_reloads(geom4):
    """After set_links, D, its adjoint, M^dag and the conversions (the same objects: their links follow) all use the
    new links."""
    rng = np.random.default_rng(8)
    fat, long = random_links(geom4)
    d = StaggeredDslash(geom4, fat, long)
    dag, mdag, eo = d.adjoint(), d.matrix(0.1).adjoint(), d.even_odd(0.1)
    s = d.converted(np.complex64)
    fat2, long2 = random_matrices(geom4, rng), random_matrices(geom4, rng)
    d.set_links(fat2, long2)
    psi = random_field(geom4, rng)
    ref = reference_dslash(geom4, fat2, long2, psi)
    assert rel(d(psi), ref) < 1e-14 and rel(dag(psi), -ref) < 1e-14
    assert rel(mdag(psi), 0.2 * psi - ref) < 1e-14
    assert rel(eo.D_oe(psi), project(ref, geom4, 1)) < 1e-14
    # single: rounding 1e-7, or its Naik links in 16 bits (the default; these random Naik links are as large as
    # the fat ones, so their rounding, 2^-16 of a link's largest entry, shows at ~1e-5)
    single = 1e-6 if s.half_links == "off" else 5e-5
    assert d.converted(np.complex64) is s and rel(s(psi), ref) < single
    assert rel(eo.normal.converted(np.complex64)(psi), eo.normal(psi)) < single
    d.set_links(fat, None)                              # also from Naik to one-link
    assert d.flops == 570 * geom4.volume and dag.flops == d.flops and len(dag.hops) == 8
    assert rel(dag(psi), -reference_dslash(geom4, fat, None, psi)) < 1e-14


def test_kernel_switch_in_one_place(geom4, monkeypatch):
    """A kernel registered for the backend replaces the NumPy body of hop() for every operator built on D."""
    calls = []

    def factory(dslash):
        def hop(psi, parity, out, a, x, b):
            calls.append(parity)
            return dslash._hop_numpy(psi, parity, out, a, x, b)
        return hop

    monkeypatch.setitem(stg._HOP_KERNELS, geom4.backend.name, factory)
    fat, long = random_links(geom4)
    d = StaggeredDslash(geom4, fat, long)
    psi = random_field(geom4, np.random.default_rng(9))
    d.even_odd(0.1).normal(psi)
    assert calls == [1, 0]
    monkeypatch.delitem(stg._HOP_KERNELS, geom4.backend.name)
    assert StaggeredDslash(geom4, fat, long)._hop_impl.__name__ == "_hop_numpy"
    assert register_hop_kernel is stg.register_hop_kernel
