"""What stopping the converged shifts of a multishift solve saves (``stop_converged``, the deck's ``[fermions]
stop_converged_shifts``; QUDA's rule, MILC 7 updates every shift): the light MD solve of tools/profile_md_solve.py
(9 shifts 2e-4 .. 1.5, random HISQ-like links), in double and as MILC's cgprec 1 (single, then every shift refined in
double), with every shift updated to the end and with the converged shifts stopped: iterations, the shift updates
made (sum over iterations of the shifts still updated) against n x iterations, the refinement iterations, the worst
true residual against the tolerance, and the time.

    PYTHONPATH=. python3 tools/shift_stop_study.py 8 --backend numpy          # the CPU figure (~1 min)
    PYTHONPATH=. python3 tools/shift_stop_study.py 32 --backend cupy          # on the device
"""
from __future__ import annotations

import argparse
import time

from solvers import mixed_precision, multishift_cg
from tools.profile_md_solve import SHIFTS, problem


def run(geom, A, b, tol, stop, mixed):
    make = multishift_cg(SHIFTS, tol, 20000, raise_on_fail=True, check_residual=True, stop_converged=stop)
    inv = (mixed_precision(make) if mixed else make)(A)
    inv.solve(b)                                    # warm-up (kernels, graphs)
    geom.backend.synchronize()
    t0 = time.perf_counter()
    _, st = inv.solve(b)
    geom.backend.synchronize()
    t = time.perf_counter() - t0
    n = len(SHIFTS)
    updates = st.extra.get("shift_updates", n * st.iters)
    refine = sum(r.iters for r in st.extra.get("refine") or [])
    worst = max(st.true_residuals) / tol
    return (f"{'cgprec 1' if mixed else 'double  '} stop={'on ' if stop else 'off'}: {st.iters:5d} iterations, shift "
            f"updates {updates:6d} of {n * st.iters:6d} ({100 * updates / (n * st.iters):5.1f} %), "
            f"{st.extra.get('stopped_shifts', 0)} shifts stopped, refinement {refine:4d} iterations, worst true "
            f"residual {worst:.2f} x tol, {t:.3f} s")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("L", type=int)
    p.add_argument("--backend", default="numpy")
    p.add_argument("--tol", type=float, default=1e-5)
    args = p.parse_args(argv)
    geom, A, b = problem(args.L, args.backend)
    print(f"{args.L}^4 {args.backend}, shifts {', '.join(f'{s:.3g}' for s in SHIFTS)}, tol {args.tol:g}")
    for mixed in (False, True):
        for stop in (False, True):
            print(run(geom, A, b, args.tol, stop, mixed), flush=True)


if __name__ == "__main__":
    main()
