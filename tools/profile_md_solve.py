"""Where the time of one MD force solve goes on one GPU (issue 19): the production light pseudofermion's multishift
at MD tolerance 1e-5, in double, in single (the first stage alone), and MILC's cgprec 1 (single, then every shift's
true residual checked and refined in double), against the operator alone and the multishift's cost per shift.
Random HISQ-like links (tools/solver_graph_timing.py's recipe), 9 shifts spread like the light rational's MD poles.

    PYTHONPATH=. python3 tools/profile_md_solve.py 32 [--tol 1e-5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import cupy as cp

from comms.config import RunConfig
from lattice import CounterRNG, Geometry, get_backend
from solvers import StaggeredDslash, multishift_cg
from solvers.multishift import mixed_multishift_cg

SHIFTS = list(np.geomspace(2e-4, 1.5, 9))


def links(geom, rng, stream, scale):
    g = rng.gaussian(stream, geom.site_ids(), 4 * 18).reshape(tuple(geom.shape) + (4, 3, 3, 2))
    m = (g[..., 0] + 1j * g[..., 1]) * scale
    eye = np.eye(3)[None, None, None, None, None]
    return cp.ascontiguousarray(cp.moveaxis(cp.asarray(m) + cp.asarray(eye), -3, 0))


def timed(f, repeat=3):
    f()
    cp.cuda.Device().synchronize()
    ts, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = f()
        cp.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t0)
    return min(ts), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("L", type=int)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--json")
    a = ap.parse_args()
    geom = Geometry((a.L,) * 4, get_backend("cupy"))
    rng = CounterRNG(5)
    d = StaggeredDslash(geom, links(geom, rng, "fat", 0.08) * 0.45, links(geom, rng, "long", 0.02) * 0.02)
    A = d.even_odd(0.0).normal
    A32 = A.converted(np.complex64)
    g = rng.gaussian("src", geom.site_ids(), 6).reshape(tuple(geom.shape) + (3, 2))
    b = cp.asarray(g[..., 0] + 1j * g[..., 1]) * cp.asarray((geom.parity() == 0)[..., None])
    b32 = b.astype(np.complex64)
    res = {"L": a.L, "tol": a.tol, "shifts": SHIFTS}
    w, w32 = cp.empty_like(b), cp.empty_like(b32)
    for name, op, v, out in (("op_double", A, b, w), ("op_single", A32, b32, w32)):
        t, _ = timed(lambda: [op.apply_into(v, out) for _ in range(20)])
        res[name + "_us"] = 1e6 * t / 20
    for name, make, src in (
            ("ms_double", lambda: multishift_cg(SHIFTS, a.tol, 5000, check_residual=False)(A), b),
            ("ms_single_stage", lambda: multishift_cg(SHIFTS, a.tol, 5000, check_residual=False)(A32), b32),
            ("ms_single_1shift", lambda: multishift_cg(SHIFTS[:1], a.tol, 5000, check_residual=False)(A32), b32),
            ("ms_single_5shift", lambda: multishift_cg(SHIFTS[:5], a.tol, 5000, check_residual=False)(A32), b32),
            ("mixed_cgprec1", lambda: mixed_multishift_cg(SHIFTS, a.tol, 5000)(A), b)):
        inv = make()
        t, (x, st) = timed(lambda: inv.solve(src, check=False))
        ref = st.extra.get("refine") or []
        res[name] = {"s": t, "iters": st.iters, "us_per_iter": 1e6 * t / max(st.iters, 1),
                     "matvecs": st.matvecs, "refine_iters": [r.iters for r in ref],
                     "refine_s": sum(r.time for r in ref), "true_residual": st.true_residual}
    print(json.dumps(res, indent=1, default=float))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=float)


if __name__ == "__main__":
    main()
