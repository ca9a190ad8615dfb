"""Geometry.padded: the local site array extended by ``depth`` sites on both sides of every partitioned dimension,
filled by one halo exchange per partitioned dimension (edges and corners included), equals the slice of the global
field with periodic wrap, bit for bit.

CPU, one process (partitioned dimensions forced onto the halo path: the rank is its own neighbour). CPU under
mpiexec: 2 ranks (1x1x1x2), 4 ranks (1x1x2x2 and 2x1x1x2), transports mpi and shm. GPU under mpiexec (pytest -m gpu;
HMC_GPU_MPS=1 runs the launches under MPS): CuPy fields, transports mpi (staged through the host), event and
stream_gated (device to device).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import keep_gpu_report, run_mpi_worker, write_worker_report  # noqa: E402
from tests.gpu_mpi import gpu_launch, mps, needs_mpi  # noqa: F401,E402


def expected(geom, glob, depth):
    """The global field ``glob`` (site axes first) on the local sites padded by ``depth`` on the partitioned
    dimensions, with periodic wrap: what padded must return."""
    out = glob
    for mu in range(4):
        axis = 3 - mu
        n, o, N = geom.local_dims[mu], geom.offset[mu], geom.dims[mu]
        pad = depth if geom.grid.partitioned[mu] else 0
        out = np.take(out, [(o - pad + i) % N for i in range(n + 2 * pad)], axis=axis)
    return out


def global_fields(dims):
    """Site-ids (each site distinguishable) and a random complex field with trailing (4, 3, 3) axes."""
    nx, ny, nz, nt = dims
    ids = np.arange(nx * ny * nz * nt, dtype=np.float64).reshape(nt, nz, ny, nx)
    rng = np.random.default_rng(11)
    links = rng.standard_normal((nt, nz, ny, nx, 4, 3, 3)) + 1j * rng.standard_normal((nt, nz, ny, nx, 4, 3, 3))
    return ids, links


def padded_checks(geom, to_device=lambda a: a, to_host=lambda a: a) -> dict:
    """{name: bitwise} for padded at several depths (1, 2, the smallest partitioned local extent) of the site-id
    field and of a links-like field moved to site-major order (a non-contiguous view, as GaugeAction passes)."""
    ids, links = global_fields(geom.dims)
    parts = [mu for mu in range(4) if geom.grid.partitioned[mu]]
    top = min(geom.local_dims[mu] for mu in parts)
    res = {}
    for depth in sorted({1, min(2, top), top}):
        for name, glob in (("ids", ids), ("links", links)):
            loc = to_device(np.ascontiguousarray(geom.local_part(glob)))
            if name == "links":        # the layout of GaugeField.links, viewed site-major as GaugeAction does
                loc = geom.xp.moveaxis(geom.xp.ascontiguousarray(geom.xp.moveaxis(loc, 4, 0)), 0, 4)
            got = to_host(geom.padded(loc, depth))
            want = expected(geom, glob, depth)
            res[f"{name}_d{depth}"] = bool(got.shape == want.shape and np.array_equal(got, want))
    return res


# --------------------------------------------------------------------------------------------------------------
# CPU, one process

@pytest.mark.parametrize("partition", ["t", "zt", "xt", "xyzt"])
def test_padded_one_process(partition):
    from comms import ProcessGrid
    from lattice import Geometry, get_backend

    geom = Geometry((4, 6, 4, 8), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))
    try:
        res = padded_checks(geom)
        assert res and all(res.values()), res
    finally:
        geom.grid.close()


def test_padded_depth_checked_and_unpartitioned_untouched():
    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from lattice.geometry import GeometryError

    geom = Geometry((4, 6, 4, 2), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned="yt"))
    try:
        f = np.zeros(geom.shape)
        assert geom.padded(f, 2).shape == (6, 4, 10, 4)     # t (extent 2) at its limit, y by 2, x and z as they are
        for depth in (0, 3):                                # 3 > the local extent 2 in t
            with pytest.raises(GeometryError, match="padding depth"):
                geom.padded(f, depth)
        with pytest.raises(GeometryError, match="site axes"):
            geom.padded(np.zeros((4,) + geom.shape), 1)
    finally:
        geom.grid.close()
    plain = Geometry((4, 6, 4, 2), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=(False,) * 4))
    f = np.ones(plain.shape)
    assert plain.padded(f, 5) is f


def test_padded_links_regions():
    from lattice.padded import PaddedLinks as Box

    links = np.zeros((4, 12, 4, 4, 6, 3, 3), dtype=complex)
    b = Box(links, (4, 4, 4, 8), (1, 0, 0, 2))
    n, args = b.region(1)
    assert n == 6 * 4 * 4 * 10 and [int(v) for v in args] == [6, 4, 4, 10, 6, 4, 4, 12, 0, 0, 0, 1]
    n, args = b.region(0)
    assert n == 4 * 4 * 4 * 8 and [int(v) for v in args] == [4, 4, 4, 8, 6, 4, 4, 12, 1, 0, 0, 2]
    f = np.arange(links.size, dtype=float).reshape(links.shape)
    assert np.array_equal(b.interior(f), f[:, 2:10, :, :, 1:5]) and b.interior(f).flags.c_contiguous
    whole = Box(np.zeros((4, 8, 4, 4, 4, 3, 3)), (4, 4, 4, 8), (0,) * 4)
    assert [int(v) for v in whole.region(1)[1]] == [4, 4, 4, 8] * 2 + [0] * 4
    with pytest.raises(ValueError, match="box"):
        Box(links, (4, 4, 4, 8), (1, 0, 0, 1))


# --------------------------------------------------------------------------------------------------------------
# CPU under mpiexec

CPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2"), (4, "2x1x1x2")]
DIMS = (4, 4, 4, 8)


@pytest.mark.mpi
@pytest.mark.parametrize("n,grid", CPU_CASES)
def test_padded_under_mpiexec(tmp_path, n, grid):
    rep = run_mpi_worker(__file__, "cpu", tmp_path, n, grid, "padded.json")
    assert rep["ranks"] == n and set(rep["transports"]) == {"mpi", "shm"}
    for tr, res in rep["transports"].items():
        assert len(res) >= 4 and all(res.values()), (tr, res)


# --------------------------------------------------------------------------------------------------------------
# GPU under mpiexec

GPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2"), (4, "2x1x1x2")]


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid", GPU_CASES)
def test_padded_gpu_under_mpiexec(tmp_path, mps, n, grid):  # noqa: F811
    gpu_launch(n, [str(Path(__file__)), "gpu", str(tmp_path), grid], mps)
    rep = json.loads(Path(tmp_path, "padded.json").read_text())
    keep_gpu_report(f"padded_{n}_{grid}.json", rep)
    assert rep["fails"] == [], rep["fails"]
    assert set(rep["transports"]) == {"mpi", "event", "stream_gated"}
    for tr, res in rep["transports"].items():
        assert len(res) >= 4 and all(res.values()), (tr, res)


# --------------------------------------------------------------------------------------------------------------
# script mode: one worker per rank

def _worker(kind, out, grid_text):
    from comms import ProcessGrid, world
    from lattice import Geometry, get_backend

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    if kind == "gpu":
        import cupy as cp

        be, transports, to_dev, to_host = get_backend("cupy"), ("mpi", "event", "stream_gated"), cp.asarray, cp.asnumpy
    else:
        be, transports, to_dev, to_host = get_backend("numpy"), ("mpi", "shm"), (lambda a: a), (lambda a: a)
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in transports:
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(DIMS, be, grid)
        res = padded_checks(geom, to_dev, to_host)
        fails += [f"{tr}: {k}" for k, ok in res.items() if not ok]
        rep["transports"][tr] = res
        grid.close()
    write_worker_report(comm, out, "padded.json", rep, fails)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] in ("cpu", "gpu"):
        _worker(sys.argv[1], sys.argv[2], sys.argv[3])


@pytest.mark.parametrize("partition", ["t", "zt", "xyzt"])
def test_padded_face_bytes_is_the_largest_face_sent(partition):
    """lattice.padded.padded_face_bytes (what the force reserves the halo buffers by) equals the largest face the
    exchanges of Geometry.padded hand the engine, for matrices and colour vectors at depths 1 to 3."""
    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from lattice.padded import padded_face_bytes

    geom = Geometry((4, 6, 4, 8), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))
    engine, asked = geom.grid.halo, []
    reserve = engine.reserve
    engine.reserve = lambda nbytes: asked.append(nbytes) or reserve(nbytes)
    try:
        for depth in (1, 2, 3):
            for site in ((4, 3, 3), (7, 3)):
                asked.clear()
                geom.padded(np.zeros(geom.shape + site, dtype=np.complex128), depth)
                assert max(asked) == padded_face_bytes(geom, depth, 16 * int(np.prod(site)))
    finally:
        geom.grid.close()
