"""``hmc bench mg --mg-batch K``: K right-hand sides solved at once by the batched multigrid solve
(solvers/multigrid/batched.py) with the set-up of the single solves, timed for the batched 12-rhs figure."""
from __future__ import annotations

import time


def run_mg_batched(args, geom, rep):
    """K random sources (seeds seed + 100 + j) solved at once with ``rep.inverse`` (bench/mg.py's run_mg); the
    result goes to rep.r["mg"]["batched"] (outer iterations and true residual per column, time)."""
    from hmc.solve import random_source
    from solvers.multigrid.batched import solve_columns

    k, inv = args.mg_batch, getattr(rep, "inverse", None)
    if k <= 0 or inv is None or "mg" not in rep.r:
        return
    rep.start("mg_batched")
    B = geom.xp.stack([geom.xp.asarray(random_source(geom, args.seed + 100 + j)) for j in range(k)], axis=-1)
    t0 = time.perf_counter()
    _, info = solve_columns(inv, B)
    t = time.perf_counter() - t0
    rep.r["mg"]["batched"] = dict(info, columns=k, time_s=t,
                                  converged=bool(max(info["true_residual"]) <= args.tol * 1.0001))
    rep.phase("mg_batched", t0)
