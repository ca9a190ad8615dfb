"""The gauge force and action-density kernels on halo-padded links (force/gauge_force_cuda.py, the partitioned-grid
path of force/gauge_action.py): one exchange per partitioned dimension (Geometry.padded, depth = the loops' largest
excursion), then one thread per interior (site, mu) walking the loops in padded coordinates.

CPU (always, where g++ is present): the kernels compiled for the host (tests/force/cuda_host.py: FakeCuPy) on one
process with forced partitions, and under mpiexec on 2 ranks (1x1x1x2) and 4 ranks (1x1x2x2, 2x1x1x2): force and
action equal the array path to 1e-13, and the gathered force equals the single-rank array path's. GPU under mpiexec
(pytest -m gpu; HMC_GPU_MPS=1 runs the launches under MPS): on 2 and 4 ranks sharing the GPU, for transports mpi,
event and stream_gated, the force equals the single-rank GPU force (the unpadded kernel) to 1e-13, the action too.
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

from tests.conftest import run_mpi_worker, write_worker_report  # noqa: E402
from tests.force.cuda_host import (FakeCuPy, forced_partition, host_staging, needs_gxx, rel,  # noqa: E402
                                   single_rank_geometry, smooth_links)
from tests.gpu_mpi import mps, needs_mpi, run_gpu_worker  # noqa: F401,E402

DIMS = (4, 4, 4, 8)
TOL = 1e-13


def actions():
    from force.gauge_action import SymanzikAction, WilsonAction

    return {"wilson": WilsonAction(6.0), "symanzik": SymanzikAction(7.4, 0.89, 3, "hisq")}


def host_checks(grid) -> dict:
    """On one decomposition: the padded kernels (stand-in CuPy geometry) against the array path (NumPy geometry on
    the same grid), force and action, each action; counts the padded-kernel calls."""
    from lattice import Geometry, GaugeField, get_backend
    from lattice.backend import Backend

    cpu = Geometry(DIMS, get_backend("numpy"), grid)
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), grid)
    links = smooth_links(cpu)
    res = {}
    for name, act in actions().items():
        calls = []
        orig = act._padded_links
        act._padded_links = lambda u, orig=orig: calls.append(1) or orig(u)
        f = act.force(GaugeField(host, links))
        s = act.action(GaugeField(host, links))
        ref_f = act.force_reference(GaugeField(cpu, links))
        ref_s = act.action(GaugeField(cpu, links))
        res[name] = {"force_rel": rel(f, ref_f), "action_rel": abs(s - ref_s) / abs(ref_s), "padded_calls": len(calls),
                     "depth": act.halo_depth, "force": f}
    return res


# --------------------------------------------------------------------------------------------------------------
# CPU, one process

def test_halo_depth():
    from force.gauge_force_cuda import excursion

    acts = actions()
    assert acts["wilson"].halo_depth == 1 and acts["symanzik"].halo_depth == 2
    assert excursion([(1, 1, 2, -1, -1, -2)]) == 2 and excursion([(1, 2, 3, -1, -2, -3)]) == 1


@needs_gxx
def test_unpadded_host_kernels_equal_the_array_path():
    """The single-rank path (the box is the lattice, offset 0) compiled for the host."""
    from lattice import Geometry, GaugeField, get_backend
    from lattice.backend import Backend

    cpu = Geometry((4, 6, 4, 8), get_backend("numpy"))
    host = Geometry((4, 6, 4, 8), Backend("cupy", FakeCuPy()))
    links = smooth_links(cpu)
    for act in actions().values():
        assert rel(act.force(GaugeField(host, links)), act.force_reference(GaugeField(cpu, links))) <= TOL
        ref = act.action(GaugeField(cpu, links))
        assert abs(act.action(GaugeField(host, links)) - ref) <= TOL * abs(ref)


@needs_gxx
@pytest.mark.parametrize("partition", ["t", "xt", "xyzt"])
def test_padded_host_kernels_one_process(monkeypatch, partition):
    with forced_partition(monkeypatch, partition) as grid:
        res = host_checks(grid)
    for name, r in res.items():
        assert r["padded_calls"] == 2, (name, r)              # force and action, each through the padded links
        assert r["force_rel"] <= TOL and r["action_rel"] <= TOL, (name, r)


def test_box_arguments_checked():
    from force.gauge_force_cuda import _box_args

    assert [int(v) for v in _box_args((4, 4, 2, 4), (4, 4, 6, 8), (0, 0, 2, 2))] == [4, 4, 2, 4, 4, 4, 6, 8,
                                                                                      0, 0, 2, 2]
    for box, off in (((4, 4, 6, 8), (0, 0, 2, 3)), ((4, 4, 6, 9), (0, 1, 2, 2))):
        with pytest.raises(ValueError, match="box"):
            _box_args((4, 4, 2, 4), box, off)


# --------------------------------------------------------------------------------------------------------------
# CPU under mpiexec

CASES = [(2, "1x1x1x2"), (4, "1x1x2x2"), (4, "2x1x1x2")]


@needs_gxx
@pytest.mark.mpi
@pytest.mark.parametrize("n,grid", CASES)
def test_padded_host_kernels_under_mpiexec(tmp_path, n, grid):
    rep = run_mpi_worker(__file__, "cpu", tmp_path, n, grid, "force.json")
    assert rep["ranks"] == n and set(rep["actions"]) == {"wilson", "symanzik"}


# --------------------------------------------------------------------------------------------------------------
# GPU under mpiexec

GPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2")]


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid", GPU_CASES)
def test_padded_gpu_force_equals_one_rank(tmp_path, mps, n, grid):  # noqa: F811
    run_gpu_worker(__file__, tmp_path, mps, n, grid, "force.json", f"gauge_force_padded_{n}.json")


# --------------------------------------------------------------------------------------------------------------
# script mode: one worker per rank

def _finish(comm, out, rep, fails):
    write_worker_report(comm, out, "force.json", rep, fails)
    print(f"rank {comm.rank}: {json.dumps(rep)}", flush=True)


def _check(r, what, fails, limit=TOL):
    for k in ("force_rel", "action_rel"):
        if not r[k] <= limit:
            fails.append(f"{what}: {k} {r[k]:.3e}")
    if r.get("padded_calls", 2) != 2:
        fails.append(f"{what}: {r['padded_calls']} padded-kernel calls, not 2")


def _cpu_worker(out, grid_text):
    from comms import ProcessGrid, world
    from lattice import Geometry, GaugeField, geometry, get_backend

    geometry._staging = host_staging
    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    single = single_rank_geometry(DIMS)
    glinks = smooth_links(single)
    grid = ProcessGrid(gdims, transport="shm")
    res = host_checks(grid)
    geom = Geometry(DIMS, get_backend("numpy"), grid)
    rep = {"grid": gdims, "ranks": comm.size, "actions": {}}
    fails = []
    for name, r in res.items():
        gathered = geom.gather(np.moveaxis(r.pop("force"), 0, 4))
        if comm.rank == 0:
            ref = actions()[name].force_reference(GaugeField(single, glinks))
            r["global_force_rel"] = rel(np.moveaxis(gathered, 4, 0), ref)
            if not r["global_force_rel"] <= TOL:
                fails.append(f"{name}: gathered force {r['global_force_rel']:.3e} from the single-rank one")
        _check(r, name, fails)
        rep["actions"][name] = r
    grid.close()
    _finish(comm, out, rep, fails)


def _gpu_worker(out, grid_text):
    import cupy as cp

    from comms import ProcessGrid, world
    from lattice import Geometry, GaugeField, get_backend

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("cupy")
    single = single_rank_geometry(DIMS, "cupy")
    glinks = cp.asarray(smooth_links(Geometry(DIMS, get_backend("numpy"), single.grid)))
    refs = {name: (cp.asnumpy(a.force(GaugeField(single, glinks))), a.action(GaugeField(single, glinks)))
            for name, a in actions().items()}
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "event", "stream_gated"):
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(DIMS, be, grid)
        links = cp.asarray(smooth_links(Geometry(DIMS, get_backend("numpy"), grid)))
        rep["transports"][tr] = {}
        for name, act in actions().items():
            calls = []
            orig = act._padded_links
            act._padded_links = lambda u, orig=orig: calls.append(1) or orig(u)
            f = cp.asnumpy(act.force(GaugeField(geom, links)))
            s = act.action(GaugeField(geom, links))
            ref_f = np.ascontiguousarray(np.moveaxis(geom.local_part(np.moveaxis(refs[name][0], 0, 4)), 4, 0))
            r = {"force_rel": rel(f, ref_f), "force_bitwise": bool(np.array_equal(f, ref_f)),
                 "action_rel": abs(s - refs[name][1]) / abs(refs[name][1]), "padded_calls": len(calls)}
            _check(r, f"{tr} {name}", fails)
            rep["transports"][tr][name] = r
        grid.close()
    _finish(comm, out, rep, fails)


def _bench(lattice_text, transport="stream_gated", iters="20"):
    """Timing on the device (not a test): the Symanzik force and action on the automatic grid of the rank count, ms
    per call (synchronized wall time, median of ``iters``), the padding exchange alone, and on a partitioned grid
    one call of the array path for comparison. Backend cupy (HMC_BACKEND=numpy: the plumbing on a CPU). Rank 0
    prints one JSON line."""
    import os
    import time

    from comms import ProcessGrid, world
    from force.gauge_action import SymanzikAction
    from lattice.placement import Placement, choose
    from lattice import Geometry, GaugeField, get_backend

    comm = world()
    dims = ((int(lattice_text[:-2]),) * 4 if lattice_text.endswith("^4")
            else tuple(int(v) for v in lattice_text.split("x")))
    be = get_backend(os.environ.get("HMC_BACKEND", "cupy"))
    grid = ProcessGrid(None, lattice=dims, transport=transport if be.is_gpu else None)
    geom = Geometry(dims, be, grid)
    u = GaugeField(geom, be.xp.asarray(smooth_links(Geometry(dims, get_backend("numpy"), grid))))
    act = SymanzikAction(7.4, 0.89, 3, "hisq")

    def timed(fn, n):
        ts = []
        for _ in range(n):
            comm.Barrier()
            be.synchronize()
            t0 = time.perf_counter()
            fn()
            be.synchronize()
            ts.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(ts))

    for _ in range(2):
        act.force(u)
        act.action(u)
    path = {Placement.WHOLE: "single-rank kernel", Placement.PADDED: "padded kernel"}.get(
        choose("gauge.force", geom, action=act).placement, "array path")
    rep = {"lattice": dims, "ranks": comm.size, "grid": grid.dims, "transport": transport, "path": path,
           "force_ms": timed(lambda: act.force(u), int(iters)), "action_ms": timed(lambda: act.action(u), int(iters))}
    if any(grid.partitioned):
        rep["padding_ms"] = timed(lambda: geom.padded(be.xp.moveaxis(u.links, 0, 4), act.halo_depth), int(iters))
        rep["array_path_force_ms"] = timed(lambda: act.force_reference(u), 1)
    grid.close()
    if comm.rank == 0:
        print(json.dumps(rep), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] in ("cpu", "gpu"):
        sys.path.insert(0, str(ROOT))
        (_cpu_worker if sys.argv[1] == "cpu" else _gpu_worker)(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "bench":
        sys.path.insert(0, str(ROOT))
        _bench(*sys.argv[2:])
