"""``hmc spectrum``: the point-source pion correlator with the HISQ or asqtad operator on a stored configuration.

    hmc spectrum CONFIG --action hisq|asqtad --mass M [--eps E] [--u0 U] [--time-bc antiperiodic|periodic]
                 [--origin X Y Z T] [--norm N] [--solver cg|mixed|mg] [--tol T] [--reunitarize|--no-reunitarize] [--json]
                 [--mg-* options of hmc solve, --no-mg-batch]

C(t) = norm * sum over the spatial sites x and the colours a, b of |G_ab(x, t + t0; x0)|^2, G = M^-1 = (2m + D)^-1,
with the point source at x0 = (x0, y0, z0, t0) (default the origin): three solves (one per source colour b), each
even-odd preconditioned (:func:`hmc.solve.solve_field`). t runs over 0..nt-1 from the source time, cyclically. This
is MILC's ``POINT_PION``/``POINT_KAON_5`` (the Goldstone pion, equal masses) in ``ks_spectrum`` (docs/conventions.md 4.3);
MILC's propagators are those of M = 2m + D, half the textbook ones. ``--norm`` is MILC's ``normalization`` factor
(default 1); MILC's inputs give it rounded (0.000244141 for 1/4096), and matching MILC's digits needs that rounded
value.

``--solver mg``: the three colours share one multigrid set-up and are solved together by the batched multigrid solve
(k = 3 columns through one outer flexible GCR and K-cycle; :mod:`.solve_mg`), ``--no-mg-batch`` one after another
on that set-up; the ``--mg-*`` options are those of ``hmc solve``.

Links are re-unitarized after reading by default, as in MILC's double-precision runs (docs/conventions.md 1.1). Measured
against MILC's printed correlators (both choices agree with them to within half a unit of the last printed digit):

* ``lat.sample.l4448.gf``, HISQ, eps 0, periodic time, norm 0.000244141, POINT_KAON_5 (``ks_spectrum_hisq.periodic``):
  m 0.05: max relative difference 2.2e-7 (0.48 of the last digit); m 0.02: 2.4e-7 (0.44);
* ``lat.sample.l8888``, HISQ, antiperiodic, norm 1, m 0.01, POINT_PION (``ks_spectrum_eigcg_hisq``): 4.3e-7
  (MILC's tolerance 2e-6).
"""
from __future__ import annotations

import numpy as np

from .progress import command_progress
from .solve_mg import add_mg_args, mg_options, solve_sources_mg
from .solve import SolveError, add_link_args, describe_links, links_line, load_links, make_dslash, point_source, \
    run_and_print, solve_field


def add_parser(sub):
    p = sub.add_parser("spectrum", help="point-source pion correlator C(t) (HISQ or asqtad) on a configuration",
                       description="The point-source pion correlator C(t) = norm sum_x,a,b |G_ab(x,t;0)|^2, "
                                   "G = (2m + D)^-1, for t = 0..nt-1 (MILC's POINT_PION / POINT_KAON_5).")
    add_link_args(p)
    p.add_argument("--origin", type=int, nargs=4, metavar=("X", "Y", "Z", "T"), default=[0, 0, 0, 0],
                   help="source site (default the origin); t is counted from the source time")
    p.add_argument("--norm", type=float, default=1.0, help="normalization factor of C(t) (default 1)")
    add_mg_args(p, compare=False)
    return p


def time_slice_sums(geom, density) -> np.ndarray:
    """sum over the spatial sites of ``density`` (a real site array, local block) for every global t."""
    xp = geom.xp
    local = density.reshape(density.shape[0], -1).sum(axis=1)
    nt = geom.dims[3]
    ot, lt = geom.offset[3], geom.local_dims[3]
    if geom.grid.comm.size == 1:
        return np.asarray(geom.backend.to_numpy(local), dtype=np.float64)
    out = np.zeros(nt)
    for t in range(nt):
        mine = local[t - ot] if ot <= t < ot + lt else xp.zeros((), dtype=local.dtype)
        out[t] = geom.sum(xp.reshape(mine, (1,)))
    return out


def point_correlator(D, mass: float, origin=(0, 0, 0, 0), norm: float = 1.0, solver: str = "cg",
                     tol: float = 1e-10, maxiter: int = 10000, progress=None, mg=None):
    """(C(t) for t = 0..nt-1 from the source time, list of the three solves' result dicts); ``progress``
    (hmc.progress.Progress) is told of each solve; ``mg``: the multigrid options (:func:`.solve_mg.mg_options`) of
    ``solver`` "mg", whose three colours share one set-up (batched unless mg["batch"] is False)."""
    geom = D.geom
    xp = geom.xp
    sources = [point_source(geom, origin, color) for color in range(3)]
    if solver == "mg":
        if progress is not None:
            progress.step("multigrid, 3 source colours")
        note = None if progress is None else (lambda text: progress.update(progress.done, text))
        xs, res = solve_sources_mg(D, mass, sources, "M", tol, maxiter, mg, note)
        solves = [dict(s, color=c) for c, s in enumerate(res["solves"])]
    else:
        xs, solves = [], []
        for color, b in enumerate(sources):
            if progress is not None:
                progress.step(f"solve {color + 1} of 3 (source colour {color})")
            x, res = solve_field(D, mass, b, "M", solver, tol, maxiter)
            xs.append(x)
            solves.append(dict(res, color=color))
    dens = xp.zeros(geom.shape, dtype=np.float64)
    for x in xs:
        dens += (x.real ** 2 + x.imag ** 2).sum(axis=-1)
    c = time_slice_sums(geom, dens)
    t0 = int(origin[3])
    return norm * np.roll(c, -t0), solves


def run(args) -> dict:
    if not args.norm > 0:
        raise SolveError(f"--norm {args.norm:g}: the normalization must be positive")
    with command_progress(5, "hmc spectrum", not args.no_progress) as bar:
        bar.update(0, "reading the configuration")
        u, links, info = load_links(args)
        bar.step("the operator")
        D = make_dslash(links)
        c, solves = point_correlator(D, args.mass, tuple(args.origin), args.norm, args.solver, args.tol,
                                     args.maxiter, bar, mg_options(args))
        bar.update(5, f"{sum(s['iters'] for s in solves)} iterations")
    out = describe_links(args, info)
    out.update({"origin": list(args.origin), "norm": args.norm, "solver": args.solver, "tol": args.tol,
                "correlator": [float(v) for v in c],
                "iters": sum(s["iters"] for s in solves), "milc_iters": sum(s["milc_iters"] for s in solves),
                "time_s": sum(s["time_s"] for s in solves), "flops": sum(s["flops"] for s in solves),
                "true_residual": max(s["true_residual"] for s in solves),
                "solves": [{k: s[k] for k in ("color", "iters", "milc_iters", "true_residual", "full_residual",
                                              "time_s", "gflops", "converged")} for s in solves]})
    out["gflops"] = out["flops"] / out["time_s"] / 1e9 if out["time_s"] > 0 else 0.0
    return out


def format_result(r: dict) -> str:
    lines = [f"hmc spectrum: {links_line(r)}"]
    if r.get("u0_ignored") is not None:
        lines.append(f"note: --u0 {r['u0_ignored']:g} ignored: HISQ links have no tadpole factor")
    kind = "multigrid outer" if r["solver"] == "mg" else "CG"
    lines.append(f"point source at {tuple(r['origin'])}, 3 colours: {r['iters']} {kind} iterations (MILC count "
                 f"{r['milc_iters']}), max true residual {r['true_residual']:.2e} (tol {r['tol']:g}), "
                 f"{r['time_s']:.2f} s, {r['gflops']:.3f} GFLOP/s")
    lines.append(f"POINT_PION  m {r['mass']:g}  norm {r['norm']:g}")
    lines += [f"{t} {v:.6e}" for t, v in enumerate(r["correlator"])]
    return "\n".join(lines)


def cli(args) -> int:
    """Entry point of ``hmc spectrum`` (called by hmc.cli)."""
    return run_and_print(args, run, format_result)
