"""Multishift CG (10 shifts) and CG solves on random HISQ-like links, host-driven (solver_graph 0) against device-resident
(solver_graph 8) iterations, on the process grid of argv; rank 0 prints JSON. Run on a GPU, ranks under MPS:
    PYTHONPATH=. python3 -m comms.cuda.mps run -- mpiexec -n 2 python3 tools/solver_graph_timing.py 16x16x16x16 1x1x1x2 stream_gated
(runs/scaling/h200_device_resident/README.md has the figures)."""
import sys, time, json
import numpy as np
sys.path.insert(0, ".")
import cupy as cp
from comms import ProcessGrid, world
from comms.config import RunConfig
from lattice import CounterRNG, Geometry, get_backend
from solvers import StaggeredDslash, cg, multishift_cg

dims = tuple(int(v) for v in sys.argv[1].split("x"))
gdims = tuple(int(v) for v in sys.argv[2].split("x"))
tr = sys.argv[3]
comm = world()

def links(geom, rng, stream, scale):
    g = rng.gaussian(stream, geom.site_ids(), 4 * 18).reshape(tuple(geom.shape) + (4, 3, 3, 2))
    m = (g[..., 0] + 1j * g[..., 1]) * scale
    eye = np.eye(3)[None, None, None, None, None]
    return geom.xp.ascontiguousarray(geom.xp.moveaxis(cp.asarray(m) + cp.asarray(eye), -3, 0))

out = {}
for iters in (0, 8):
    cfg = RunConfig(backend="cupy", solver_graph=iters)
    grid = ProcessGrid(gdims, transport=tr if comm.size > 1 else None, config=cfg)
    geom = Geometry(dims, get_backend("cupy"), grid)
    rng = CounterRNG(5)
    fat, long = links(geom, rng, "fat", 0.08) * 0.45, links(geom, rng, "long", 0.02) * 0.02
    d = StaggeredDslash(geom, fat, long)
    A = d.even_odd(0.0).normal
    g = rng.gaussian("src", geom.site_ids(), 6).reshape(tuple(geom.shape) + (3, 2))
    b = cp.asarray(g[..., 0] + 1j * g[..., 1]) * cp.asarray((geom.parity() == 0)[..., None])
    shifts = list(np.geomspace(4e-4, 2.0, 10))
    res = {}
    for name, make in (("ms", lambda: multishift_cg(shifts, 1e-8, 5000, check_residual=False)(A)),
                       ("cg", lambda: cg(1e-10, 5000)(A.shifted(0.0) if False else d.even_odd(0.02).normal))):
        inv = make()
        inv.solve(b)
        cp.cuda.Device().synchronize(); comm.Barrier()
        ts, its = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            x, st = inv.solve(b)
            cp.cuda.Device().synchronize(); comm.Barrier()
            ts.append(time.perf_counter() - t0); its.append(st.iters)
        res[name] = {"s": min(ts), "iters": its[-1], "us_per_iter": 1e6 * min(ts) / its[-1],
                     "replays": st.extra.get("graph_replays"), "captures": st.extra.get("graph_captures"), "capture_s": st.extra.get("graph_capture_s")}
    out[iters] = res
    grid.close()
if comm.rank == 0:
    print(json.dumps({"lattice": dims, "grid": gdims, "transport": tr, "ranks": comm.size, "res": out}))
