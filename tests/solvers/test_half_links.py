"""Half-precision links (solvers.half_links, setting ``dslash_half_links``: naik or all): a single-precision
operator's (Naik) links rounded to 16 bits with a scale per link, on every backend; the GPU hop's 16-bit table gives
back the rounded values to the bit, so its kernels (compiled for the host here, on the device under -m gpu) compute
the NumPy hop's numbers; the mixed solvers on such an operator still meet the double-precision tolerance."""
from dataclasses import replace

import numpy as np
import pytest

from comms.config import RunConfig
from lattice import Geometry, get_backend
from lattice.backend import Backend
from solvers import StaggeredDslash, mixed_multishift_cg, norm2, project
from solvers.half_links import QMAX, half_rounded, half_table, rounded_hops
from solvers.staggered_cuda import CudaHop, hop_bytes
from tests.force.cuda_host import FakeCuPy, needs_gxx

from solver_testlib import random_field, random_links

DIMS = (4, 4, 4, 6)
SHIFTS = [0.004, 0.05, 0.4, 2.0]


MODES = ["naik", "all"]


def _geometry(half="all", backend=None):
    config = replace(RunConfig.from_environment(), dslash_half_links=half)
    return Geometry(DIMS, backend or get_backend("numpy"), config=config)


def _half_operator(geom, seed=5):
    fat, long = random_links(Geometry(DIMS), seed)
    return StaggeredDslash(geom, fat, long), StaggeredDslash(geom, fat, long).converted(np.complex64)


@pytest.mark.parametrize("mode", MODES)
def test_rounding_is_16_bits_of_each_links_largest_entry(mode):
    d64, d32 = _half_operator(_geometry(mode))
    assert d32.half_links == mode and d64.half_links == "off"
    hops = list(rounded_hops(16, mode))
    assert len(hops) == {"naik": 8, "all": 16}[mode]
    for p in (0, 1):
        whole = [h for h in range(16) if h not in hops]
        assert np.array_equal(d32._links[p][whole], d64._links[p][whole].astype(np.complex64))
        exact = d64._links[p][hops].astype(np.complex64)
        got, scales = d32._links[p][hops], d32._store.scales[p]
        assert scales.shape == exact.shape[:2] and scales.dtype == np.float32
        re = exact.view(np.float32).reshape(exact.shape[:2] + (18,))
        assert np.array_equal(scales, np.abs(re).max(-1) / np.float32(QMAX))
        q = got.view(np.float32).reshape(re.shape) / scales[..., None]
        assert np.abs(np.rint(q)).max() <= QMAX and np.abs(q - np.rint(q)).max() < 1e-2
        err = np.abs(got.view(np.float32).reshape(re.shape) - re)
        assert np.all(err <= 0.502 * scales[..., None])           # s / 2, and the product's rounding
        assert np.abs(got - exact).max() > 0                      # rounded, not the single links
    assert _half_operator(_geometry("off"))[1].half_links == "off"
    fat_only = StaggeredDslash(_geometry("naik"), random_links(Geometry(DIMS), 5)[0]).converted(np.complex64)
    assert fat_only.half_links == "off"                          # no Naik links to round


def test_zero_links_round_to_zero():
    blocks = np.zeros((2, 5, 3, 3), np.complex64)
    rounded, scales = half_rounded(Geometry(DIMS), blocks)
    assert not rounded.any() and not scales.any()


@pytest.mark.parametrize("mode", MODES)
def test_table_gives_back_the_rounded_links(mode):
    """A rounded hop's 16-bit integers times its stored scale are the rounded blocks, bit for bit (one rounded
    product); a whole hop's words are its complex64 planes."""
    _, d32 = _half_operator(_geometry(mode))
    blocks, scales = d32._links[1], d32._store.scales[1]
    table = half_table(blocks, scales, np, mode == "naik")
    nhop, vh = blocks.shape[:2]
    hops = rounded_hops(nhop, mode)
    assert table.shape == (len(hops) * 10 + (nhop - len(hops)) * 18, vh) and table.dtype == np.int32
    word = 0
    for h in range(nhop):
        planes = blocks[h].reshape(vh, 9)
        if h in hops:
            t = table[word:word + 10]
            pairs = t[:9].T.copy().view(np.int16).reshape(vh, 9, 2).astype(np.float32)
            back = pairs * t[9].view(np.float32)[:, None, None]
            assert np.array_equal(back[..., 0], planes.real) and np.array_equal(back[..., 1], planes.imag)
            word += 10
        else:
            assert np.array_equal(table[word:word + 18].reshape(-1).view(np.complex64).reshape(9, vh), planes.T)
            word += 18


def test_bytes_of_a_half_hop():
    assert hop_bytes(np.complex64, half="all") == 16 * 40 + 16 * 24 + 24 == 1048
    assert hop_bytes(np.complex64, half="naik") == 8 * 72 + 8 * 40 + 16 * 24 + 24 == 1304
    assert hop_bytes(np.complex64, compressed=True) == 1432


@pytest.mark.parametrize("mode", MODES)
def test_mixed_multishift_on_half_links_meets_the_double_tolerance(mode):
    """MILC's cgprec 1 with the sloppy operator on half links: every shift's double true residual meets tol."""
    geom = _geometry(mode)
    fat, long = random_links(Geometry(DIMS), 5)
    d = StaggeredDslash(geom, fat, long)
    assert d.converted(np.complex64).half_links == mode
    a = d.even_odd(0.0).normal
    b = project(random_field(geom, np.random.default_rng(5)), geom, 0)
    for tol in (1e-5, 1e-10):
        xs, st = mixed_multishift_cg(SHIFTS, tol, 5000)(a).solve(b)
        assert st.converged
        for s, x in zip(SHIFTS, xs):
            r = b - a(x) - s * x
            assert np.sqrt(norm2(geom, r) / norm2(geom, b)) <= tol


def _host_pair(mode):
    """(NumPy half operator, host-compiled CUDA half operator) of the same links."""
    fat, long = random_links(Geometry(DIMS), 5)
    cpu = StaggeredDslash(_geometry(mode), fat, long).converted(np.complex64)
    host = StaggeredDslash(_geometry(mode, Backend("cupy", FakeCuPy())), fat, long).converted(np.complex64)
    return cpu, host


@needs_gxx
@pytest.mark.parametrize("mode", MODES)
def test_rounding_and_table_kernels_equal_their_twins(mode):
    cpu, host = _host_pair(mode)
    assert isinstance(host._hop_impl, CudaHop) and host.half_links == mode and not host.links_compressed
    for p in (0, 1):
        assert np.array_equal(np.asarray(host._links[p]), cpu._links[p])
        assert np.array_equal(np.asarray(host._store.scales[p]), cpu._store.scales[p])
        want = half_table(cpu._links[p], cpu._store.scales[p], np, mode == "naik")
        assert np.array_equal(np.asarray(host._hop_impl._links(p)), want)


@needs_gxx
@pytest.mark.parametrize("mode", MODES)
def test_half_kernels_equal_the_numpy_hop(mode):
    """hop_half and hop_many_half (host build) against the NumPy hop of the same rounded links."""
    cpu, host = _host_pair(mode)
    rng = np.random.default_rng(4)
    geom = cpu.geom
    psis = [random_field(geom, rng, np.complex64) for _ in range(3)]
    x = random_field(geom, rng, np.complex64)
    for p in (0, 1):
        want = np.asarray(cpu.hop(psis[0], p, a=0.3, x=x, b=-1.0))
        got = np.asarray(host.hop(psis[0], p, a=0.3, x=x, b=-1.0))
        assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()
        outs = [np.zeros_like(q) for q in psis]
        host._hop_impl.many(psis, p, outs, 0.0, None, 1.0)
        for q, o in zip(psis, outs):
            assert np.array_equal(o[geom.parity() == p], np.asarray(host.hop(q, p))[geom.parity() == p])


@needs_gxx
@pytest.mark.parametrize("mode", MODES)
def test_distributed_kernel_reads_the_half_table(mode):
    """hop_dist_half on an unpartitioned block (every site, no ghosts) gives hop_half's numbers."""
    from lattice import cuda_source
    from solvers.staggered import parity_sites
    from solvers.staggered_cuda import BLOCK

    cpu, host = _host_pair(mode)
    hop = host._hop_impl
    kernel = cuda_source.function(host.geom.backend, "solvers", "staggered_hop.cu", "hop_dist_half")
    psi = np.ascontiguousarray(random_field(cpu.geom, np.random.default_rng(8), np.complex64))
    nx, ny, nz, nt = DIMS
    vh = cpu.geom.volume // 2
    for p in (0, 1):
        out = np.zeros_like(psi)
        kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,),
               (psi, hop._links(p), out, 0, np.float32(0.0), np.float32(1.0), np.int32(p), np.int32(hop.nhop),
                np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt), 0, np.int64(vh), 0, 0, np.int32(0),
                np.int32(3), hop._clong(p), 0))
        sites = parity_sites(cpu.geom, p)
        want = np.asarray(host.hop(psi, p)).reshape(-1, 3)[sites]
        assert np.array_equal(out.reshape(-1, 3)[sites], want)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_gpu_half_links_equal_the_numpy_twin(mode):
    """On the device: the rounding kernel gives the twin's bits, the half hop the NumPy hop's numbers (run: pytest
    -m gpu)."""
    fat, long = random_links(Geometry(DIMS), 5)
    cpu = StaggeredDslash(_geometry(mode), fat, long).converted(np.complex64)
    geom = _geometry(mode, get_backend("cupy"))
    xp = geom.xp
    gpu = StaggeredDslash(geom, xp.asarray(fat), xp.asarray(long)).converted(np.complex64)
    assert gpu.half_links == mode and gpu._hop_impl.suffix == "half"
    for p in (0, 1):
        assert np.array_equal(xp.asnumpy(gpu._links[p]), cpu._links[p])
        assert np.array_equal(xp.asnumpy(gpu._store.scales[p]), cpu._store.scales[p])
    psi = random_field(cpu.geom, np.random.default_rng(4), np.complex64)
    for p in (0, 1):
        want = np.asarray(cpu.hop(psi, p, a=0.3, x=psi, b=-1.0))
        got = xp.asnumpy(gpu.hop(xp.asarray(psi), p, a=0.3, x=xp.asarray(psi), b=-1.0))
        assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()


@pytest.mark.parametrize("mode", MODES)
def test_half_links_bitwise_on_partitioned_grid(monkeypatch, mode):
    """The rounding is per link, so a partitioned grid (the halo path) gives the one-process operator and mixed CG to
    the bit: answers do not depend on the decomposition."""
    from solvers import mixed_cg, set_reductions
    from solver_testlib import partitioned_pair

    monkeypatch.setenv("HMC_DSLASH_HALF_LINKS", mode)
    plain, part, links = partitioned_pair()
    d1, d2 = (StaggeredDslash(g, *links) for g in (plain, part))
    assert d1.converted(np.complex64).half_links == d2.converted(np.complex64).half_links == mode
    psi = random_field(plain, np.random.default_rng(1), np.complex64)
    assert np.array_equal(d1.converted(np.complex64)(psi), d2.converted(np.complex64)(psi))
    b = project(random_field(plain, np.random.default_rng(2)), plain, 0)
    old = set_reductions("exact")
    try:
        x1, s1 = mixed_cg(1e-8, 2000)(d1.even_odd(0.4).normal).solve(b)
        x2, s2 = mixed_cg(1e-8, 2000)(d2.even_odd(0.4).normal).solve(b)
    finally:
        set_reductions(old)
    assert np.array_equal(x1, x2) and s1.iters == s2.iters and s1.true_residual <= 1e-8


@pytest.mark.mpi
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n,grid", [(2, "1x1x1x2"), (4, "1x1x2x2")])
def test_half_links_under_mpiexec_equal_one_rank(tmp_path, mode, n, grid):
    """On 2 and 4 ranks (mpiexec, shm transport) the half-link operator and a mixed CG with exact sums give the
    one-process numbers bit for bit (tests/solvers/half_links_mpi_worker.py)."""
    from pathlib import Path

    from tests.conftest import run_mpi_worker

    worker = Path(__file__).resolve().parent / "half_links_mpi_worker.py"
    rep = run_mpi_worker(worker, mode, tmp_path, n, grid, "half.json")
    assert rep["ranks"] == n and rep["mode"] == mode
    assert rep["hop_equal"] and rep["solution_equal"] and rep["true_residual"] <= 1e-8
