"""comms.stencil.Stencil: face tables and site lists against a brute-force neighbour computation, its ghosts
against the global field and against Geometry.shift, no allocation after the first exchange, on one process
(partitioned dimensions exchanging with themselves) and on 2 and 4 ranks (mpi and shm)."""
from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import run_mpi_worker, write_worker_report  # noqa: E402

DIMS = (4, 6, 8, 8)


def _hops(depth):
    """Every displacement +-1..+-depth along every direction (a Naik-like stencil for depth 3)."""
    return [(mu, s) for mu in range(4) for k in range(1, depth + 1) for s in (k, -k)]


def _local_coords(shape):
    t, z, y, x = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    return (x.ravel(), y.ravel(), z.ravel(), t.ravel())


def brute_faces(shape, partitioned, disp):
    """{(mu, dir): sorted flat local sites the neighbour on dir reads}, by walking every site of the neighbour's
    block (the same local shape) along every displacement and keeping the landings in this block."""
    c = _local_coords(shape)
    flat = np.arange(int(np.prod(shape)))
    out = {}
    for mu, s in disp:
        if not partitioned[mu]:
            continue
        n = shape[3 - mu]
        m = c[mu] + s                                   # the neighbour's site y reads y + s mu
        key = (mu, 0) if s > 0 else (mu, 1)              # read from its forward (me: I send back) or backward
        lands = (m >= n) if s > 0 else (m < 0)
        cc = [v[lands] for v in c]
        cc[mu] = m[lands] - n if s > 0 else m[lands] + n
        sites = cc[0] + shape[3] * (cc[1] + shape[2] * (cc[2] + shape[1] * cc[3]))
        out[key] = np.union1d(out.get(key, np.zeros(0, int)), sites)
    return {k: v.astype(np.int64) for k, v in out.items()}, flat


def brute_exterior(shape, partitioned, disp):
    c = _local_coords(shape)
    ext = np.zeros(c[0].size, bool)
    for mu, s in disp:
        if partitioned[mu]:
            m = c[mu] + s
            ext |= (m < 0) | (m >= shape[3 - mu])
    return np.flatnonzero(ext)


def want_ghost(geom, glob, mu, side, depth):
    """The ghost (mu, side) of depth ``depth`` from the global field: the neighbour's slab next to this block."""
    idx = []
    for a, (n, o, L) in enumerate(zip(geom.shape, geom.offset[::-1], geom.dims[::-1])):
        if a == 3 - mu:
            rng = np.arange(o - depth, o) if side == 0 else np.arange(o + n, o + n + depth)
        else:
            rng = np.arange(o, o + n)
        idx.append(rng % L)
    return glob[np.ix_(*idx)]


def _global(dims, seed, rest=()):
    nx, ny, nz, nt = dims
    rng = np.random.default_rng(seed)
    return rng.normal(size=(nt, nz, ny, nx) + rest)


def table_checks(geom, st, depth) -> dict:
    part = geom.grid.partitioned
    faces, flat = brute_faces(geom.shape, part, st.displacements)
    res = {f"faces d{depth}": sorted(faces) == sorted(st.face_sites)
           and all(np.array_equal(st.face_sites[k], v) for k, v in faces.items())}
    ext = brute_exterior(geom.shape, part, st.displacements)
    res[f"exterior d{depth}"] = np.array_equal(st.exterior, ext)
    both = np.concatenate([st.interior, st.exterior])
    res[f"partition d{depth}"] = both.size == flat.size and np.array_equal(np.sort(both), flat)
    return res


def exchange_checks(geom, st, depth) -> dict:
    """Ghosts equal the global field; each displacement rebuilt from them equals Geometry.shift (bitwise)."""
    glob = _global(geom.dims, 7, (3,))
    loc = np.ascontiguousarray(geom.local_part(glob))
    ghosts = st.complete(st.begin(loc))
    res = {f"ghosts d{depth}": all(np.array_equal(g, want_ghost(geom, glob, mu, side, depth))
                                   for (mu, side), g in ghosts.items())}
    ok = True
    for mu, s in st.displacements:
        if not geom.grid.partitioned[mu]:
            continue
        a, n, k = 3 - mu, geom.shape[3 - mu], abs(s)
        g = np.roll(loc, -s, axis=a)
        sl = [slice(None)] * 4
        gh = [slice(None)] * 4
        if s > 0:
            sl[a], gh[a] = slice(n - k, n), slice(0, k)
            g[tuple(sl)] = ghosts[(mu, 1)][tuple(gh)]
        else:
            sl[a], gh[a] = slice(0, k), slice(depth - k, depth)
            g[tuple(sl)] = ghosts[(mu, 0)][tuple(gh)]
        shifted = geom.shift(loc, mu, s)
        ok &= np.array_equal(g, shifted) and np.array_equal(shifted, geom.local_part(np.roll(glob, -s, axis=a)))
    res[f"shift d{depth}"] = bool(ok)
    return res


def allocation_checks(geom, st) -> dict:
    """After the first exchange of a field kind: the same two buffer sets and ghost views come back, and an
    exchange allocates far less than one face (tracemalloc sees NumPy's allocations)."""
    f = np.ascontiguousarray(geom.local_part(_global(geom.dims, 3, (4, 3, 3))))
    seen = {id(st.complete(st.begin(f))) for _ in range(2)}
    a, b = st.begin(f), st.begin(2 * f)          # two in flight: the two sets
    ga, gb = st.complete(a), st.complete(b)
    seen |= {id(ga), id(gb)}
    sends = [buf.send[0].__array_interface__["data"][0] for buf in (a, b)]
    face = min(v.nbytes for v in ga.values())
    tracemalloc.start()
    try:
        for _ in range(3):
            st.complete(st.begin(f))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    same = [st.buffers((4, 3, 3), f.dtype, w).send[0].__array_interface__["data"][0] for w in (0, 1)]
    return {"buffer identity": len(seen) == 2 and sends == same and a is not b,
            "no allocation": peak < face // 4}


def stencil_checks(geom) -> dict:
    from comms.stencil import Stencil

    res = {}
    for depth in (1, 3):
        st = Stencil(geom, _hops(depth), depth)
        res.update(table_checks(geom, st, depth))
        res.update(exchange_checks(geom, st, depth))
    res.update(allocation_checks(geom, Stencil(geom, _hops(1), 1)))
    return res


# --------------------------------------------------------------------------------------------------------------
# one process

@pytest.mark.parametrize("partition", ["t", "xzt", "xyzt"])
def test_stencil_one_process(partition):
    from comms import ProcessGrid
    from lattice import Geometry, get_backend

    geom = Geometry(DIMS, get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))
    try:
        res = stencil_checks(geom)
        assert res and all(res.values()), res
    finally:
        geom.grid.close()


def test_ghost_layout_is_the_multigrid_extended_array():
    """The ghost buffer of the +-1 stencil is laid out as the multigrid's extended array (its HaloTable rows)."""
    from comms import ProcessGrid
    from comms.stencil import Stencil
    from lattice import Geometry, get_backend
    from solvers.multigrid.cuda import HaloTable

    geom = Geometry(DIMS, get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned="yt"))
    try:
        table = HaloTable(geom)
        rows = Stencil(geom, _hops(1), 1).ghost_rows()
        assert [(k, table.nsite + at, shape) for k, at, shape in rows] == table.faces
    finally:
        geom.grid.close()


def test_stencil_bad_input():
    from comms import CommsError, ProcessGrid
    from comms.stencil import Stencil
    from lattice import Geometry, get_backend

    geom = Geometry(DIMS, get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned="x"))
    try:
        with pytest.raises(CommsError, match="step != 0"):
            Stencil(geom, [(0, 0)])
        with pytest.raises(CommsError, match="depth 5 is not in 1..4"):
            Stencil(geom, [(0, 5)])
        st = Stencil(geom, [(0, 1)])
        with pytest.raises(CommsError, match="site axes"):
            st.begin(np.zeros((2, 2, 2, 2)))
        f = np.zeros(geom.shape)
        a, b = st.begin(f), st.begin(f)
        with pytest.raises(CommsError, match="in flight"):
            st.begin(f)
        st.complete(a), st.complete(b)
        with pytest.raises(CommsError, match="without a begin"):
            st.complete()
    finally:
        geom.grid.close()


# --------------------------------------------------------------------------------------------------------------
# CPU under mpiexec

@pytest.mark.mpi
@pytest.mark.parametrize("n,grid", [(2, "1x1x1x2"), (4, "1x1x2x2")])
def test_stencil_under_mpiexec(tmp_path, n, grid):
    rep = run_mpi_worker(__file__, "cpu", tmp_path, n, grid, "stencil.json", timeout=120)
    assert rep["ranks"] == n and set(rep["transports"]) == {"mpi", "shm"}
    for tr, res in rep["transports"].items():
        assert len(res) >= 10 and all(res.values()), (tr, res)


def _worker(out, grid_text):
    from comms import ProcessGrid, world
    from lattice import Geometry, get_backend

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "shm"):
        grid = ProcessGrid(gdims, transport=tr, partitioned="x")      # x: one rank, exchanging with itself
        geom = Geometry(DIMS, get_backend("numpy"), grid)
        res = stencil_checks(geom)
        fails += [f"{tr}: {k}" for k, ok in res.items() if not ok]
        rep["transports"][tr] = res
        grid.close()
    write_worker_report(comm, out, "stencil.json", rep, fails)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "cpu":
        _worker(sys.argv[2], sys.argv[3])
