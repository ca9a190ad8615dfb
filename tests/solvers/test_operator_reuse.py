"""Operators kept across link updates, so that the solvers' CUDA graphs replay instead of being captured anew
(solvers.krylov_graph ``GraphLoop.bind``, docs/architecture.md "Device-resident solvers"): ``set_links`` carries the
precision conversions along, the even-odd operator's conversion is made once, the GPU hop (compiled for the host)
rebuilds its link tables at the same addresses, and a loop's Krylov vectors are its own. No GPU."""
from __future__ import annotations

import types
import weakref

import numpy as np
import pytest

from lattice import Geometry
from lattice.backend import Backend
from solvers import StaggeredDslash
from solvers.krylov_graph import GraphLoop
from solvers.staggered import parity_sites
from solvers.staggered_cuda import CudaHop
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_field, random_links

DIMS = (4, 4, 4, 6)


def _fields(seed):
    fat, long = random_links(Geometry(DIMS), seed=seed)
    return np.asarray(fat), np.asarray(long)


def test_conversions_follow_set_links():
    """The single-precision operator converted() made is the same object after a link update, with the new links
    rounded to single; the even-odd normal operator's conversion is made once and follows too."""
    geom = Geometry(DIMS)
    d = StaggeredDslash(geom, *_fields(3))
    single = d.converted(np.complex64)
    A = d.even_odd(0.0).normal
    As = A.converted(np.complex64)
    assert A.converted(np.complex64) is As and As.dslash is single and A.converted(np.complex128) is A
    d.set_links(*_fields(4))
    assert d.converted(np.complex64) is single and A.converted(np.complex64) is As
    fresh = StaggeredDslash(geom, *_fields(4)).converted(np.complex64)
    for p in (0, 1):
        assert single._links[p].dtype == np.complex64 and np.array_equal(single._links[p], fresh._links[p])
    psi = random_field(geom, np.random.default_rng(1), np.complex64)
    assert np.array_equal(As(psi), fresh.even_odd(0.0).normal(psi))


@needs_gxx
@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_hop_tables_are_rebuilt_in_place(dtype):
    """The kernel's link tables (host build) stay the same arrays across set_links, hold the new links, and the hop
    gives a fresh operator's numbers bitwise."""
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    d = StaggeredDslash(host, *_fields(5))
    dd = d.converted(dtype)
    assert isinstance(dd._hop_impl, CudaHop)
    before = [dd._hop_impl._links(p) for p in (0, 1)]
    d.set_links(*_fields(6))
    after = [dd._hop_impl._links(p) for p in (0, 1)]
    assert all(a is b for a, b in zip(after, before))
    fresh = StaggeredDslash(host, *_fields(6)).converted(dtype)
    psi = random_field(Geometry(DIMS), np.random.default_rng(2), dtype)
    for p in (0, 1):
        assert np.array_equal(np.asarray(fresh._hop_impl._links(p)), np.asarray(after[p]))
        assert np.array_equal(np.asarray(dd.hop(psi, p)), np.asarray(fresh.hop(psi, p)))


class Run(types.SimpleNamespace):
    """A solve's stand-in (weakly referable, as the solvers' run objects are)."""


def _loop():
    loop = GraphLoop.__new__(GraphLoop)
    loop.cp, loop.vectors, loop.holder = np, {}, None
    return loop


def test_bind_moves_the_vectors_into_the_loop_and_keeps_their_values():
    """Every solve presents the loop's own arrays (the same addresses for the kept graphs), holding its values;
    while another solve holding them is alive, a solve keeps its own vectors."""
    loop = _loop()
    first = Run(r=np.arange(6.0), w=np.ones(6), s=None)
    loop.bind(first, ("r", "w", "s"))
    r0, w0 = first.r, first.w
    assert r0 is loop.vectors["r"] and np.array_equal(r0, np.arange(6.0)) and first.s is None
    second = Run(r=np.full(6, 7.0), w=np.zeros(6))
    mine = second.r
    loop.bind(second, ("r", "w"))
    assert second.r is mine and np.array_equal(first.r, np.arange(6.0))       # the first solve is still alive
    ref = weakref.ref(first)
    del first
    assert ref() is None
    loop.bind(second, ("r", "w"))
    assert second.r is r0 and second.w is w0 and np.array_equal(r0, np.full(6, 7.0))
    third = Run(r=np.zeros(8), w=np.zeros(8))
    del second
    loop.bind(third, ("r", "w"))
    assert third.r is loop.vectors["r"] is not r0 and third.r.shape == (8,)      # another shape: new buffers



@needs_gxx
@pytest.mark.parametrize("compact", [False, True])
def test_hop_kernels_return_at_once_past_a_solves_end(compact):
    """The hop kernels (host build) read the status slot of a device-resident solve's state (solvers.krylov_graph
    ``GraphLoop.status``): nonzero (the solve stopped) leaves ``out`` as it was, zero gives the hop's numbers; the
    normal operator's ``apply_into`` passes it to both of its hops."""
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    d = StaggeredDslash(host, *_fields(7))
    A = d.even_odd(0.05).normal
    A = A.compact() if compact else A
    psi = np.ascontiguousarray(random_field(Geometry(DIMS), np.random.default_rng(3)))
    if compact:
        psi = np.ascontiguousarray(psi.reshape(-1, 3)[parity_sites(Geometry(DIMS), A.parity)])
    want = np.full_like(psi, 3.0)            # (the full-lattice form leaves the other parity's sites as they are)
    A.apply_into(psi, want)
    stopped, running = np.ones(1), np.zeros(1)
    out = np.full_like(psi, 3.0)
    A.apply_into(psi, out, frozen=stopped)
    assert np.array_equal(out, np.full_like(psi, 3.0))
    A.apply_into(psi, out, frozen=running)
    assert np.array_equal(out, want)
