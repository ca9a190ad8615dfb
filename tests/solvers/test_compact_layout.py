"""Parity-compact Krylov vectors (docs/perf-notes.md, "Parity-compact Krylov vectors"): the hop's compact mode, in
the NumPy body and in the CUDA kernel compiled for the host, gives the full-lattice hop's numbers on the parity's
sites bit for bit; CompactNormal is the even-odd normal operator on compact vectors; and the multishift CG on the
fused twin gives the same iterations and the same bits in either layout (with and without reliable updates)."""
import numpy as np
import pytest

from lattice import Geometry, get_backend
from lattice.backend import Backend
from solvers import StaggeredDslash, project
from solvers.blas_cuda import BlasTwin
import solvers.multishift_run as ms
from solvers.multishift import RELIABLE_DELTA, MultishiftCG
from solvers.staggered import parity_sites
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_field, random_links

DIMS = (4, 4, 4, 6)      # (the kernel's Naik hops wrap once: every extent at least 3)
SHIFTS = (0.05, 0.2, 1.0, 2.0)


def _compact(v, geom, parity):
    return np.ascontiguousarray(np.asarray(v).reshape(-1, 3)[parity_sites(geom, parity)])


def test_checkerboard_index_is_the_site_index_halved():
    """With x fastest and an even x extent, the full-lattice site s of either parity is compact site s >> 1."""
    geom = Geometry(DIMS)
    for p in (0, 1):
        assert np.array_equal(parity_sites(geom, p) >> 1, np.arange(geom.volume // 2))


def _hops_agree(d, cpu):
    rng = np.random.default_rng(7)
    psi, x = random_field(cpu, rng), random_field(cpu, rng)
    for p in (0, 1):
        for a, xx in ((0.0, None), (0.3, x)):
            full = d.hop(psi, p, a=a, x=xx, b=-1.0)
            xc = None if xx is None else _compact(xx, cpu, p)
            got = d.hop(_compact(psi, cpu, 1 - p), p, a=a, x=xc, b=-1.0, compact=True)
            assert got.shape == d.compact_shape
            assert np.array_equal(np.asarray(got), _compact(full, cpu, p)), (p, a)


def test_numpy_compact_hop_equals_full():
    cpu = Geometry(DIMS, get_backend("numpy"))
    d = StaggeredDslash(cpu, *random_links(cpu, 3))
    assert d.has_compact
    _hops_agree(d, cpu)
    _hops_agree(d.adjoint(), cpu)


@needs_gxx
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_kernel_compact_mode_equals_full(dtype):
    """solvers/kernels/staggered_hop.cu compiled for the host (the CudaHop driver on FakeCuPy)."""
    from solvers.staggered_cuda import CudaHop

    cpu = Geometry(DIMS, get_backend("numpy"))
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    d = StaggeredDslash(host, *random_links(cpu, 3)).converted(dtype)
    assert isinstance(d._hop_impl, CudaHop) and d.has_compact
    _hops_agree(d, cpu)


def test_compact_normal_equals_even_odd_normal():
    cpu = Geometry(DIMS)
    d = StaggeredDslash(cpu, *random_links(cpu, 4))
    for p in (0, 1):
        a = d.even_odd(0.07, p).normal
        c = a.compact()
        assert c is a.compact() and c.shape == d.compact_shape
        b = project(random_field(cpu, np.random.default_rng(p)), cpu, p)
        assert np.array_equal(c(_compact(b, cpu, p)), _compact(a(b), cpu, p))


def _twin(layout_compact):
    def fused(op, source=None, compact=False):
        return BlasTwin(op.geom, op.dtype, op.space.parity, compact=compact and layout_compact)
    return fused


@pytest.mark.parametrize("inner,stop", [(None, False), (np.complex64, False), (None, True), (np.complex64, True)])
def test_multishift_same_bits_in_either_layout(monkeypatch, inner, stop):
    """The multishift on the fused twin: parity-compact vectors against full-lattice ones (the solutions scattered
    back), the same iterations, residuals and bits; ``inner``: single Krylov vectors, double x_i, reliable updates;
    ``stop``: the converged shifts stopped (their updates left out of the fused kernel: inactive coefficients)."""
    cpu = Geometry(DIMS)
    a = StaggeredDslash(cpu, *random_links(cpu, 5)).even_odd(0.0).normal
    b = project(random_field(cpu, np.random.default_rng(5)), cpu, 0)
    delta = RELIABLE_DELTA if inner is not None else 0.0
    out = {}
    for compact in (False, True):
        monkeypatch.setattr(ms, "fused_blas", _twin(compact))
        xs, st = MultishiftCG(SHIFTS, 1e-8, 1000, False, True, inner, delta, stop_converged=stop)(a).solve(b)
        assert st.extra["fused"] and st.extra["compact"] is compact and (st.converged or inner is not None)
        out[compact] = xs, st
    (x0, s0), (x1, s1) = out[False], out[True]
    assert s1.iters == s0.iters and s1.residuals == s0.residuals and s1.true_residuals == s0.true_residuals
    assert s1.extra.get("reliable_updates") == s0.extra.get("reliable_updates")
    if inner is not None:
        assert s0.extra["reliable_updates"] >= 1
    if stop:
        assert s1.extra["stopped_shifts"] == s0.extra["stopped_shifts"] >= 1
        assert s1.extra["shift_updates"] == s0.extra["shift_updates"] < len(SHIFTS) * s0.iters
    for u, v in zip(x0, x1):
        assert u.shape == v.shape == b.shape and u.dtype == v.dtype
        assert np.array_equal(u, v)


@pytest.mark.parametrize("kind", ["cg", "mixed_cg"])
def test_cg_in_either_layout(monkeypatch, kind):
    """CG on the fused twin with parity-compact vectors against full-lattice ones: the Chronopoulos-Gear CG (its
    reductions all in the fused kernels) the same bits; the mixed CG (single Hestenes-Stiefel steps, reliable
    updates whose |r|^2 and <r, p> are array sums over the compact or the full vectors) the same iterations and
    solutions to rounding."""
    from importlib import import_module

    from solvers import cg, mixed_cg

    cgmod = import_module("solvers.cg")          # (the package's name cg is the factory)

    cpu = Geometry(DIMS)
    a = StaggeredDslash(cpu, *random_links(cpu, 5)).even_odd(0.1).normal
    b = project(random_field(cpu, np.random.default_rng(6)), cpu, 0)
    make = cg(1e-10, 2000) if kind == "cg" else mixed_cg(1e-10, 2000)
    out = {}
    for compact in (False, True):
        monkeypatch.setattr(cgmod, "fused_blas", _twin(compact))
        x, st = make(a).solve(b)
        assert st.extra["fused"] and st.extra["compact"] is compact and st.converged
        out[compact] = x, st
    (x0, s0), (x1, s1) = out[False], out[True]
    assert x1.shape == b.shape and x1.dtype == x0.dtype
    assert (s1.iters, s1.restarts, s1.matvecs) == (s0.iters, s0.restarts, s0.matvecs)
    if kind == "cg":
        assert s1.true_residual == s0.true_residual and np.array_equal(x0, x1)
    else:
        assert s0.restarts >= 1 and np.abs(x1 - x0).max() <= 1e-12 * np.abs(x0).max()
