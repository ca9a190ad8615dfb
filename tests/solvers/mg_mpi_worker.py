"""Worker of tests/solvers/test_multigrid_mpi.py (run under mpiexec, or alone for one rank).

    python mg_mpi_worker.py LATTICE OUT.npz [--transports mpi shm] [--split SX SY SZ ST]

Reads the MILC lattice onto the process grid (HMC_GRID or the default for the rank count), builds HISQ links and
solves M x = b at m = 0.01 by multigrid once per transport (a fresh ProcessGrid each), then two sources at once on
sub-grids (split grid) and the same two on the whole grid. Rank 0 writes the gathered solutions and statistics."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

TOL = 1e-10
MASS = 0.01
KW = dict(nv=8, setup_iters=20, maxiter=100)


def global_source(dims, seed):
    nx, ny, nz, nt = dims
    rng = np.random.default_rng(seed)
    s = (nt, nz, ny, nx, 3)
    return rng.standard_normal(s) + 1j * rng.standard_normal(s)


def main(argv=None):
    from comms import ProcessGrid
    from force.hisq_links import hisq_links
    from lattice import Geometry
    from lattice.io import read_gauge
    from solvers import StaggeredDslash
    from solvers.multigrid import multigrid
    from solvers.multigrid.split import split_grid_solve

    p = argparse.ArgumentParser()
    p.add_argument("lattice")
    p.add_argument("out")
    p.add_argument("--transports", nargs="+", default=["mpi"])
    p.add_argument("--split", type=int, nargs=4, default=None)
    a = p.parse_args(argv)
    out, info = {}, {}
    for t in a.transports:
        grid = ProcessGrid(lattice=(8, 8, 8, 8), transport=t)
        geom = Geometry((8, 8, 8, 8), grid=grid)
        u, _ = read_gauge(a.lattice, geom=geom)
        links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
        D = StaggeredDslash(geom, links.fat, links.long)
        b = geom.xp.asarray(geom.local_part(global_source(geom.dims, 3)))
        x, st = multigrid(TOL, **KW)(D.matrix(MASS)).solve(b)
        xg = geom.gather(x)
        if grid.is_root:
            out[f"x_{t}"] = xg
        info[t] = {"grid": list(grid.dims), "iters": st.iters, "true_residual": st.true_residual,
                   "levels": [{k: d[k] for k in ("level", "time", "compute_time", "halo_time", "halo_exchanges",
                                                 "reduce_time", "reductions")} for d in st.levels],
                   "transports": sorted({r["transport"] for r in grid.transport_table(everywhere=True)})}
        if t == a.transports[-1]:
            srcs = [geom.xp.asarray(geom.local_part(global_source(geom.dims, s))) for s in (11, 12)]
            split = a.split or (1, 1, 1, 1)
            xs, sinfo = split_grid_solve(geom, links.fat, links.long, srcs, split,
                                         lambda D: multigrid(TOL, **KW)(D.matrix(MASS)))
            info["split"] = {"split": list(split), "solves": sinfo}
            for i, xi in enumerate(xs):
                g = geom.gather(xi)
                if grid.is_root:
                    out[f"split_{i}"] = g
            # the same sources, one after the other on the whole grid
            inv = multigrid(TOL, **KW)(D.matrix(MASS))
            for i, bi in enumerate(srcs):
                g = geom.gather(inv.solve(bi)[0])
                if grid.is_root:
                    out[f"single_{i}"] = g
        grid.close()
    if out:
        np.savez(a.out, info=json.dumps(info), **out)
        print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
