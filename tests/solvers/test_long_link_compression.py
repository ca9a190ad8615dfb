"""Long-link compression of the GPU hop (docs/perf-notes.md "Long-link compression"): HISQ and asqtad Naik links
are real multiples of U(3) matrices, so their third row is q conj(row 0 x row 1); the kernel's table keeps two rows
and q where every Naik link rebuilds to rounding, and the kernel (compiled for the host) then gives the NumPy hop's
numbers to rounding. Links of another form stay whole."""
import numpy as np
import pytest

from comms.config import RunConfig
from lattice import GaugeField, Geometry, get_backend
from lattice.backend import Backend
from lattice.placement import set_switch
from lattice.rng import CounterRNG
from force.hisq_links import asqtad_links, hisq_links
from solvers import StaggeredDslash
from solvers.staggered_cuda import (COMPRESS_SWITCH, REBUILD_TOLERANCE, CudaHop, hop_bytes, link_table,
                                    third_row_factors)
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_field

DIMS = (4, 4, 4, 6)
#: single-precision operators keep their Naik links whole here (the default rounds them to 16 bits,
#: solvers.half_links, and 16-bit links are stored whole): the compressed table is what these tests test
WHOLE = RunConfig.resolve(cli={"dslash_half_links": "off"}, env={})


def _links(kind, geom):
    u = GaugeField.random(geom, CounterRNG(11))
    fl = {"hisq": lambda: hisq_links(u), "hisq_charm": lambda: hisq_links(u, eps=-0.3),
          "asqtad": lambda: asqtad_links(u, 0.87)}[kind]()
    return np.asarray(fl.fat), np.asarray(fl.long)


@pytest.mark.parametrize("kind", ["hisq", "hisq_charm", "asqtad"])
def test_naik_links_rebuild_to_rounding(kind):
    _, long = _links(kind, Geometry(DIMS))
    q, error = third_row_factors(long.reshape(-1, 3, 3), np)
    assert error <= REBUILD_TOLERANCE[np.dtype(np.complex128)]
    assert np.all(np.abs(q) > 1.0)          # |det M| / |c| with |c| <= 1/24 (1 + |eps|) / u0^2


def test_other_links_are_not_compressed():
    geom = Geometry(DIMS)
    fat, long = _links("hisq", geom)
    rng = np.random.default_rng(2)
    d = StaggeredDslash(geom, fat, long + 1e-6 * rng.standard_normal(long.shape))    # not a multiple of U(3)
    assert not link_table(d._links[0], np, True)[1]
    thin = StaggeredDslash(geom, fat)                                               # no Naik hops
    table, compressed = link_table(thin._links[0], np, True)
    assert not compressed and table.shape == (8 * 9, geom.volume // 2)
    hisq = StaggeredDslash(geom, fat, long)
    assert link_table(hisq._links[0], np, True)[1] and not link_table(hisq._links[0], np, False)[1]
    zero = StaggeredDslash(geom, fat, 0 * long)                                     # q = 0 rebuilds zeros
    assert link_table(zero._links[0], np, True)[1]


def test_compressed_table_layout():
    """Per direction +1 and -1 whole (9 planes), +3 and -3 as rows 0, 1 and q (7 planes): 32 planes."""
    geom = Geometry(DIMS)
    d = StaggeredDslash(geom, *_links("hisq", geom))
    blocks = d._links[1]
    table, compressed = link_table(blocks, np, True)
    assert compressed and table.shape == (4 * 32, geom.volume // 2)
    mu = 2
    plane = table[mu * 32:(mu + 1) * 32]
    assert np.array_equal(plane[:9], blocks[4 * mu].reshape(-1, 9).T)
    assert np.array_equal(plane[9:18], blocks[4 * mu + 1].reshape(-1, 9).T)
    assert np.array_equal(plane[18:24], blocks[4 * mu + 2].reshape(-1, 9).T[:6])
    q = plane[24]
    rebuilt = q[:, None] * np.conj(np.cross(blocks[4 * mu + 2][:, 0], blocks[4 * mu + 2][:, 1]))
    assert np.abs(rebuilt - blocks[4 * mu + 2][:, 2]).max() <= 1e-11 * np.abs(blocks).max()


def test_bytes_of_a_compressed_hop():
    assert hop_bytes(np.complex128) == 3120 and hop_bytes(np.complex128, compressed=True) == 3120 - 8 * 2 * 16
    assert hop_bytes(np.complex64, compressed=True) == 1432 and hop_bytes(np.complex128, naik=False,
                                                                         compressed=True) == hop_bytes(
        np.complex128, naik=False)


def _kernel_against_numpy(kind, dtype, compress):
    cpu = Geometry(DIMS, get_backend("numpy"), config=WHOLE)
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=WHOLE)
    fat, long = _links(kind, cpu)
    ref = StaggeredDslash(cpu, fat, long).converted(dtype)
    old = set_switch(COMPRESS_SWITCH, compress)
    try:
        d = StaggeredDslash(host, fat, long).converted(dtype)
        assert isinstance(d._hop_impl, CudaHop) and d._hop_impl.compressed is compress
        rng = np.random.default_rng(4)
        psi, x = random_field(cpu, rng, dtype), random_field(cpu, rng, dtype)
        worst = 0.0
        for p in (0, 1):
            got = np.asarray(d.hop(psi, p, a=0.3, x=x, b=-1.0))
            want = np.asarray(ref.hop(psi, p, a=0.3, x=x, b=-1.0))
            worst = max(worst, np.abs(got - want).max() / np.abs(want).max())
        return worst
    finally:
        set_switch(COMPRESS_SWITCH, old)


@needs_gxx
@pytest.mark.parametrize("kind", ["hisq", "hisq_charm", "asqtad"])
def test_compressed_kernel_equals_numpy_hop(kind):
    """solvers/kernels/staggered_hop.cu on the host: the compressed table against the NumPy hop, double and
    single, to the rounding of the rebuilt row."""
    assert _kernel_against_numpy(kind, np.complex128, True) <= 1e-12
    assert _kernel_against_numpy(kind, np.complex64, True) <= 2e-6


@needs_gxx
def test_switch_off_keeps_the_whole_links():
    assert _kernel_against_numpy("hisq", np.complex128, False) <= 1e-15


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["hisq", "asqtad"])
@pytest.mark.parametrize("dtype,tol", [(np.complex128, 1e-12), (np.complex64, 2e-6)])
def test_gpu_compressed_hop_equals_numpy(kind, dtype, tol):
    """The CUDA kernel on the device with the compressed table, against the NumPy hop (run: pytest -m gpu)."""
    cpu, gpu = Geometry(DIMS, get_backend("numpy"), config=WHOLE), Geometry(DIMS, get_backend("cupy"), config=WHOLE)
    fat, long = _links(kind, cpu)
    ref = StaggeredDslash(cpu, fat, long).converted(dtype)
    xp = gpu.xp
    d = StaggeredDslash(gpu, xp.asarray(fat), xp.asarray(long)).converted(dtype)
    assert d.links_compressed
    rng = np.random.default_rng(4)
    psi, x = random_field(cpu, rng, dtype), random_field(cpu, rng, dtype)
    for p in (0, 1):
        got = gpu.backend.to_numpy(d.hop(xp.asarray(psi), p, a=0.3, x=xp.asarray(x), b=-1.0))
        want = np.asarray(ref.hop(psi, p, a=0.3, x=x, b=-1.0))
        assert np.abs(got - want).max() <= tol * np.abs(want).max()


def test_the_geometry_configuration_decides_and_graphs_see_the_form():
    """The switch is read from the operator's geometry configuration; a captured graph's key names the table's form,
    so a graph of compressed links is not replayed over whole ones at the same address."""
    from dataclasses import replace

    keys = {}
    for on in (True, False):
        config = replace(WHOLE, dslash_compress_long=on)
        host = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=config)
        d = StaggeredDslash(host, *_links("hisq", Geometry(DIMS)))
        assert d.links_compressed is on
        keys[on] = d._hop_impl.table_form()
    assert keys[True] != keys[False]


@needs_gxx
@pytest.mark.parametrize("kind", ["hisq", "asqtad", "not_unitary"])
def test_table_kernel_equals_its_twin(kind):
    """The table kernel (``table_double`` / ``table_single``, compiled for the host) builds what link_table
    builds and makes the same decision: the link planes to the bit, the factors q to rounding (their sums are
    formed in another order)."""
    cpu = Geometry(DIMS, config=WHOLE)
    fat, long = _links("hisq" if kind == "not_unitary" else kind, cpu)
    if kind == "not_unitary":
        long = long + 1e-6 * np.random.default_rng(3).standard_normal(long.shape)
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=WHOLE)
    for dtype in (np.complex128, np.complex64):
        d = StaggeredDslash(host, fat, long).converted(dtype)
        for p in (0, 1):
            want, compressed = link_table(d._links[p], np, True)
            assert compressed is (kind != "not_unitary")
            assert bool(d._hop_impl._clong(p)) is compressed
            got = np.asarray(d._hop_impl._links(p))
            q = np.zeros(len(want), bool)
            if compressed:
                q[[32 * mu + k for mu in range(4) for k in (24, 31)]] = True
            assert np.array_equal(got[~q], want[~q])
            ulp = np.finfo(np.dtype(dtype).char.lower()).eps
            assert np.abs(got[q] - want[q]).max(initial=0) <= 8 * ulp * np.abs(want[q]).max(initial=0)


@needs_gxx
@pytest.mark.parametrize("compress", [True, False])
def test_distributed_kernel_reads_the_table_as_the_whole_lattice_one(compress):
    """hop_dist_double (the distributed hop's kernel, host build) on an unpartitioned block (pmask 0, every site,
    no ghosts) reads the same table with the same ``clong`` as hop_double: the same numbers on the parity's sites."""
    from lattice import cuda_source
    from solvers.staggered import parity_sites
    from solvers.staggered_cuda import BLOCK

    cpu = Geometry(DIMS)
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    old = set_switch(COMPRESS_SWITCH, compress)
    try:
        d = StaggeredDslash(host, *_links("hisq", cpu))
        hop = d._hop_impl
        assert hop.compressed is compress
        kernel = cuda_source.function(host.backend, "solvers", "staggered_hop.cu", "hop_dist_double")
        psi = np.ascontiguousarray(random_field(cpu, np.random.default_rng(8)))
        nx, ny, nz, nt = DIMS
        for p in (0, 1):
            vh = cpu.volume // 2
            out = np.zeros_like(psi)
            kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,),
                   (psi, hop._links(p), out, 0, np.float64(0.0), np.float64(-1.0), np.int32(p), np.int32(hop.nhop),
                    np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt), 0, np.int64(vh), 0, 0, np.int32(0),
                    np.int32(3), hop._clong(p), 0))
            sites = parity_sites(cpu, p)
            want = np.asarray(d.hop(psi, p, b=-1.0)).reshape(-1, 3)[sites]
            assert np.array_equal(out.reshape(-1, 3)[sites], want)
    finally:
        set_switch(COMPRESS_SWITCH, old)
