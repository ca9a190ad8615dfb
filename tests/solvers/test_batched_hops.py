"""The refinement's starting true residuals with the shifts' products batched (``batched_hops``,
HMC_BATCHED_HOPS): ``StaggeredDslash.hop_many`` / ``CudaHop.many`` (one launch of ``hop_many``, each hop's links
loaded once for up to 4 fields) give the numbers of one hop each, bitwise on the host build of the kernel, and the
mixed-precision multishift with the batched residuals makes the same refinement solves as without. No GPU."""
from __future__ import annotations

import numpy as np
import pytest

from comms.config import RunConfig
from lattice import Geometry
from lattice.backend import Backend
from solvers import StaggeredDslash, multishift_cg
from solvers.multishift import true_residuals
from solvers.staggered_cuda import CudaHop
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_field, random_links

DIMS = (4, 4, 4, 6)
SHIFTS = (2e-3, 1e-2, 0.05, 0.3, 1.5)


def _batched(on: bool, half: str = "naik") -> RunConfig:
    return RunConfig.resolve(cli={"batched_hops": on, "dslash_half_links": half}, env={})


def _links(seed=5):
    fat, long = random_links(Geometry(DIMS), seed=seed)
    return np.asarray(fat), np.asarray(long)


def _fields(n, dtype, seed=1):
    rng = np.random.default_rng(seed)
    return [np.ascontiguousarray(random_field(Geometry(DIMS), rng, dtype)) for _ in range(n)]


@needs_gxx
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("nvec", [2, 4, 5, 9])
@pytest.mark.parametrize("half", ["off", "naik"])
def test_hop_many_is_one_hop_each_bitwise(dtype, nvec, half):
    """Both parities, with and without the a x term, across the kernel's chunks of 4 fields (5 and 9 fields: a
    partial last chunk), compressed Naik links included (double, and single with half_links off); single with the
    Naik links in 16 bits (the default)."""
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=_batched(True, half))
    d = StaggeredDslash(host, *_links()).converted(dtype)
    rounded = half == "naik" and dtype == np.complex64
    assert isinstance(d._hop_impl, CudaHop) and d.links_compressed != rounded
    assert d.half_links == ("naik" if rounded else "off")
    psis, xs = _fields(nvec, dtype, 2), _fields(nvec, dtype, 3)
    for parity in (0, 1):
        for a, x in ((0.0, None), (0.37, xs)):
            got = d.hop_many(psis, parity, a=a, xs=x, b=-1.0)
            want = [d.hop(p, parity, a=a, x=None if x is None else x[k], b=-1.0) for k, p in enumerate(psis)]
            assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("backend", ["numpy", pytest.param("host", marks=needs_gxx)])
def test_apply_many_is_the_operator_on_each_field(backend):
    be = Backend("cupy", FakeCuPy()) if backend == "host" else Backend("numpy", np)
    A = StaggeredDslash(Geometry(DIMS, be, config=_batched(True)), *_links()).even_odd(0.0).normal
    psis = _fields(5, np.complex128, 4)
    got = A.apply_many(psis)
    assert all(np.array_equal(g, A(p)) for g, p in zip(got, psis))


def _refined(batched: bool, backend):
    geom = Geometry(DIMS, backend, config=_batched(batched))
    xp = geom.xp
    A = StaggeredDslash(geom, *(xp.asarray(u) for u in _links(7))).even_odd(0.0).normal
    b = A(xp.asarray(_fields(1, np.complex128, 8)[0]))  # a source on the operator's parity (zero elsewhere)
    inv = multishift_cg(SHIFTS, 1e-8, 4000).mixed_precision()(A)
    return inv.solve(b)


def test_batched_residuals_give_the_same_refinement():
    """cgprec 1's refinement (single-precision multishift, then a mixed CG per shift) from the batched residuals:
    the same solutions bitwise, the same iterations, products and true residuals per shift (NumPy: the batched
    products are one product each there; the kernel's batch is the test above)."""
    be = Backend("numpy", np)
    (x0, s0), (x1, s1) = _refined(False, be), _refined(True, be)
    assert all(np.array_equal(a, c) for a, c in zip(x0, x1))
    r0, r1 = s0.extra["refine"], s1.extra["refine"]
    assert [r.iters for r in r0] == [r.iters for r in r1] and sum(r.iters for r in r0) > 0
    assert [r.matvecs for r in r0] == [r.matvecs for r in r1]
    assert [r.milc_iters for r in r0] == [r.milc_iters for r in r1]
    assert s0.true_residuals == s1.true_residuals and s1.converged


def test_true_residuals_are_the_shifted_operators():
    geom = Geometry(DIMS)
    A = StaggeredDslash(geom, *_links()).even_odd(0.0).normal
    xs = [x.astype(np.complex64) for x in _fields(3, np.complex128, 9)]
    b = _fields(1, np.complex128, 10)[0]
    xds, rs = true_residuals(A, b, xs, SHIFTS[:3])
    for x, xd, r, s in zip(xs, xds, rs, SHIFTS):
        assert xd.dtype == np.complex128 and np.array_equal(xd, x.astype(np.complex128))
        assert np.array_equal(r, b - A.shifted(s)(xd))


def test_the_refinement_from_given_residuals_is_the_refinement():
    """ShiftByShift from the batched residuals (what RefinedShiftInverse runs) against each CG making its own
    starting residual from x_i: the same solutions bitwise and the same counts."""
    from solvers import cg, mixed_precision
    from solvers.multishift import ShiftByShift

    geom = Geometry(DIMS)
    A = StaggeredDslash(geom, *_links(7)).even_odd(0.0).normal
    b = A(_fields(1, np.complex128, 8)[0])
    xs, _ = multishift_cg(SHIFTS, 1e-4, 4000)(A.converted(np.complex64)).solve(b.astype(np.complex64))
    refine = ShiftByShift(A, SHIFTS, mixed_precision(cg(1e-8, 4000, raise_on_fail=False)), raise_on_fail=False)
    own, s_own = refine.solve(b, xs, check=False)
    given, s_given = refine.solve_from_residuals(b, *true_residuals(A, b, xs, SHIFTS))
    assert all(np.array_equal(a, c) for a, c in zip(own, given))
    for r0, r1 in zip(s_own.extra["solves"], s_given.extra["solves"]):
        assert (r0.iters, r0.matvecs, r0.milc_iters, r0.true_residual) == (r1.iters, r1.matvecs, r1.milc_iters,
                                                                           r1.true_residual)
    assert sum(r.iters for r in s_own.extra["solves"]) > 0


def test_on_by_default():
    assert RunConfig().batched_hops is True
    assert RunConfig.resolve(cli={}, env={"HMC_BATCHED_HOPS": "0"}).batched_hops is False


# --- on the device (pytest -m gpu) --------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_gpu_hop_many_is_one_hop_each(dtype):
    """The CUDA build: the batched hop equals one hop each bitwise (the same sums in the same order)."""
    from lattice import get_backend

    gpu = Geometry(DIMS, get_backend("cupy"), config=_batched(True))
    cp = gpu.xp
    d = StaggeredDslash(gpu, *(cp.asarray(u) for u in _links())).converted(dtype)
    psis, xs = [cp.asarray(f) for f in _fields(6, dtype, 2)], [cp.asarray(f) for f in _fields(6, dtype, 3)]
    for parity in (0, 1):
        got = d.hop_many(psis, parity, a=0.37, xs=xs, b=-1.0)
        want = [d.hop(p, parity, a=0.37, x=xs[k], b=-1.0) for k, p in enumerate(psis)]
        assert all(bool(cp.array_equal(g, w)) for g, w in zip(got, want))


@pytest.mark.gpu
def test_gpu_batched_residuals_give_the_same_refinement():
    from lattice import get_backend

    (x0, s0), (x1, s1) = _refined(False, get_backend("cupy")), _refined(True, get_backend("cupy"))
    assert all(bool((a == c).all()) for a, c in zip(x0, x1))
    assert [r.iters for r in s0.extra["refine"]] == [r.iters for r in s1.extra["refine"]]
    assert s0.true_residuals == s1.true_residuals and s1.converged


@needs_gxx
def test_hop_many_into_given_fields_leaves_their_other_parity():
    """The outer products' form (hmc/rhmc.py): z_l = X_l copied, then D_oe X_l written on the odd sites only."""
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=_batched(True))
    d = StaggeredDslash(host, *_links())
    xs = _fields(5, np.complex128, 6)
    zs = [x.copy() for x in xs]
    d.hop_many(xs, 1, zs)
    for x, z in zip(xs, zs):
        want = x.copy()
        d.hop(x, 1, want)
        assert np.array_equal(z, want)


def test_outer_products_with_batched_hops_are_the_same(monkeypatch):
    """The RHMC monomial's MD outer products (2+1+1 rational functions of MILC's sample, 4^4) with the batched hops
    equal the hop-by-hop ones (NumPy: the same hops; the kernel's batch is tested above)."""
    from hmc.momenta import random_momenta
    from hmc.rational_file import read_rationals
    from hmc.rhmc import FermionMonomial, PseudofermionTerm
    from lattice import CounterRNG, GaugeField, su3
    from tests.conftest import fixture_path

    pfs = read_rationals(fixture_path("rationals.sample.su3_rhmc_hisq_f211"))
    out = []
    for on in (False, True):
        geom = Geometry((4, 4, 4, 4), config=_batched(on))
        u = GaugeField(geom, su3.expm_su3(0.3 * random_momenta(geom, CounterRNG(5), "smooth"))
                       @ GaugeField.unit(geom).links)
        m = FermionMonomial([PseudofermionTerm(p, 1e-10, 1e-10, 1e-10, 10000) for p in pfs[:2]])
        m.refresh(u, CounterRNG(9))
        out.append(m.outer_products(u))
    for part in (0, 1):
        for eps in out[0][part]:
            assert np.array_equal(out[0][part][eps], out[1][part][eps])
