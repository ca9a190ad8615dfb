"""The CUDA hop kernel equals its NumPy twin, and GPU solves equal CPU solves (run on the device: pytest -m gpu)."""
import numpy as np
import pytest

from lattice import CounterRNG, Geometry, get_backend
from solvers import StaggeredDslash, cg, even_odd_inverse, mixed_cg, multishift_cg
from tests.conftest import FIXTURES

pytestmark = pytest.mark.gpu


def random_links(geom, seed, scale):
    g = CounterRNG(seed).gaussian("l", geom.site_ids(), 4 * 18).reshape(geom.shape + (4, 3, 3, 2))
    return geom.xp.ascontiguousarray(geom.xp.moveaxis((g[..., 0] + 1j * g[..., 1]) * scale, -3, 0))


def random_vector(geom, seed):
    g = CounterRNG(seed).gaussian("v", geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    return g[..., 0] + 1j * g[..., 1]


def pair(dims):
    return Geometry(dims, get_backend("numpy")), Geometry(dims, get_backend("cupy"))


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("dims", [(4, 4, 4, 4), (6, 4, 8, 10), (8, 8, 8, 8)])
@pytest.mark.parametrize("naik", [True, False])
def test_hop_kernel_equals_twin(dims, naik):
    cpu, gpu = pair(dims)
    out = {}
    for geom in (cpu, gpu):
        fat, long = random_links(geom, 1, 0.3), random_links(geom, 2, 0.05)
        d = StaggeredDslash(geom, fat, long if naik else None)
        psi, x = random_vector(geom, 3), random_vector(geom, 4)
        res = []
        for p in (0, 1):
            res.append(geom.backend.to_numpy(d.hop(psi, p)))
            res.append(geom.backend.to_numpy(d.hop(psi, p, a=0.37, x=x, b=-1.0)))
            res.append(geom.backend.to_numpy(d.adjoint().hop(psi, p)))
        d32 = d.converted(np.complex64)
        res32 = [geom.backend.to_numpy(d32.hop(psi.astype(np.complex64), p, a=0.2, x=x.astype(np.complex64)))
                 for p in (0, 1)]
        out[geom.backend.name] = (res, res32)
    for a, b in zip(out["cupy"][0], out["numpy"][0]):
        assert rel(a, b) < 1e-13
    for a, b in zip(out["cupy"][1], out["numpy"][1]):
        assert rel(a, b) < 1e-6


def test_compact_hop_equals_full_bitwise():
    """The kernel's parity-compact mode (psi, out, x of one parity in checkerboard order) gives the full-lattice
    mode's numbers on the parity's sites, bit for bit, in both precisions and for D^dag."""
    from solvers.staggered import parity_sites

    _, gpu = pair((6, 4, 8, 10))
    xp = gpu.xp
    d = StaggeredDslash(gpu, random_links(gpu, 1, 0.3), random_links(gpu, 2, 0.05))
    for dd in (d, d.adjoint(), d.converted(np.complex64)):
        assert dd.has_compact
        psi, x = (random_vector(gpu, s).astype(dd.dtype) for s in (3, 4))
        for p in (0, 1):
            on, off = parity_sites(gpu, p), parity_sites(gpu, 1 - p)
            for a in (0.0, 0.37):
                full = dd.hop(psi, p, a=a, x=x, b=-1.0)
                got = dd.hop(xp.ascontiguousarray(psi.reshape(-1, 3)[off]), p, a=a,
                             x=xp.ascontiguousarray(x.reshape(-1, 3)[on]), b=-1.0, compact=True)
                assert bool((got == full.reshape(-1, 3)[on]).all()), (dd.dtype, p, a)


def test_gpu_uses_the_kernel():
    from solvers.staggered_cuda import CudaHop

    _, gpu = pair((4, 4, 4, 4))
    d = StaggeredDslash(gpu, random_links(gpu, 1, 0.3), random_links(gpu, 2, 0.05))
    assert isinstance(d._hop_impl, CudaHop)


def test_hisq_links_on_milc_lattice_and_solves():
    path = FIXTURES / "lat.sample.l6666.hisq"
    if not path.exists():
        pytest.skip(f"MILC fixture {path} is absent")
    from force.hisq_links import hisq_links
    from lattice.io import read_gauge

    sols = {}
    for name in ("numpy", "cupy"):
        u, _ = read_gauge(str(path), backend=name, reunitarize=True)
        geom = u.geom
        fl = hisq_links(u)
        d = StaggeredDslash(geom, fl.fat, fl.long)
        b = random_vector(geom, 9)
        M = d.even_odd(0.05)
        x, st = even_odd_inverse(M, cg(1e-10)).solve(b)
        assert st.true_residual <= 1e-10
        xm = even_odd_inverse(M, mixed_cg(1e-10))(b)
        xs = multishift_cg([0.01, 0.1, 1.0], 1e-10)(d.even_odd(0.0).normal)(M.prepare(b))
        sols[name] = [geom.backend.to_numpy(v) for v in [fl.fat, fl.long, x, xm] + list(xs)]
    for a, b in zip(sols["cupy"], sols["numpy"]):
        assert rel(a, b) < 1e-9
