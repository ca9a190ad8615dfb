"""The HISQ/asqtad fermion force's chain rule on halo-padded fields (force/hisq_cuda.py ``fat_link_vjp``,
``naik_link_vjp`` with ``box``/``d_box``, ``outer_acc`` with padded colour vectors; the partitioned-grid path of
force/smearing_derivative.py and force/hisq_force.py): the links and the incoming derivative are padded alike
(Geometry.padded, depth VJP_DEPTH = 2 for the smearing and Naik adjoints, 3 for the vectors of the outer products),
then the single-GPU kernels run on the interior grown by what each later stage reads.

CPU (always, where g++ is present): the kernels compiled for the host (tests/force/cuda_host.py: FakeCuPy) on one
process with forced partitions, and under mpiexec on 2 ranks (1x1x1x2) and 4 ranks (1x1x2x2), transports mpi and
shm: the smearing adjoint for fat7, HISQ level 2 and asqtad, the Naik adjoint, the outer products and the whole
HISQ force (two Naik-epsilon groups) equal the array path on the same grid, and the gathered results equal the
single-rank array path's; regions smaller than the stages read give wrong results. GPU under mpiexec (pytest -m
gpu; HMC_GPU_MPS=1 runs the launches under MPS): on 2 and 4 ranks sharing the GPU, transports mpi, event and
stream_gated, the outer products and the HISQ force equal the single-rank GPU results (the unpadded kernels).
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
from tests.force.test_hisq_smearing_padded import count_pads  # noqa: E402
from tests.gpu_mpi import mps, needs_mpi, run_gpu_worker  # noqa: F401,E402

DIMS = (4, 4, 6, 8)         # local extents >= 2 everywhere on 1x1x1x2 and 1x1x2x2, and with every dimension forced
TOL = 1e-13
FORCE_TOL = 1e-12           # through the U(3) projection's derivative as well
EPS = (0.0, -0.05)


def _global_field(geom, stream, trailing, seed=11):
    """A complex field with site axes first and ``trailing`` = (k,) + shape behind them, from counter-based random
    numbers keyed by global site (every decomposition holds the local part of the same global field). NumPy, for a
    geometry of any backend."""
    from lattice import CounterRNG, Geometry, get_backend

    if geom.backend.name != "numpy":
        geom = Geometry(geom.dims, get_backend("numpy"), geom.grid)
    n = int(np.prod(trailing))
    g = CounterRNG(seed).gaussian(stream, geom.site_ids(), 2 * n).reshape(tuple(geom.shape) + tuple(trailing) + (2,))
    return g[..., 0] + 1j * g[..., 1]


def link_field(geom, stream):
    """A random complex (4, nt, nz, ny, nx, 3, 3) field (an incoming link derivative)."""
    return np.ascontiguousarray(np.moveaxis(_global_field(geom, stream, (4, 3, 3)), 4, 0))


def vectors(geom, n=3):
    return [np.ascontiguousarray(_global_field(geom, f"z{k}", (3,))) for k in range(n)]


def chain(geom, links):
    """{name: field} of every checked quantity on ``geom``'s backend (host copies, NumPy)."""
    from force import smearing as sm
    from force.hisq_force import add_outer_products, asqtad_link_derivative, hisq_force_terms
    from force.smearing_derivative import fat_link_vjp, naik_link_vjp
    from lattice import GaugeField

    xp = geom.xp
    u = xp.asarray(links)
    d = xp.asarray(link_field(geom, "d"))
    out = {}
    for name, c in (("fat7", sm.FAT7), ("level2", sm.HISQ_LEVEL2), ("asqtad", sm.asqtad_coefficients(0.87))):
        out[f"vjp {name}"] = fat_link_vjp(geom, u, c, d)
    out["naik vjp"] = naik_link_vjp(geom, u, -1 / 24, d)
    f_acc, l_acc = xp.zeros_like(u), xp.zeros_like(u)
    add_outer_products(geom, [xp.asarray(z) for z in vectors(geom)], np.array([0.7, -0.2, 1.3]), f_acc, l_acc)
    out["outer fat"], out["outer long"] = f_acc, l_acc
    fat_o = {e: xp.asarray(link_field(geom, f"f{k}")) for k, e in enumerate(EPS)}
    long_o = {e: xp.asarray(link_field(geom, f"l{k}")) for k, e in enumerate(EPS)}
    out["hisq force"] = hisq_force_terms(GaugeField(geom, u), fat_o, long_o).pdot
    out["asqtad d_u"] = asqtad_link_derivative(GaugeField(geom, u), 0.87, fat_o[0.0], long_o[0.0])
    return {k: geom.backend.to_numpy(v) for k, v in out.items()}


def tolerance(name):
    return FORCE_TOL if name == "hisq force" else TOL


def host_checks(grid) -> dict:
    """On one decomposition: the host kernels (stand-in CuPy geometry) against the array path (NumPy geometry on the
    same grid); the depths hisq_cuda.pad was called with. Returns the relative differences and the kernels' fields."""
    from lattice import Geometry, get_backend
    from lattice.backend import Backend

    cpu = Geometry(DIMS, get_backend("numpy"), grid)
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()), grid)
    links = smooth_links(cpu)
    pads = []
    undo = count_pads(pads)
    try:
        got = chain(host, links)
    finally:
        undo()
    ref = chain(cpu, links)
    return {"rel": {k: rel(got[k], ref[k]) for k in ref}, "pads": pads, "fields": got}


def padded_here(grid) -> bool:
    from force import hisq_cuda
    from lattice import Geometry
    from lattice.backend import Backend

    return hisq_cuda.padded_active(Geometry(DIMS, Backend("cupy", FakeCuPy()), grid), hisq_cuda.VJP_DEPTH)


#: the pads of :func:`chain`, links and incoming derivative in one (hisq_cuda.pad_alike): three smearing adjoints,
#: one Naik adjoint, the HISQ force (level 2, its Naik term and level 1), the asqtad force (smearing and Naik):
#: depth 2; the HISQ force's forward level 1 (fat7): depth 1
EXPECTED_PADS = {2: 3 + 1 + 3 + 2, 1: 1}


def failures(res, padded, what="") -> list:
    fails = [f"{what}{k}: {v:.3e}" for k, v in res["rel"].items() if not v <= tolerance(k)]
    counts = {d: res["pads"].count(d) for d in set(res["pads"])}
    if padded and counts != EXPECTED_PADS:
        fails.append(f"{what}pad depths {res['pads']}")
    return fails


# --------------------------------------------------------------------------------------------------------------
# CPU, one process

@needs_gxx
@pytest.mark.parametrize("partition", ["t", "zt", "xyzt"])
def test_padded_host_kernels_one_process(monkeypatch, partition):
    """Forced partitions of one process take the padded kernels; every result equals the array path's."""
    with forced_partition(monkeypatch, partition) as grid:
        assert padded_here(grid)
        res = host_checks(grid)
    assert failures(res, True) == [], (res["rel"], res["pads"])


@needs_gxx
@pytest.mark.parametrize("stage", ["forward", "d_inner", "d_arg"])
def test_smaller_regions_fail(monkeypatch, stage):
    """The negative control of the region schedule: one stage on the bare interior (every dimension
    partitioned) gives a wrong smearing adjoint for fat7 and HISQ level 2."""
    from force import hisq_cuda, smearing as sm
    from force.smearing_derivative import fat_link_vjp
    from lattice import Geometry, get_backend
    from lattice.backend import Backend

    monkeypatch.setitem(hisq_cuda._VJP_GROW, stage, 0)
    with forced_partition(monkeypatch, "xyzt") as grid:
        cpu, host = Geometry(DIMS, get_backend("numpy"), grid), Geometry(DIMS, Backend("cupy", FakeCuPy()), grid)
        links, d = smooth_links(cpu), link_field(cpu, "d")
        for c in (sm.FAT7, sm.HISQ_LEVEL2):
            assert rel(fat_link_vjp(host, links, c, d), fat_link_vjp(cpu, links, c, d)) > 1e-3


@needs_gxx
def test_unpadded_force_path_unchanged(monkeypatch):
    """Nothing partitioned: the single-GPU kernels, no padding."""
    from force import hisq_cuda
    from lattice import Geometry, get_backend
    from lattice.backend import Backend

    monkeypatch.setattr(hisq_cuda, "pad", lambda *a: pytest.fail("padded on an unpartitioned lattice"))
    cpu = Geometry(DIMS, get_backend("numpy"))
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    links = smooth_links(cpu)
    got, ref = chain(host, links), chain(cpu, links)
    assert {k: rel(got[k], ref[k]) for k in ref if rel(got[k], ref[k]) > tolerance(k)} == {}


# --------------------------------------------------------------------------------------------------------------
# CPU under mpiexec

CASES = [(2, "1x1x1x2"), (4, "1x1x2x2")]


@needs_gxx
@pytest.mark.mpi
@pytest.mark.parametrize("n,grid", CASES)
def test_padded_host_kernels_under_mpiexec(tmp_path, n, grid):
    rep = run_mpi_worker(__file__, "cpu", tmp_path, n, grid, "force.json")
    assert rep["ranks"] == n and set(rep["transports"]) == {"mpi", "shm"}
    for tr in ("mpi", "shm"):
        assert rep["transports"][tr]["padded"]
        assert set(rep["transports"][tr]["global"]) >= {"hisq force", "outer long", "vjp level2"}


# --------------------------------------------------------------------------------------------------------------
# GPU under mpiexec

GPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2")]


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid", GPU_CASES)
def test_padded_gpu_force_equals_one_rank(tmp_path, mps, n, grid):  # noqa: F811
    run_gpu_worker(__file__, tmp_path, mps, n, grid, "force.json", f"hisq_force_padded_{n}.json")


# --------------------------------------------------------------------------------------------------------------
# script mode: one worker per rank

def _local(geom, ref):
    """This rank's block of a single-rank (4, site...) or (site..., k) field."""
    if ref.ndim == 7:
        return np.ascontiguousarray(np.moveaxis(geom.local_part(np.moveaxis(ref, 0, 4)), 4, 0))
    return np.ascontiguousarray(geom.local_part(ref))


def _cpu_worker(out, grid_text):
    from comms import ProcessGrid, world
    from lattice import Geometry, geometry, get_backend

    geometry._staging = host_staging
    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    single = single_rank_geometry(DIMS)
    refs = chain(single, smooth_links(single))
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "shm"):
        grid = ProcessGrid(gdims, transport=tr)
        res = host_checks(grid)
        res["padded"] = padded_here(grid)
        fails += failures(res, res["padded"], f"{tr} ")
        geom = Geometry(DIMS, get_backend("numpy"), grid)
        res["global"] = {}
        for name, f in res.pop("fields").items():
            r = rel(f, _local(geom, refs[name]))
            res["global"][name] = r
            if not r <= tolerance(name):
                fails.append(f"{tr} {name}: {r:.3e} from the single-rank array path")
        rep["transports"][tr] = res
        grid.close()
    write_worker_report(comm, out, "force.json", rep, fails)
    print(f"rank {comm.rank}: {json.dumps(rep)}", flush=True)


def _gpu_worker(out, grid_text):
    import cupy as cp

    from comms import ProcessGrid, world
    from lattice import Geometry, get_backend

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("cupy")
    single = single_rank_geometry(DIMS, "cupy")
    refs = chain(single, cp.asarray(smooth_links(Geometry(DIMS, get_backend("numpy"), single.grid))))
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "event", "stream_gated"):
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(DIMS, be, grid)
        pads = []
        undo = count_pads(pads)
        try:
            got = chain(geom, cp.asarray(smooth_links(Geometry(DIMS, get_backend("numpy"), grid))))
        finally:
            undo()
        r = {"pads": pads}
        for name, f in got.items():
            r[name] = rel(f, _local(geom, refs[name]))
            if not r[name] <= tolerance(name):
                fails.append(f"{tr} {name}: {r[name]:.3e} from the single-rank GPU result")
        if {dp: pads.count(dp) for dp in set(pads)} != EXPECTED_PADS:
            fails.append(f"{tr}: pad depths {pads}")
        rep["transports"][tr] = r
        grid.close()
    write_worker_report(comm, out, "force.json", rep, fails)
    print(f"rank {comm.rank}: {json.dumps(rep)}", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "cpu":
        _cpu_worker(sys.argv[2], sys.argv[3])
    elif mode == "gpu":
        _gpu_worker(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
