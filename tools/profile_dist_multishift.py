"""Where a multishift CG iteration's time goes on several ranks (issue 5's distributed RHMC): the whole iteration,
and alone the application of A = -D_eo D_oe (two distributed hops, each with its halo exchange), the fused update
and reduction kernels, the exact sum over the ranks, per call, synchronized, median of ``--repeat`` loops.

    mpiexec -n 2 python3 tools/profile_dist_multishift.py --lattice 16 16 16 16 [--transport stream_gated]

Run it under MPS when the ranks share one GPU (python3 -m comms.cuda.mps run -- mpiexec ...). Rank 0 prints one
JSON line. Backend cupy (HMC_BACKEND=numpy for the plumbing on a CPU)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from comms import ProcessGrid, world  # noqa: E402
from lattice import CounterRNG, GaugeField, Geometry, get_backend  # noqa: E402
from solvers import StaggeredDslash, multishift_cg  # noqa: E402
from solvers.operator import fused_blas  # noqa: E402
from tools.profile_hisq import timed  # noqa: E402

SHIFTS = (4e-4, 6e-4, 1.2e-3, 2.7e-3, 6.2e-3, 1.3e-2, 3.1e-2, 6.9e-2, 0.12)   # a light MD approximation's poles


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lattice", type=int, nargs=4, default=(16, 16, 16, 16))
    p.add_argument("--transport", default="stream_gated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--iters", type=int, default=100, help="multishift iterations per timed loop")
    a = p.parse_args(argv)
    be = get_backend(os.environ.get("HMC_BACKEND", "cupy"))
    comm = world()
    grid = ProcessGrid(None, lattice=tuple(a.lattice), transport=a.transport if be.is_gpu else None)
    geom = Geometry(tuple(a.lattice), be, grid)
    xp = geom.xp
    u = GaugeField.random(geom, CounterRNG(3))
    d = StaggeredDslash(geom, u.links, None)
    A = d.even_odd(0.0).normal
    rng = np.random.default_rng(comm.rank)
    b = xp.asarray(rng.standard_normal(geom.shape + (3,)) + 1j * rng.standard_normal(geom.shape + (3,)))
    b = d.even_odd(0.0).prepare(b)
    r = b.copy()
    res = {"lattice": list(a.lattice), "grid": list(grid.dims), "ranks": comm.size, "transport": a.transport,
           "backend": be.name, "shifts": len(SHIFTS)}
    res["A_us"] = 1e6 * timed(be, lambda: A(r), a.repeat, 20)
    blas = fused_blas(A, b)
    res["fused"] = blas is not None
    if blas is not None:
        w = A(r)
        ps = [xp.zeros_like(b) for _ in SHIFTS]
        xs = [xp.zeros_like(b) for _ in SHIFTS]
        s = xp.zeros_like(b)
        coefs = [(1.0, 1e-3, 1e-3)] * len(SHIFTS)
        res["norm2_redot_us"] = 1e6 * timed(be, lambda: blas.norm2_redot(r, w), a.repeat, 20)
        res["ms_update_us"] = 1e6 * timed(be, lambda: blas.multishift_update(s, r, w, ps, xs, coefs, 0.0, 0.0),
                                          a.repeat, 20)
    res["geom_sum_us"] = 1e6 * timed(be, lambda: geom.sum(np.asarray(1.0 + 2.0j)), a.repeat, 50)
    inv = multishift_cg(SHIFTS, tol=1e-30, maxiter=a.iters, raise_on_fail=False, check_residual=False)(A)

    def solve():
        inv.solve(b)

    res["iteration_us"] = 1e6 * timed(be, solve, a.repeat, 1) / a.iters
    grid.close()
    if comm.rank == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
