"""``--solver mg`` of ``hmc solve`` and ``hmc spectrum``: the multigrid options (``--mg-*``), ONE set-up for all the
sources of a command, and their solves.

Several sources (``hmc solve --ksprop``: the three colours of a point or KS-propagator source; ``hmc spectrum``: the
three colours of the point-source correlator) share the set-up (near-null vectors, hierarchy) and are solved
together by the batched solve of :mod:`solvers.multigrid.batched` (``solve_columns``): k columns through one outer
flexible GCR and K-cycle, each column with its own Krylov coefficients, every operator applied once per iteration
to all k columns (docs/multigrid.md 'Batched right-hand sides'); ``--no-mg-batch`` solves them one after another on
the same set-up. Both give each source's solution to the tolerance (tests/hmc/test_solve_mg_sources.py: the same
solutions to 1e-8 and outer counts within 1). One source is the single solve (``MultigridInverse.solve``) with its
per-level statistics.

The set-up tells the command's progress line what it does (``MultigridInverse.progress``: the level, the near-null
vectors' CG iteration, the Galerkin product, the coarsest factorization), on rank 0, on stderr, off with
``--no-progress``.
"""
from __future__ import annotations

import argparse
import math

from .solve_fields import SolveError


def add_mg_args(p, compare: bool = True) -> None:
    """The ``--mg-*`` options (``compare``: also ``--no-mg-compare``, the even-odd CG solve next to it)."""
    g = p.add_argument_group("multigrid (--solver mg)")
    g.add_argument("--mg-levels", type=int, default=3, help="levels: fine, KD, then aggregations (default 3)")
    g.add_argument("--mg-block", type=int, nargs=4, action="append", metavar=("BX", "BY", "BZ", "BT"),
                   help="aggregation block, once per aggregation level (default 4 4 4 4, then 2 2 2 2)")
    g.add_argument("--mg-nv", type=int, nargs="+", default=[48], help="near-null vectors per level (default 48)")
    g.add_argument("--mg-setup-iters", type=int, nargs="+", default=[50],
                   help="CG iterations relaxing the near-null vectors, per level (default 50)")
    g.add_argument("--mg-smoother-steps", type=int, nargs="+", default=[0, 4],
                   help="GCR post-smoothing steps on level 0, 1, ... (default 0 4: a smoother on M itself does not pay)")
    g.add_argument("--mg-coarsest", choices=("auto", "lu", "gcr"), default="auto",
                   help="coarsest solve: sparse LU, GCR, or auto (LU on one rank)")
    g.add_argument("--mg-precision", choices=("double", "single", "half"), default="double",
                   help="precision of the preconditioner (K-cycle, smoothers, coarse operators, coarsest solve); the "
                        "outer GCR and its true residual stay double (default double)")
    g.add_argument("--mg-batch", action=argparse.BooleanOptionalAction, default=True,
                   help="several sources (the three colours): one set-up, solved together by the batched multigrid "
                        "solve (default); --no-mg-batch: one after another on the same set-up")
    if compare:
        g.add_argument("--no-mg-compare", dest="mg_compare", action="store_false",
                       help="do not run the even-odd CG solve next to the multigrid one")


def mg_options(args) -> dict:
    """The multigrid parameters of ``--mg-*`` (defaults where ``args`` has none), plus ``compare`` (the CG solve
    next to it; off where the command has no --no-mg-compare) and ``batch``."""
    blocks = getattr(args, "mg_block", None)
    return {"levels": getattr(args, "mg_levels", 3), "blocks": [tuple(b) for b in blocks] if blocks else (),
            "nv": list(getattr(args, "mg_nv", [48])), "setup_iters": list(getattr(args, "mg_setup_iters", [50])),
            "smoother_steps": list(getattr(args, "mg_smoother_steps", [0, 4])),
            "coarsest": getattr(args, "mg_coarsest", "auto"), "precision": getattr(args, "mg_precision", "double"),
            "compare": getattr(args, "mg_compare", False), "batch": getattr(args, "mg_batch", True)}


def make_inverse(D, mass, tol, maxiter, opts: dict, progress=None):
    """The multigrid inverse of M = 2m + D for the multigrid parameters ``opts``; bad parameters: SolveError."""
    from solvers.multigrid import MultigridError, multigrid

    try:
        inv = multigrid(tol, maxiter, **opts)(D.matrix(mass))
    except MultigridError as e:
        raise SolveError(str(e)) from None
    inv.progress = progress
    return inv


def solve_sources_mg(D, mass, sources, operator="M", tol=1e-10, maxiter=200, mg=None, progress=None):
    """x = M^-1 b for every b of ``sources`` by multigrid with one set-up (module docstring); returns (solutions,
    result dict): one source: :func:`single_result`; several: the totals, the worst residuals and ``solves`` (one
    dict per source). ``mg["compare"]`` adds the even-odd CG solve of each source (``cg_compare``); ``progress``
    (callable(note)) is told what runs."""
    if operator != "M":
        raise SolveError(f"--solver mg solves M x = b: use --operator M, not {operator}")
    opts = dict(mg_options(None))
    opts.update(mg or {})
    compare, batch = opts.pop("compare"), opts.pop("batch")
    inv = make_inverse(D, mass, tol, maxiter, opts, progress)
    if len(sources) > 1 and batch:
        xs, res = batched_result(inv, D, sources, progress)
    else:
        xs, results = [], []
        for i, b in enumerate(sources):
            if progress is not None:
                progress("multigrid solve" + (f" {i + 1} of {len(sources)}" if len(sources) > 1 else ""))
            x, st = inv.solve(b)
            xs.append(x)
            results.append(single_result(inv, D, b, x, st))
        res = results[0] if len(results) == 1 else combined(results)
    if compare:
        if progress is not None:
            progress("even-odd CG solves to compare")
        res["cg_compare"] = cg_compare(D, mass, tol, sources, xs)
    return xs, res


def full_residual(D, mass, b, x) -> float:
    from solvers import norm2

    bb = norm2(D.geom, b)
    return math.sqrt(norm2(D.geom, b - D.matrix(mass)(x)) / bb) if bb > 0 else 0.0


def single_result(inv, D, b, x, st) -> dict:
    """The result of one multigrid solve: iterations, residuals, flops, time, and ``mg`` (set-up and solve time,
    per-level statistics and lines, the parameters)."""
    p = inv.params
    return {"iters": st.iters, "milc_iters": st.iters, "true_residual": st.true_residual, "converged": st.converged,
            "flops": st.flops, "time_s": st.time, "full_residual": full_residual(D, inv.mass, b, x),
            "precision": st.precision, "gflops": st.flops / st.time / 1e9 if st.time > 0 else 0.0,
            "solves": [{"solver": st.solver, "converged": bool(st.converged), "iters": st.iters,
                        "true_residual": st.true_residual, "time_s": st.time}],
            "mg": {"setup_time_s": st.setup_time, "solve_time_s": st.solve_time, "outer_iters": st.iters,
                   "fine_applies": st.fine_applies, "setup_fine_applies": st.setup_fine_applies,
                   "levels": [{k: v for k, v in d.items() if k != "time_inclusive"} for d in st.levels],
                   "level_lines": st.level_lines(), "params": params_dict(p)}}


def params_dict(p) -> dict:
    return {"levels": p.levels, "blocks": [list(b) for b in p.blocks], "nv": list(p.nv),
            "setup_iters": list(p.setup_iters), "smoother_steps": list(p.smoother_steps), "precision": p.precision}


def batched_result(inv, D, sources, progress=None):
    """The sources solved together (:func:`solvers.multigrid.batched.solve_columns`); returns (solutions, result):
    per source (``solves``) its outer iterations and residuals, and time and flops as an equal share of the
    batch's; ``mg``: the set-up and the batched solve (``batched``: columns, outer iterations per column)."""
    from solvers.multigrid.batched import solve_columns

    xp = D.geom.xp
    inv.setup()
    if progress is not None:
        progress(f"multigrid: {len(sources)} sources solved together (batched)")
    X, info = solve_columns(inv, xp.stack([xp.asarray(b) for b in sources], axis=-1))
    k = len(sources)
    xs = [xp.ascontiguousarray(X[..., j]) for j in range(k)]
    total = info["setup_time"] + info["solve_time"]
    p = inv.params
    solves = [{"color": j, "iters": info["iters"][j], "milc_iters": info["iters"][j],
               "true_residual": info["true_residual"][j], "full_residual": full_residual(D, inv.mass, b, x),
               "converged": info["true_residual"][j] <= p.tol, "time_s": total / k, "flops": info["flops"] / k,
               "gflops": info["flops"] / total / 1e9 if total > 0 else 0.0}
              for j, (b, x) in enumerate(zip(sources, xs))]
    h = inv.hierarchy
    dims = [D.geom.dims] + [op.geom.dims for op in h.ops[1:]]
    lines = [f"level {l} ({'x'.join(map(str, d))}): {n} column applications"
             for l, (d, n) in enumerate(zip(dims, info["level_columns"])) if n]
    res = combined(solves)
    res["precision"] = "double" if p.precision == "double" else f"{p.precision}/double"
    res["mg"] = {"setup_time_s": info["setup_time"], "solve_time_s": info["solve_time"],
                 "outer_iters": max(info["iters"]), "fine_applies": info["fine_columns"],
                 "setup_fine_applies": info["setup_fine_applies"], "level_lines": lines, "params": params_dict(p),
                 "batched": {"columns": k, "iters": info["iters"], "level_columns": info["level_columns"]}}
    return xs, res


def combined(results: list) -> dict:
    """The result of several solves: totals, the worst residuals, each solve (``solves``, with its colour)."""
    t = sum(r["time_s"] for r in results)
    flops = sum(r["flops"] for r in results)
    return {"iters": sum(r["iters"] for r in results), "milc_iters": sum(r["milc_iters"] for r in results),
            "true_residual": max(r["true_residual"] or 0.0 for r in results),
            "full_residual": max(r["full_residual"] for r in results),
            "converged": all(r["converged"] for r in results), "flops": flops, "time_s": t,
            "gflops": flops / t / 1e9 if t > 0 else 0.0, "precision": results[0].get("precision", "double"),
            "solves": [dict(r, color=c) for c, r in enumerate(results)]}


def cg_compare(D, mass, tol, sources, xs) -> dict:
    """The even-odd CG solves of the same sources with the same tolerance: totals, the worst residual and the
    largest |x_mg - x_cg|/|x_cg|."""
    from solvers import cg, even_odd, norm2

    geom = D.geom
    inv = even_odd(cg(tol, 100000), check_residual=True)(D.even_odd(mass))
    out = {"iters": 0, "fine_applies": 0, "time_s": 0.0, "full_residual": 0.0, "converged": True,
           "rel_diff_to_mg": 0.0}
    for b, x in zip(sources, xs):
        xc, sc = inv.solve(b)
        out["iters"] += sc.iters
        out["fine_applies"] += sc.matvecs + 1
        out["time_s"] += sc.time
        out["full_residual"] = max(out["full_residual"], sc.full_residual)
        out["converged"] = out["converged"] and bool(sc.converged)
        out["rel_diff_to_mg"] = max(out["rel_diff_to_mg"], math.sqrt(norm2(geom, x - xc) / norm2(geom, xc)))
    return out
