"""The multigrid kernels on several ranks (solvers.multigrid.cuda): the coarse stencil on a partitioned grid reads an
extended array (local sites, then the faces of ONE depth-1 halo exchange) through HaloTable's neighbour table; the
Kahler-Dirac X^-1 kernel is site-local and serves partitioned grids as they are.

CPU, one process (partitioned dimensions forced onto the halo path): the extended rows the table points at are
bitwise the shifted field; the NumPy contraction through the table equals the array path (Y and the adjoint
stencil, single vectors and batches, local extents 1 and 2); a multigrid solve through the emulated kernel path
(cuda.set_emulation: the references in place of the kernels) equals the array path's and does one halo exchange
per coarse application instead of one per shifted direction.

CPU under mpiexec (2 ranks 1x1x1x2, 4 ranks 1x1x2x2; transports mpi and shm): the same on real decompositions, and
the distributed contraction is bitwise the single-rank one of the global fields.

GPU under mpiexec (pytest -m gpu; HMC_GPU_MPS=1 runs the launches under MPS): on 2 and 4 ranks sharing the GPU, for
transports mpi, event and stream_gated, the multigrid solve equals the single-rank GPU solve (the same outer
iterations, the solution to 1e-12), the kernels serve every coarse application and X^-1 (the stencil through the
extended array), faces travel device to device with the GPU engine (staged through the host with mpi), and the
per-level split charges the coarse exchange to "halo".
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from tests.conftest import keep_gpu_report, launch_env, run_mpi_worker, write_worker_report  # noqa: E402

try:
    from tests.comms.test_gpu_transports import launch as gpu_launch, mps, needs_mpi  # noqa: F401,E402
except Exception:  # pragma: no cover - the GPU test module always imports
    gpu_launch = mps = None
    needs_mpi = pytest.mark.skip(reason="tests.comms.test_gpu_transports is unavailable")

MASS = 0.5                       # Haar-random links: a heavy mass, so that the solve converges (~30 iterations)
SOLVE = dict(levels=3, blocks=[(4, 4, 4, 4)], nv=8, setup_iters=10, coarsest="gcr", raise_on_fail=False)
DIMS = (8, 8, 8, 8)


def crandn(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _coarse_case(geom, block, n, seed):
    """A CoarseOperator of random global blocks Y (the same global array on every rank: local part taken) on the
    coarse lattice of ``geom`` with ``block``, and random global fields (single and 3 columns), local parts."""
    from solvers.multigrid.lattice import CoarseGeometry
    from solvers.multigrid.operators import CoarseOperator, Counter

    cg = CoarseGeometry(geom, block)
    rng = np.random.default_rng(seed)
    nx, ny, nz, nt = cg.dims
    gshape = (nt, nz, ny, nx)
    Yg = crandn(rng, (9,) + gshape + (n, n))
    vg = [crandn(rng, gshape + (n,)), crandn(rng, gshape + (n, 3))]
    Y = np.ascontiguousarray(np.stack([cg.local_part(Yg[d]) for d in range(9)]))
    vs = [np.ascontiguousarray(cg.local_part(v)) for v in vg]
    return CoarseOperator(cg, Y, Counter(), 2), Yg, vg, vs


def table_checks(geom, blocks=((4, 4, 4, 4), (2, 2, 2, 2), (2, 2, 4, 8)), n=4, single=None):
    """The extended-table checks on ``geom`` (NumPy, any grid); returns a dict of results. ``single``: a one-rank
    geometry of the same global lattice, for the bitwise comparison with the global contraction."""
    from solvers.multigrid import cuda as mgcuda
    from solvers.multigrid.lattice import CoarseGeometry

    out = {"rows_are_shifts": True, "apply_rel": 0.0, "adjoint_rel": 0.0, "emulated_bitwise": True,
           "global_bitwise": True, "cases": []}
    for i, block in enumerate(blocks):
        if any(l % b for l, b in zip(geom.local_dims, block)):
            continue
        op, Yg, vg, vs = _coarse_case(geom, block, n, 10 + i)
        cg = op.geom
        nb, halo = mgcuda.tables(cg, np, "stencil")
        out["cases"].append({"block": list(block), "local": list(cg.local_dims), "rows": halo.rows,
                             "faces": [list(k) for k, _, _ in halo.faces]})
        if single is not None:
            cs = CoarseGeometry(single, block)
            nbs = mgcuda.neighbour_table(cs)
        for v, v_glob in zip(vs, vg):
            ext = mgcuda.extended(cg, halo, v)
            w = v.reshape((halo.nsite,) + v.shape[4:])
            # the rows the table points at are the neighbours: x (d = 0), x + mu, x - mu, bitwise
            want = [w] + [cg.shift(v, mu, s).reshape(w.shape) for mu in range(4) for s in (1, -1)]
            out["rows_are_shifts"] &= all(np.array_equal(ext[nb[d]], want[d]) for d in range(9))
            ref = mgcuda.stencil_reference(op.Y, v, nb, ext)
            adj = mgcuda.stencil_reference(op.adjoint_stencil(), v, nb, ext)
            out["apply_rel"] = max(out["apply_rel"], rel(ref, op.apply(v)))
            out["adjoint_rel"] = max(out["adjoint_rel"], rel(adj, op.apply_adjoint(v)))
            old = mgcuda.set_emulation(True)
            try:
                out["emulated_bitwise"] &= bool(np.array_equal(op.apply(v), ref) and
                                                np.array_equal(op.apply_adjoint(v), adj))
            finally:
                mgcuda.set_emulation(old)
            if single is not None:
                glob = mgcuda.stencil_reference(Yg, v_glob, nbs)
                out["global_bitwise"] &= bool(np.array_equal(cg.local_part(glob), ref))
    return out


def _links(geom, seed=8):
    from solver_testlib import random_links

    return random_links(geom, seed=seed)


def _source(geom, seed=6):
    nx, ny, nz, nt = geom.dims
    b = crandn(np.random.default_rng(seed), (nt, nz, ny, nx, 3))
    return np.ascontiguousarray(geom.local_part(b))


def _level_split(st):
    return [{k: d[k] for k in ("level", "time", "compute_time", "halo_time", "halo_exchanges", "reduce_time",
                               "reductions")} for d in st.levels]


def _solve(geom, fat, long, b, emulate=False, maxiter=40):
    from solvers import StaggeredDslash
    from solvers.multigrid import cuda as mgcuda
    from solvers.multigrid import multigrid

    old = mgcuda.set_emulation(emulate)
    try:
        x, st = multigrid(1e-10, maxiter=maxiter, **SOLVE)(StaggeredDslash(geom, fat, long).matrix(MASS)).solve(b)
    finally:
        mgcuda.set_emulation(old)
    return x, st


# --------------------------------------------------------------------------------------------------------------
# CPU, one process

def _forced(partition):
    from comms import ProcessGrid
    from lattice import Geometry, get_backend

    return Geometry(DIMS, get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))


@pytest.mark.parametrize("partition", ["t", "xt", "xyzt"])
def test_extended_table_equals_the_array_path(partition):
    geom = _forced(partition)
    try:
        r = table_checks(geom)
    finally:
        geom.grid.close()
    assert r["rows_are_shifts"], r
    assert r["apply_rel"] < 1e-14 and r["adjoint_rel"] < 1e-14, r
    assert r["emulated_bitwise"], r
    assert [4, 4, 2, 1] in [c["local"] for c in r["cases"]]      # local extent 1 in t: both t hops read faces
    for c in r["cases"]:
        nsite = int(np.prod(c["local"]))
        part = [mu for mu in range(4) if "xyzt"[mu] in partition]
        assert c["faces"] == [[mu, s] for mu in part for s in (0, 1)]
        face = sum(nsite // c["local"][mu] for mu in part)
        assert c["rows"] == nsite + 2 * face


def test_tables_are_cached_per_grid_layout():
    from solvers.multigrid import cuda as mgcuda
    from solvers.multigrid.lattice import CoarseGeometry

    geom = _forced("zt")
    try:
        cg = CoarseGeometry(geom, (2, 2, 2, 2))
        a = mgcuda.tables(cg, np, "stencil")
        assert mgcuda.tables(cg, np, "stencil") is a and a[1] is not None
        assert a[1].dims == [2, 3]
    finally:
        geom.grid.close()
    plain = CoarseGeometry(_plain(), (2, 2, 2, 2))
    nb, halo = mgcuda.tables(plain, np, "stencil")
    assert halo is None and np.array_equal(nb, mgcuda.neighbour_table(plain))


def _plain():
    from lattice import Geometry, get_backend

    return Geometry(DIMS, get_backend("numpy"))


def test_emulated_kernel_path_solve_equals_the_array_path():
    """A few outer iterations (a comparison of iterates, not of convergence) through the emulated kernel path: the
    array path's iterates; the coarse level does one exchange per application (the array path: one per shifted
    partitioned direction)."""
    geom = _forced("zt")
    try:
        fat, long = _links(geom)
        b = _source(geom)
        xa, sa = _solve(geom, fat, long, b, emulate=False, maxiter=6)
        xe, se = _solve(geom, fat, long, b, emulate=True, maxiter=6)
    finally:
        geom.grid.close()
    assert se.iters == sa.iters == 6
    assert rel(xe, xa) < 1e-12
    la, le = sa.levels[2], se.levels[2]
    assert la["applies"] == le["applies"] > 0
    assert le["halo_exchanges"] == le["applies"]                 # one exchange per coarse application
    assert la["halo_exchanges"] == 4 * la["applies"]             # z and t, forward and backward shifts
    for d in se.levels:
        assert abs(d["compute_time"] + d["halo_time"] + d["reduce_time"] - d["time"]) <= 1e-9 + 1e-6 * d["time"]


def test_device_engine_detection_needs_no_cuda_import():
    """On a CPU engine the geometry stages nothing and never imports comms.cuda.transports."""
    code = ("import sys; from lattice import Geometry, get_backend; from lattice.geometry import device_engine;"
            "from comms import ProcessGrid; import numpy as np;"
            "g = Geometry((4, 4, 4, 4), get_backend('numpy'), ProcessGrid((1, 1, 1, 1), partitioned='t'));"
            "f = np.arange(256.0).reshape(4, 4, 4, 4); s = g.shift(f, 3, 1); h = g.halo(f);"
            "assert np.array_equal(s, np.roll(f, -1, axis=0)) and np.array_equal(h[(3, 1)], f[:1]);"
            "assert not device_engine(g.grid.halo);"
            "assert 'comms.cuda.transports' not in sys.modules, 'imported'; g.grid.close(); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=launch_env(),
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# --------------------------------------------------------------------------------------------------------------
# CPU under mpiexec

CPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2")]


@pytest.mark.mpi
@pytest.mark.parametrize("n,grid", CPU_CASES)
def test_distributed_tables_under_mpiexec(tmp_path, n, grid):
    rep = run_mpi_worker(__file__, "cpu", tmp_path, n, grid, "cpu.json")
    for tr in ("mpi", "shm"):
        t = rep["transports"][tr]
        assert t["rows_are_shifts"] and t["emulated_bitwise"] and t["global_bitwise"], (tr, t)
        assert t["apply_rel"] < 1e-14 and t["adjoint_rel"] < 1e-14, (tr, t)
        assert t["solve_iters"] == t["solve_iters_array"] and t["solve_rel"] < 1e-12, (tr, t)
        assert t["coarse_exchanges"] == t["coarse_applies"] > 0, (tr, t)


def _cpu_worker(out, grid_text):
    from comms import ProcessGrid, world
    from comms.grid import _SingleComm
    from lattice import Geometry, get_backend

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("numpy")
    single = Geometry(DIMS, be, ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4))
    rep = {"grid": gdims, "ranks": comm.size, "transports": {}}
    fails = []
    for tr in ("mpi", "shm"):
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(DIMS, be, grid)
        r = table_checks(geom, single=single)
        fat, long = _links(geom)
        b = _source(geom)
        xa, sa = _solve(geom, fat, long, b, emulate=False, maxiter=5)
        xe, se = _solve(geom, fat, long, b, emulate=True, maxiter=5)
        ga, ge = geom.gather(xa), geom.gather(xe)
        r.update(solve_iters=se.iters, solve_iters_array=sa.iters,
                 solve_rel=rel(ge, ga) if grid.is_root else 0.0,
                 coarse_exchanges=se.levels[2]["halo_exchanges"], coarse_applies=se.levels[2]["applies"],
                 levels=_level_split(se))
        for k in ("rows_are_shifts", "emulated_bitwise", "global_bitwise"):
            if not r[k]:
                fails.append(f"{tr}: {k}")
        rep["transports"][tr] = r
        grid.close()
    write_worker_report(comm, out, "cpu.json", rep, fails)


# --------------------------------------------------------------------------------------------------------------
# GPU under mpiexec

GPU_CASES = [(2, "1x1x1x2"), (4, "1x1x2x2")]
TRANSPORTS = ("mpi", "event", "stream_gated")


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid", GPU_CASES)
def test_gpu_multigrid_on_several_ranks_equals_one_rank(tmp_path, mps, n, grid):  # noqa: F811
    gpu_launch(n, [str(Path(__file__)), "gpu", str(tmp_path), grid], mps)
    rep = json.loads(Path(tmp_path, "gpu.json").read_text())
    keep_gpu_report(f"mg_dist_{n}.json", rep)
    assert rep["fails"] == [], rep["fails"]
    ref = rep["reference"]
    assert ref["true_residual"] <= 1e-10 and ref["stencil_calls"] > 0 and ref["extended_calls"] == 0
    for tr in TRANSPORTS:
        t = rep["transports"][tr]
        assert t["iters"] == ref["iters"], (tr, t)
        assert t["solution_rel"] < 1e-12, (tr, t)
        assert t["true_residual"] <= 1e-10, (tr, t)
        assert t["links"] == [tr], (tr, t)
        # the kernels serve every coarse application (through the extended array) and X^-1
        assert t["stencil_calls"] == t["extended_calls"] > 0 and t["block_calls"] > 0, (tr, t)
        assert t["array_path_calls"] == 0, (tr, t)
        # faces: device to device with the GPU engine, through the host with the CPU engine (mpi)
        assert set(t["staging"]) == ({"host"} if tr == "mpi" else {"device"}), (tr, t)
        lv = t["levels"]
        assert lv[2]["halo_exchanges"] >= lv[2]["applies"] > 0 and lv[2]["halo_time"] > 0, (tr, t)
        for d in lv:
            assert abs(d["compute_time"] + d["halo_time"] + d["reduce_time"] - d["time"]) <= 1e-9 + 1e-6 * d["time"]


def _gpu_worker(out, grid_text):
    import cupy as cp

    from comms import ProcessGrid, world
    from comms.grid import _SingleComm
    from lattice import Geometry, get_backend
    from lattice import geometry as geomod
    from solvers.multigrid import cuda as mgcuda
    from solvers.multigrid import operators as mgops

    comm = world()
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("cupy")
    npbe = get_backend("numpy")
    calls = {"stencil": 0, "extended": 0, "block": 0, "array": 0, "staging": set()}

    def wrap(name, key):
        f = getattr(mgcuda, name)

        def g(*a, **k):
            calls[key] += 1
            return f(*a, **k)
        setattr(mgcuda, name, g)

    wrap("stencil", "stencil")
    wrap("extended", "extended")
    wrap("block_apply", "block")
    bmm = mgops.bmm

    def bmm_counted(xp, A, B):                      # the array path's batched products (coarse stencil, X^-1)
        calls["array"] += 1
        return bmm(xp, A, B)
    mgops.bmm = bmm_counted
    staging_of = geomod._staging                 # read by every exchange the lattice's stencils post

    def staging_recorded(geom):
        how = staging_of(geom)
        calls["staging"].add(how)
        return how
    geomod._staging = staging_recorded

    def reset():
        calls.update(stencil=0, extended=0, block=0, array=0, staging=set())

    def counted():
        return {"stencil_calls": calls["stencil"], "extended_calls": calls["extended"],
                "block_calls": calls["block"], "array_path_calls": calls["array"],
                "staging": sorted(calls["staging"])}

    one = ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4)
    gnp = Geometry(DIMS, npbe, one)
    fat, long = _links(gnp)
    b = _source(gnp)
    gref = Geometry(DIMS, be, one)
    reset()
    xr, sr = _solve(gref, cp.asarray(fat), cp.asarray(long), cp.asarray(b))
    xr = cp.asnumpy(xr)
    rep = {"grid": gdims, "ranks": comm.size, "mass": MASS, "solve": {k: str(v) for k, v in SOLVE.items()},
           "reference": {"iters": sr.iters, "true_residual": sr.true_residual, "levels": _level_split(sr),
                         **counted()},
           "transports": {}}
    fails = []

    def local_links(g, a):
        return cp.asarray(np.ascontiguousarray(g.local_part(a.transpose(1, 2, 3, 4, 0, 5, 6)).transpose(
            4, 0, 1, 2, 3, 5, 6)))

    for tr in TRANSPORTS:
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(DIMS, be, grid)
        lb = cp.asarray(np.ascontiguousarray(geom.local_part(b)))
        reset()
        x, st = _solve(geom, local_links(geom, fat), local_links(geom, long), lb)
        r = counted()
        r.update(iters=st.iters, true_residual=st.true_residual, levels=_level_split(st),
                 applies=[d.get("applies", 0) for d in st.levels],
                 solution_rel=rel(cp.asnumpy(x), np.ascontiguousarray(geom.local_part(xr))),
                 lines=st.level_lines(),
                 links=sorted({row["transport"] for row in grid.transport_table(everywhere=True)}))
        for lv, d in zip(r["levels"], st.levels):
            lv["applies"] = d.get("applies", 0)
        rep["transports"][tr] = r
        grid.close()
    write_worker_report(comm, out, "gpu.json", rep, fails)
    if comm.rank == 0:
        for tr in TRANSPORTS:
            print(f"{comm.size} ranks, {tr}:", *rep["transports"][tr]["lines"], sep="\n  ", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] in ("cpu", "gpu"):
        (_cpu_worker if sys.argv[1] == "cpu" else _gpu_worker)(sys.argv[2], sys.argv[3])
