"""The forward HISQ/asqtad link smearing on halo-padded links (force/hisq_cuda.py ``pad``, ``fat_link`` and
``naik_link`` with ``lattice.padded.PaddedLinks``; the partitioned-grid path of force/smearing.py and force/hisq_links.py): the links are
padded once per level (Geometry.padded, depth = the farthest a path of the level reads: 1 for fat7, 2 with Lepage
terms and for the Naik term), then the single-GPU staple and Naik kernels run in padded coordinates.

CPU (always, where g++ is present): the kernels compiled for the host (tests/force/cuda_host.py: FakeCuPy) on one
process with forced partitions, and under mpiexec on 2 ranks (1x1x1x2) and 4 ranks (1x1x2x2, 2x1x1x2), transports
mpi and shm: fat7, HISQ level 2 and asqtad fat links, the Naik link, and the HISQ / asqtad fermion links (fat and
long, phases folded in) equal the array path on the same grid to 1e-13, and the gathered fermion links equal the
single-rank array path's. GPU under mpiexec (pytest -m gpu; HMC_GPU_MPS=1 runs the launches under MPS): on 2 and 4
ranks sharing the GPU, transports mpi, event and stream_gated, the HISQ fat and long links equal the single-rank GPU
links (the unpadded kernels) to 1e-13.
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
EPS = (0.0, -0.05)          # the Naik epsilons of hisq_links_multi (light and charm-like)


def count_pads(store):
    """Wrap hisq_cuda.pad so that each call appends its depth to ``store``; returns the undo function."""
    from force import hisq_cuda

    orig = hisq_cuda.pad

    def counted(geom, links, depth):
        store.append(depth)
        return orig(geom, links, depth)

    hisq_cuda.pad = counted
    return lambda: setattr(hisq_cuda, "pad", orig)


def fermion_links(geom, links):
    """{name: (fat, long)} of the HISQ links for :data:`EPS` and the asqtad links (unphased input links)."""
    from force.hisq_links import asqtad_links, hisq_links_multi
    from lattice import GaugeField

    u = GaugeField(geom, links)
    out = {f"hisq eps={fl.eps:g}": (fl.fat, fl.long) for fl in hisq_links_multi(u, EPS)}
    a = asqtad_links(u, 0.87)
    out["asqtad"] = (a.fat, a.long)
    return out


def host_checks(grid) -> dict:
    """On one decomposition: the padded host kernels (stand-in CuPy geometry) against the array path (NumPy geometry
    on the same grid): each fat-link table, the Naik link, and the fermion links; the depths hisq_cuda.pad was
    called with. Returns the relative differences and the kernels' fermion links."""
    from force import smearing as sm
    from lattice import Geometry, get_backend
    from lattice.backend import Backend

    cpu = Geometry(DIMS, get_backend("numpy"), grid)
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), grid)
    links = smooth_links(cpu)
    res = {"rel": {}, "pads": {}}
    tables = {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}
    for name, c in tables.items():
        pads = []
        undo = count_pads(pads)
        try:
            got = sm.fat_link(host, links, c)
        finally:
            undo()
        res["rel"][f"fat {name}"] = rel(got, sm.fat_link(cpu, links, c))
        res["pads"][f"fat {name}"] = pads
    pads = []
    undo = count_pads(pads)
    try:
        got = sm.naik_link(host, links, -1 / 24)
        res["pads"]["naik"] = list(pads)
        pads.clear()
        got_links = fermion_links(host, links)
        res["pads"]["fermion links"] = pads
    finally:
        undo()
    res["rel"]["naik"] = rel(got, sm.naik_link(cpu, links, -1 / 24))
    ref_links = fermion_links(cpu, links)
    for name, (fat, long) in got_links.items():
        res["rel"][f"{name} fat"] = rel(fat, ref_links[name][0])
        res["rel"][f"{name} long"] = rel(long, ref_links[name][1])
    res["links"] = got_links
    return res


#: the depths hisq_cuda.pad is called with: fat7 1, Lepage 2, Naik 2; the fermion links: HISQ (level 1 at 1, level
#: 2 and Naik at 2) for each hisq_links_multi call (one), asqtad (one pad of 2 for fat and long)
EXPECTED_PADS = {"fat fat7": [1], "fat level2": [2], "fat asqtad": [2], "naik": [2], "fermion links": [1, 2, 2]}


def failures(res, what="") -> list:
    fails = [f"{what}{k}: {v:.3e}" for k, v in res["rel"].items() if not v <= TOL]
    fails += [f"{what}pad depths of {k}: {res['pads'].get(k)} not {v}" for k, v in EXPECTED_PADS.items()
              if res["pads"].get(k) != v]
    return fails


# --------------------------------------------------------------------------------------------------------------
# CPU, one process

def test_depths_from_the_paths():
    from force import hisq_cuda, smearing as sm

    assert hisq_cuda.fat_depth(sm.FAT7) == 1
    assert hisq_cuda.fat_depth(sm.HISQ_LEVEL2) == 2 and hisq_cuda.fat_depth(sm.asqtad_coefficients(0.9)) == 2
    assert hisq_cuda.naik_depth() == 2
    assert len(hisq_cuda.fat_paths(sm.FAT7)) == 4 * (1 + 6 + 24 + 48)
    assert len(hisq_cuda.fat_paths(sm.HISQ_LEVEL2)) == 4 * (1 + 6 + 24 + 48 + 12)   # 6 Lepage + 6 retraced
    # a forward step reads at the site it leaves, a backward one at the site it reaches
    assert hisq_cuda.read_depth([(1, 1, 1)]) == 2 and hisq_cuda.read_depth([(-1, -1)]) == 2
    assert hisq_cuda.read_depth([(2, 2, 1, -2, -2)]) == 2 and hisq_cuda.read_depth([(2, 1, -2)]) == 1


@needs_gxx
def test_unpadded_path_unchanged(monkeypatch):
    """One process, nothing partitioned: the single-GPU kernels (box = lattice), no padding."""
    from force import hisq_cuda, smearing as sm
    from lattice import Geometry, get_backend
    from lattice.backend import Backend

    cpu = Geometry(DIMS, get_backend("numpy"))
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    assert hisq_cuda.active(host) and not hisq_cuda.padded_active(host, 1)
    monkeypatch.setattr(hisq_cuda, "pad", lambda *a: pytest.fail("padded on an unpartitioned lattice"))
    links = smooth_links(cpu)
    for c in (sm.FAT7, sm.HISQ_LEVEL2):
        assert rel(sm.fat_link(host, links, c), sm.fat_link(cpu, links, c)) <= TOL
    got, ref = fermion_links(host, links), fermion_links(cpu, links)
    for name in ref:
        assert rel(got[name][0], ref[name][0]) <= TOL and rel(got[name][1], ref[name][1]) <= TOL


@needs_gxx
@pytest.mark.parametrize("partition", ["t", "xt", "xyzt"])
def test_padded_host_kernels_one_process(monkeypatch, partition):
    with forced_partition(monkeypatch, partition) as grid:
        res = host_checks(grid)
    assert failures(res) == [], res["rel"]


def test_gate():
    """The padded kernels: a GPU backend, a partitioned grid, local extents >= the depth (a thinner one, or an
    unpartitioned grid, keeps the current path), and the kernels enabled."""
    from types import SimpleNamespace as NS

    from comms.config import RunConfig
    from force import hisq_cuda

    def geom(local, parts, gpu=True):
        return NS(local_dims=local, grid=NS(partitioned=parts), backend=NS(is_gpu=gpu), config=RunConfig())

    thin = geom((1, 4, 4, 4), (True, False, False, False))
    assert hisq_cuda.padded_active(thin, 1) and not hisq_cuda.padded_active(thin, 2)
    assert hisq_cuda.padded_active(geom((2, 4, 4, 2), (True, False, False, True)), 2)
    assert not hisq_cuda.padded_active(geom((2, 4, 4, 2), (True, False, False, True), gpu=False), 1)
    assert not hisq_cuda.padded_active(geom((4, 4, 4, 4), (False,) * 4), 1)


# --------------------------------------------------------------------------------------------------------------
# CPU under mpiexec

CASES = [(2, "1x1x1x2"), (4, "1x1x2x2"), (4, "2x1x1x2")]


@needs_gxx
@pytest.mark.mpi
@pytest.mark.parametrize("n,grid", CASES)
def test_padded_host_kernels_under_mpiexec(tmp_path, n, grid):
    rep = run_mpi_worker(__file__, "cpu", tmp_path, n, grid, "smearing.json")
    assert rep["ranks"] == n and set(rep["transports"]) == {"mpi", "shm"}


# --------------------------------------------------------------------------------------------------------------
# GPU under mpiexec

GPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2")]


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid", GPU_CASES)
def test_padded_gpu_links_equal_one_rank(tmp_path, mps, n, grid):  # noqa: F811
    run_gpu_worker(__file__, tmp_path, mps, n, grid, "smearing.json", f"hisq_smearing_padded_{n}.json")


# --------------------------------------------------------------------------------------------------------------
# script mode: one worker per rank

def _finish(comm, out, rep, fails):
    write_worker_report(comm, out, "smearing.json", rep, fails)
    print(f"rank {comm.rank}: {json.dumps(rep)}", flush=True)


def _global_check(geom, local, ref, what, fails):
    """Gather a (4, site...) field and compare it with the single-rank ``ref`` on rank 0."""
    gathered = geom.gather(np.moveaxis(np.asarray(local), 0, 4))
    if gathered is not None:
        r = rel(np.moveaxis(gathered, 4, 0), ref)
        if not r <= TOL:
            fails.append(f"{what}: gathered {r:.3e} from the single-rank links")
        return r
    return None


def _cpu_worker(out, grid_text):
    from comms import ProcessGrid, world
    from lattice import Geometry, geometry, get_backend

    geometry._staging = host_staging
    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    single = single_rank_geometry(DIMS)
    refs = fermion_links(single, smooth_links(single)) if comm.rank == 0 else {}
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "shm"):
        grid = ProcessGrid(gdims, transport=tr)
        res = host_checks(grid)
        geom = Geometry(DIMS, get_backend("numpy"), grid)
        fails += failures(res, f"{tr} ")
        for name, (fat, long) in res.pop("links").items():
            for k, f in (("fat", fat), ("long", long)):
                g = _global_check(geom, f, refs.get(name, (None, None))[k == "long"], f"{tr} {name} {k}", fails)
                if g is not None:
                    res["rel"][f"{name} {k} global"] = g
        rep["transports"][tr] = res
        grid.close()
    _finish(comm, out, rep, fails)


def _gpu_worker(out, grid_text):
    import cupy as cp

    from comms import ProcessGrid, world
    from force.hisq_links import hisq_links_multi
    from lattice import Geometry, GaugeField, get_backend

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("cupy")
    single = single_rank_geometry(DIMS, "cupy")
    glinks = cp.asarray(smooth_links(Geometry(DIMS, get_backend("numpy"), single.grid)))
    refs = [(cp.asnumpy(fl.fat), cp.asnumpy(fl.long)) for fl in hisq_links_multi(GaugeField(single, glinks), EPS)]
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "event", "stream_gated"):
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(DIMS, be, grid)
        links = cp.asarray(smooth_links(Geometry(DIMS, get_backend("numpy"), grid)))
        pads = []
        undo = count_pads(pads)
        try:
            got = hisq_links_multi(GaugeField(geom, links), EPS)
        finally:
            undo()
        r = {"pads": pads}
        for fl, (rf, rl) in zip(got, refs):
            for k, a, ref in (("fat", fl.fat, rf), ("long", fl.long, rl)):
                loc = np.ascontiguousarray(np.moveaxis(geom.local_part(np.moveaxis(ref, 0, 4)), 4, 0))
                a = cp.asnumpy(a)
                r[f"eps={fl.eps:g} {k}"] = rel(a, loc)
                r[f"eps={fl.eps:g} {k} bitwise"] = bool(np.array_equal(a, loc))
                if not r[f"eps={fl.eps:g} {k}"] <= TOL:
                    fails.append(f"{tr} eps={fl.eps:g} {k}: {r[f'eps={fl.eps:g} {k}']:.3e}")
        if pads != [1, 2]:
            fails.append(f"{tr}: pad depths {pads}, not [1, 2]")
        rep["transports"][tr] = r
        grid.close()
    _finish(comm, out, rep, fails)


def _bench(lattice_text, transport="stream_gated", iters="10"):
    """Timing on the device (not a test): the HISQ fermion links (``hisq_links_multi`` for :data:`EPS`: fat7, U(3)
    projection, level 2 and Naik) on the automatic grid of the rank count, ms per call (synchronized wall time,
    median of ``iters``), the two paddings alone, and on a partitioned grid one call of the array path for
    comparison. Backend cupy (HMC_BACKEND=numpy: the plumbing on a CPU). Rank 0 prints one JSON line."""
    import os
    import time

    from comms import ProcessGrid, world
    from force import hisq_cuda
    from force.hisq_links import hisq_links_multi
    from lattice import Geometry, GaugeField, get_backend

    comm = world()
    dims = ((int(lattice_text[:-2]),) * 4 if lattice_text.endswith("^4")
            else tuple(int(v) for v in lattice_text.split("x")))
    be = get_backend(os.environ.get("HMC_BACKEND", "cupy"))
    grid = ProcessGrid(None, lattice=dims, transport=transport if be.is_gpu else None)
    geom = Geometry(dims, be, grid)
    u = GaugeField(geom, be.xp.asarray(smooth_links(Geometry(dims, get_backend("numpy"), grid))))

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
        hisq_links_multi(u, EPS)
    path = ("single-rank kernels" if hisq_cuda.active(geom) else
            "padded kernels" if hisq_cuda.padded_active(geom, 2) else "array path")
    rep = {"lattice": dims, "ranks": comm.size, "grid": grid.dims, "transport": transport, "path": path,
           "links_ms": timed(lambda: hisq_links_multi(u, EPS), int(iters))}
    if any(grid.partitioned):
        rep["padding_ms"] = timed(lambda: (hisq_cuda.pad(geom, u.links, 1), hisq_cuda.pad(geom, u.links, 2)),
                                  int(iters))
        from lattice.placement import Placement, without

        with without(Placement.PADDED):
            rep["array_path_links_ms"] = timed(lambda: hisq_links_multi(u, EPS), 1)
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
