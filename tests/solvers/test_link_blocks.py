"""The link blocks of StaggeredDslash.set_links made in one launch (solvers/kernels/staggered_hop.cu ``link_blocks``,
compiled for the host: tests/force/cuda_host.py) equal the array twin solvers.staggered._link_blocks_array bit for
bit, in double and in the single precision of the operator's conversion, with and without Naik links; and an
operator on the host backend takes its blocks, and its converted operator's, from the kernel."""
import numpy as np
import pytest

from lattice import Geometry, get_backend
from lattice.backend import Backend
from lattice.placement import lookup
from solvers import StaggeredDslash
from solvers.staggered import _link_blocks_array, parity_sites
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_links

DIMS = (4, 6, 2, 4)        # a z extent of 2: the Naik step's periodic wrap goes round the lattice 1.5 times
BOTH = (np.dtype(np.complex128), np.dtype(np.complex64))


def _geometries():
    return Geometry(DIMS, get_backend("numpy")), Geometry(DIMS, Backend("cupy", FakeCuPy()))


@needs_gxx
@pytest.mark.parametrize("naik", [True, False], ids=["naik", "one-link"])
def test_kernel_blocks_equal_the_twin(naik):
    from solvers.staggered_cuda import link_blocks

    cpu, host = _geometries()
    fat, long = random_links(cpu, 5)
    long = long if naik else None
    sites = [parity_sites(cpu, p) for p in (0, 1)]
    assert lookup("staggered.link_blocks", host, fat=fat, long=long) is link_blocks
    made = link_blocks(host, fat, long, sites, BOTH)
    ref = _link_blocks_array(cpu, fat, long, sites, BOTH[:1])[BOTH[0]]
    for p in (0, 1):
        assert made[BOTH[0]][p].shape == ((16 if naik else 8), cpu.volume // 2, 3, 3)
        assert np.array_equal(made[BOTH[0]][p], ref[p])
        assert np.array_equal(made[BOTH[1]][p], ref[p].astype(np.complex64))


@needs_gxx
def test_operator_takes_the_kernel_blocks():
    """set_links on the host backend: the operator's blocks and its single conversion's are the twin's."""
    cpu, host = _geometries()
    fat, long = random_links(cpu, 6)
    d = StaggeredDslash(host, fat, long)
    single = d.converted(np.complex64)
    fat2, long2 = random_links(cpu, 7)
    d.set_links(fat2, long2)
    ref = StaggeredDslash(cpu, fat2, long2)
    for p in (0, 1):
        assert np.array_equal(d._links[p], ref._links[p])
        assert np.array_equal(single._links[p], ref.converted(np.complex64)._links[p])


def test_single_links_take_the_twin():
    """Links in single precision (not the kernel's input) go to the array twin."""
    _, host = _geometries()
    cpu = Geometry(DIMS, get_backend("numpy"))
    fat, long = random_links(cpu, 8)
    assert lookup("staggered.link_blocks", host, fat=fat.astype(np.complex64), long=None) is _link_blocks_array
