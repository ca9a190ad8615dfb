"""The HISQ smearing and force kernels (force/hisq_cuda.py) equal their NumPy twins (run on the device:
pytest -m gpu). Each kernel is compared with the array code on the CPU, on smooth unitary and on non-unitary
complex fields of an asymmetric lattice, and the whole chain (links, force with two Naik epsilons) on top."""
import numpy as np
import pytest

from force import hisq_cuda, smearing as sm, smearing_derivative as sd
from force.hisq_force import add_outer_products, hisq_force_terms, momentum_derivative
from force.hisq_links import hisq_links_multi
from force.unitarize import ANALYTIC_EPS, SVD_ABS_ERROR, SVD_REL_ERROR, u3_unitarize
from force.unitarize_derivative import u3_unitarize_vjp
from lattice import CounterRNG, GaugeField, Geometry, get_backend, su3
from tests.conftest import FIXTURES

pytestmark = pytest.mark.gpu

DIMS = (4, 6, 4, 8)
TOL = 1e-12


def smooth(geom, seed, eps=0.4):
    rng = CounterRNG(seed)
    w = rng.gaussian("s", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    p = geom.xp.moveaxis(su3.algebra_from_coefficients(eps * w), -3, 0)
    return geom.xp.ascontiguousarray(su3.expm_su3(p))


def noise(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


@pytest.fixture(scope="module")
def geoms():
    return Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, get_backend("cupy"))


def close(got, ref, tol=TOL):
    got = get_backend("cupy").to_numpy(got)
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()


def fields(geom):
    u = smooth(geom, 3)
    return {"unitary": u, "complex": u + 0.2 * noise(u.shape, 5)}


@pytest.mark.parametrize("kind", ["unitary", "complex"])
@pytest.mark.parametrize("name", ["fat7", "level2", "asqtad"])
def test_fat_link_and_vjp(geoms, kind, name):
    c = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}[name]
    cpu, gpu = geoms
    links = fields(cpu)[kind]
    d = noise(links.shape, 7)
    assert hisq_cuda.active(gpu)
    close(sm.fat_link(gpu, gpu.xp.asarray(links), c), sm.fat_link(cpu, links, c))
    close(sd.fat_link_vjp(gpu, gpu.xp.asarray(links), c, gpu.xp.asarray(d)), sd.fat_link_vjp(cpu, links, c, d))


def test_naik_and_momentum(geoms):
    cpu, gpu = geoms
    w = fields(cpu)["complex"]
    d = noise(w.shape, 9)
    wg, dg = gpu.xp.asarray(w), gpu.xp.asarray(d)
    close(sm.naik_link(gpu, wg, -1 / 24), sm.naik_link(cpu, w, -1 / 24))
    close(sd.naik_link_vjp(gpu, wg, -1 / 24, dg), sd.naik_link_vjp(cpu, w, -1 / 24, d))
    out = dg.copy()
    hisq_cuda.naik_link_vjp(gpu, wg, -1 / 24, dg, out=out)
    close(out, sd.naik_link_vjp(cpu, w, -1 / 24, d) + d)
    close(momentum_derivative(wg, dg), momentum_derivative(w, d))


def test_u3_unitarize_with_svd_fallback(geoms):
    cpu, gpu = geoms
    v = sm.fat_link(cpu, smooth(cpu, 11), sm.FAT7)
    v[0, 0, 0, 0, 0] = v[0, 0, 0, 0, 0] @ np.diag([1.0, 1.0, 1e-5])  # |det|^2 < abs error: SVD
    v[1, 0, 0, 0, 1] = np.diag([1.0, 1.0, 1e-6])             # badly conditioned
    v[2, 1, 0, 0, 0] = 0.5 * np.eye(3)                       # degenerate eigenvalues
    for allow in (True, False):
        if not allow:
            v = v[:, 1:]                                      # no singular matrix without the fallback
        w_ref, info_ref = u3_unitarize(v, allow_svd=allow)
        w, info = u3_unitarize(gpu.xp.asarray(v), allow_svd=allow)
        close(w, w_ref, 1e-11)
        assert info.n_svd == info_ref.n_svd and (info.n_svd > 0) == allow
        assert abs(info.min_eigenvalue - info_ref.min_eigenvalue) <= 1e-12 * max(1.0, info_ref.min_eigenvalue)
    # and the kernel alone against the analytic formula
    _, svd, gmin = hisq_cuda.u3_unitarize(gpu.backend, gpu.xp.asarray(v), True, SVD_REL_ERROR, SVD_ABS_ERROR,
                                          ANALYTIC_EPS)
    assert not bool(svd.any())


@pytest.mark.parametrize("force_filter", [None, 5e-5, 0.05])
def test_u3_vjp(geoms, force_filter):
    cpu, gpu = geoms
    v = sm.fat_link(cpu, smooth(cpu, 13, 0.8), sm.FAT7)
    d = noise(v.shape, 17)
    ref, info_ref = u3_unitarize_vjp(v, d, force_filter)
    got, info = u3_unitarize_vjp(gpu.xp.asarray(v), gpu.xp.asarray(d), force_filter)
    close(got, ref)
    assert info.n_filtered == info_ref.n_filtered and info.n == info_ref.n
    if force_filter == 0.05:
        assert 0 < info.n_filtered < info.n


def test_links_and_force_chain(geoms):
    """hisq_links_multi and hisq_force_terms with two epsilon groups: GPU (kernels) = CPU, and the kernels =
    the array code run on CuPy."""
    cpu, gpu = geoms
    u = smooth(cpu, 19, 0.6)
    uc, ug = GaugeField(cpu, u), GaugeField(gpu, gpu.xp.asarray(u))
    eps = [0.0, -0.35]
    ref_links = hisq_links_multi(uc, eps)
    got_links = hisq_links_multi(ug, eps)
    for r, g in zip(ref_links, got_links):
        close(g.fat, r.fat)
        close(g.long, r.long)
    fat = {e: noise(u.shape, 23 + k) for k, e in enumerate(eps)}
    long = {e: noise(u.shape, 29 + k) for k, e in enumerate(eps)}
    ref = hisq_force_terms(uc, fat, long, links=ref_links[0])
    as_gpu = lambda f: {e: gpu.xp.asarray(x) for e, x in f.items()}
    got = hisq_force_terms(ug, as_gpu(fat), as_gpu(long), links=got_links[0])
    for name in ("d_w", "d_v", "d_u", "pdot"):
        close(getattr(got, name), getattr(ref, name))
    assert got.filter.n_filtered == ref.filter.n_filtered
    old = hisq_cuda.set_enabled(False)
    try:
        twin = hisq_force_terms(ug, as_gpu(fat), as_gpu(long), links=got_links[0])
    finally:
        hisq_cuda.set_enabled(old)
    close(twin.pdot, ref.pdot)


def test_links_on_milc_lattice():
    path = FIXTURES / "lat.sample.l6666.hisq"
    if not path.exists():
        pytest.skip(f"MILC fixture {path} is absent")
    from lattice.io import read_gauge

    uc, _ = read_gauge(str(path), backend="numpy", reunitarize=True)
    ug, _ = read_gauge(str(path), backend="cupy", reunitarize=True)
    for r, g in zip(hisq_links_multi(uc, [0.0, -0.1]), hisq_links_multi(ug, [0.0, -0.1])):
        close(g.fat, r.fat)
        close(g.long, r.long)


def test_jacobi_eigen_decomposition(geoms):
    """The in-kernel Jacobi solver of u3_vjp: A = E diag(g) E^dag with E unitary, also for (nearly) degenerate
    and diagonal matrices, and the eigenvalues of numpy.linalg.eigvalsh."""
    _, gpu = geoms
    rng = np.random.default_rng(3)
    m = rng.normal(size=(2000, 3, 3)) + 1j * rng.normal(size=(2000, 3, 3))
    a = su3.dagger(m) @ m
    a[0] = 2 * np.eye(3)
    a[1] = np.diag([1.0, 1.0, 3.0])
    a[2] = np.diag([3.0, 2.0, 1.0])
    a[3] = np.eye(3) + 1e-12 * a[4]
    a[5] = 1e-3 * a[6] + 5.0 * np.eye(3)
    g, e = (get_backend("cupy").to_numpy(x) for x in hisq_cuda.eig_herm(gpu.backend, gpu.xp.asarray(a)))
    assert np.abs((e * g[..., None, :]) @ su3.dagger(e) - a).max() <= 1e-14 * np.abs(a).max()
    assert np.abs(su3.dagger(e) @ e - np.eye(3)).max() <= 1e-14
    assert np.abs(np.sort(g, axis=-1) - np.linalg.eigvalsh(a)).max() <= 1e-14 * np.abs(a).max()


def test_outer_products(geoms):
    cpu, gpu = geoms
    g = np.random.default_rng(11)
    zs = [g.normal(size=cpu.shape + (3,)) + 1j * g.normal(size=cpu.shape + (3,)) for _ in range(7)]
    c = g.normal(size=7)
    shape = (4,) + cpu.shape + (3, 3)
    f0, l0 = g.normal(size=shape) + 0j, g.normal(size=shape) + 0j
    f_ref, l_ref = f0.copy(), l0.copy()
    add_outer_products(cpu, zs, c, f_ref, l_ref)
    f, l = gpu.xp.asarray(f0), gpu.xp.asarray(l0)
    add_outer_products(gpu, [gpu.xp.asarray(z) for z in zs], c, f, l)
    close(f, f_ref)
    close(l, l_ref)
