"""Geometry shifts and halos with CuPy fields (lattice.geometry.ShiftHandle / HaloHandle): with a GPU halo engine
(comms.cuda.transports.GpuHaloEngine, HMC_P2P_TRANSPORT=event|stream_gated) faces go device to device - CuPy faces
in, CuPy faces out, no host copy; with the CPU engine (mpi, shm) they are staged through the host as before. Either
way the result is pure data movement: bitwise the global field's roll.

CPU: ``HaloHandle.finish(out)`` receives faces into the given arrays (the extended array of the multigrid stencil
relies on it); the staging of NumPy fields is "numpy" and never touches the CUDA modules.
GPU under mpiexec (pytest -m gpu; HMC_GPU_MPS=1 under MPS): on 2 and 4 ranks, transports mpi, event and
stream_gated: shifts by +-1, +-3 and farther than a local block, halos of depth 1 and 2 (also into ``out``) equal
the global roll bitwise; with event and stream_gated every exchange the geometry posts has device faces (the
engine's ``host_in`` is False) and the staging is "device"; with mpi it is "host".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import keep_gpu_report  # noqa: E402

try:
    from tests.comms.test_gpu_transports import launch, mps, needs_mpi  # noqa: F401
except Exception:  # pragma: no cover - the GPU test module always imports
    launch = mps = None
    needs_mpi = pytest.mark.skip(reason="tests.comms.test_gpu_transports is unavailable")


def _global(dims, seed=2):
    nx, ny, nz, nt = dims
    rng = np.random.default_rng(seed)
    s = (nt, nz, ny, nx, 3)
    return rng.standard_normal(s) + 1j * rng.standard_normal(s)


def _want_halo(glob, geom, mu, side, depth):
    """The face (mu, side) of depth ``depth`` this rank must receive, cut from the global field."""
    axis = 3 - mu
    n, o, N = geom.local_dims[mu], geom.offset[mu], geom.dims[mu]
    idx = [(o - depth + i) % N for i in range(depth)] if side == 0 else [(o + n + i) % N for i in range(depth)]
    sl = [slice(off, off + m) for off, m in zip(reversed(geom.offset), reversed(geom.local_dims))]
    sl[axis] = slice(None)
    return np.take(glob[tuple(sl)], idx, axis=axis)


def test_halo_finish_into_given_arrays():
    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from lattice.geometry import _staging

    geom = Geometry((4, 4, 4, 6), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned="xt"))
    try:
        f = _global(geom.dims)
        assert _staging(geom) == "numpy"
        for depth in (1, 2):
            want = geom.halo(f, depth)
            out = {k: np.zeros_like(v) for k, v in want.items()}
            got = geom.halo_start(f, depth).finish(out)
            assert sorted(got) == [(0, 0), (0, 1), (3, 0), (3, 1)]
            for k, v in want.items():
                assert got[k] is out[k] and np.array_equal(out[k], v)
                assert np.array_equal(v, _want_halo(f, geom, k[0], k[1], depth))
    finally:
        geom.grid.close()


CASES = [(2, "1x1x1x2", "4x4x4x8"), (4, "1x1x2x2", "4x4x8x8")]
TRANSPORTS = ("mpi", "event", "stream_gated")


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid,lattice", CASES)
def test_gpu_shifts_and_halos_device_to_device(tmp_path, mps, n, grid, lattice):  # noqa: F811
    launch(n, [str(Path(__file__)), "halo", str(tmp_path), grid, lattice], mps)
    rep = json.loads(Path(tmp_path, "halo.json").read_text())
    keep_gpu_report(f"geometry_halo_{n}.json", rep)
    assert rep["fails"] == [], rep["fails"]
    for tr in TRANSPORTS:
        r = rep["transports"][tr]
        assert r["shift_bitwise"] and r["halo_bitwise"] and r["halo_out_bitwise"], (tr, r)
        assert r["exchanges"] > 0, (tr, r)
        if tr == "mpi":
            assert r["staging"] == ["host"], (tr, r)
        else:
            assert r["staging"] == ["device"] and r["host_in"] == [False], (tr, r)


def _halo_worker(out, grid_text, lattice_text):
    import cupy as cp

    from comms import ProcessGrid, world
    from lattice import Geometry, get_backend
    from lattice import geometry as geomod

    comm = world()
    dims = tuple(int(v) for v in lattice_text.split("x"))
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("cupy")
    glob = _global(dims)
    seen = {"staging": set(), "host_in": set(), "exchanges": 0}
    staging_of = geomod._staging                 # read by every exchange the lattice's stencils post

    def staging_recorded(geom):
        how = staging_of(geom)
        seen["staging"].add(how)
        return how
    geomod._staging = staging_recorded
    rep = {"grid": gdims, "lattice": dims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in TRANSPORTS:
        seen.update(staging=set(), host_in=set(), exchanges=0)
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(dims, be, grid)
        eng = grid.halo
        start = eng.start

        def start_recorded(sends, start=start):
            ex = start(sends)
            seen["exchanges"] += 1
            if hasattr(ex, "host_in"):
                seen["host_in"].add(bool(ex.host_in))
            return ex
        eng.start = start_recorded
        loc = np.ascontiguousarray(geom.local_part(glob))
        f = cp.asarray(loc)
        r = {"shift_bitwise": True, "halo_bitwise": True, "halo_out_bitwise": True}
        for mu in range(4):
            if not grid.partitioned[mu]:
                continue
            axis = 3 - mu
            for step in (1, -1, 3, -3, geom.local_dims[mu] + 1):
                got = cp.asnumpy(geom.shift(f, mu, step))
                want = geom.local_part(np.roll(glob, -step, axis=axis))
                if not np.array_equal(got, want):
                    r["shift_bitwise"] = False
                    fails.append(f"{tr}: shift mu={mu} step={step}")
        for depth in (1, 2):
            got = geom.halo(f, depth)
            views = {k: cp.zeros_like(v) for k, v in got.items()}
            got_out = geom.halo_start(f, depth).finish(views)
            for (mu, side), v in got.items():
                want = _want_halo(glob, geom, mu, side, depth)
                if not isinstance(v, cp.ndarray) or not np.array_equal(cp.asnumpy(v), want):
                    r["halo_bitwise"] = False
                    fails.append(f"{tr}: halo {(mu, side)} depth {depth}")
                w = got_out[(mu, side)]
                if w is not views[(mu, side)] or not np.array_equal(cp.asnumpy(w), want):
                    r["halo_out_bitwise"] = False
                    fails.append(f"{tr}: halo into out {(mu, side)} depth {depth}")
        r.update(staging=sorted(seen["staging"]), host_in=sorted(seen["host_in"]), exchanges=seen["exchanges"],
                 engine=type(eng).__name__)
        del eng.start
        rep["transports"][tr] = r
        grid.close()
    allf = comm.allgather(fails)
    if comm.rank == 0:
        rep["fails"] = [f"rank {k}: {f}" for k, fs in enumerate(allf) for f in fs]
        Path(out, "halo.json").write_text(json.dumps(rep, indent=1))
    print(f"rank {comm.rank}: {json.dumps(rep)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "halo":
        _halo_worker(sys.argv[2], sys.argv[3], sys.argv[4])
