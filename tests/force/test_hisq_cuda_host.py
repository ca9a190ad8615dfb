"""The CUDA kernels of force/hisq_cuda.py compiled for the host (tests/force/cuda_host.py: g++ and a small CUDA
shim) equal the NumPy twins: the kernels' arithmetic and neighbour indexing are checked on every CI run, without
a GPU (tests/force/test_hisq_gpu.py repeats the comparison on the device)."""
import numpy as np
import pytest

from force import hisq_cuda, smearing as sm, smearing_derivative as sd
from force.hisq_force import add_outer_products, momentum_derivative
from force.unitarize import ANALYTIC_EPS, SVD_ABS_ERROR, SVD_REL_ERROR, eigenvalues_analytic, u3_unitarize
from force.unitarize_derivative import u3_unitarize_vjp
from lattice import CounterRNG, Geometry, get_backend, su3
from lattice.backend import Backend

from tests.force.cuda_host import FakeCuPy, compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="needs g++ to compile the kernels for the host")

DIMS = (4, 6, 4, 8)
TOL = 1e-13


@pytest.fixture(scope="module")
def geoms():
    return Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, Backend("cupy", FakeCuPy()))


def close(got, ref, tol=TOL):
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()


def fields(geom, seed=3):
    rng = CounterRNG(seed)
    w = rng.gaussian("s", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    u = np.ascontiguousarray(su3.expm_su3(np.moveaxis(su3.algebra_from_coefficients(0.5 * w), -3, 0)))
    g = np.random.default_rng(seed)
    noise = lambda: g.normal(size=u.shape) + 1j * g.normal(size=u.shape)
    return u, u + 0.2 * noise(), noise()


@pytest.mark.parametrize("name", ["fat7", "level2", "asqtad"])
def test_staple_kernels(geoms, name):
    c = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}[name]
    cpu, host = geoms
    assert hisq_cuda.active(host)
    u, v, d = fields(cpu)
    for links in (u, v):
        close(sm.fat_link(host, links, c), sm.fat_link(cpu, links, c))
        close(sd.fat_link_vjp(host, links, c, d), sd.fat_link_vjp(cpu, links, c, d))


def test_naik_and_ta(geoms):
    cpu, host = geoms
    _, v, d = fields(cpu, 5)
    close(sm.naik_link(host, v, -1 / 24), sm.naik_link(cpu, v, -1 / 24))
    close(sd.naik_link_vjp(host, v, -1 / 24, d), sd.naik_link_vjp(cpu, v, -1 / 24, d))
    out = d.copy()
    hisq_cuda.naik_link_vjp(host, v, -1 / 24, d, out=out)
    close(out, sd.naik_link_vjp(cpu, v, -1 / 24, d) + d)
    close(hisq_cuda.ta_product(host.backend, v, d), momentum_derivative(v, d))


def test_u3_kernels(geoms):
    cpu, host = geoms
    u, _, d = fields(cpu, 7)
    v = sm.fat_link(cpu, u, sm.FAT7)
    v[2, 1, 0, 0, 0] = 0.5 * np.eye(3)                                 # degenerate eigenvalues
    v[1, 0, 0, 1, 0] = v[1, 0, 0, 1, 0] @ np.diag([1.0, 1.0, 1e-5])   # SVD fallback
    w_ref, info = u3_unitarize(v)
    w, svd, gmin = hisq_cuda.u3_unitarize(host.backend, v, True, SVD_REL_ERROR, SVD_ABS_ERROR, ANALYTIC_EPS)
    assert int(svd.sum()) == info.n_svd == 1 and svd[1, 0, 0, 1, 0]
    close(w[~svd], w_ref[~svd], 1e-12)
    g_ref = eigenvalues_analytic(su3.dagger(v) @ v)[0].min(axis=-1)
    assert np.abs(gmin - g_ref).max() <= 1e-13
    for force_filter in (None, 5e-5, 0.05):
        ref, info = u3_unitarize_vjp(v, d, force_filter)
        got, mask, gmin = hisq_cuda.u3_vjp(host.backend, v, d, force_filter)
        close(got, ref, 1e-11)
        assert int(mask.sum()) == info.n_filtered
    assert 0 < info.n_filtered < info.n


def test_jacobi_eigen_decomposition(geoms):
    _, host = geoms
    rng = np.random.default_rng(3)
    m = rng.normal(size=(500, 3, 3)) + 1j * rng.normal(size=(500, 3, 3))
    a = su3.dagger(m) @ m
    a[0] = 2 * np.eye(3)
    a[1] = np.diag([1.0, 1.0, 3.0])
    a[2] = np.diag([3.0, 2.0, 1.0])
    a[3] = np.eye(3) + 1e-12 * a[4]
    a[5] = 1e-3 * a[6] + 5.0 * np.eye(3)
    g, e = hisq_cuda.eig_herm(host.backend, a)
    assert np.abs((e * g[..., None, :]) @ su3.dagger(e) - a).max() <= 1e-14 * np.abs(a).max()
    assert np.abs(su3.dagger(e) @ e - np.eye(3)).max() <= 1e-14
    assert np.abs(np.sort(g, axis=-1) - np.linalg.eigvalsh(a)).max() <= 1e-14 * np.abs(a).max()


def test_outer_products(geoms):
    cpu, host = geoms
    g = np.random.default_rng(11)
    zs = [g.normal(size=cpu.shape + (3,)) + 1j * g.normal(size=cpu.shape + (3,)) for _ in range(5)]
    c = g.normal(size=5)
    shape = (4,) + cpu.shape + (3, 3)
    f0, l0 = g.normal(size=shape) + 0j, g.normal(size=shape) + 0j
    f_ref, l_ref = f0.copy(), l0.copy()
    add_outer_products(cpu, zs, c, f_ref, l_ref)
    f, l = f0.copy(), l0.copy()
    add_outer_products(host, zs, c, f, l)
    close(f, f_ref)
    close(l, l_ref)
