"""``hmc solve``: a propagator solve with the HISQ or asqtad operator on a stored configuration.

    hmc solve CONFIG --action hisq|asqtad [--u0 U] [--eps E] --mass M
              [--source FILE | --point X Y Z T [--color C] | --random SEED]
              [--operator M|MdagM] [--solver cg|mixed|mg] [--tol T] [--maxiter N]
              [--mg-levels L] [--mg-block BX BY BZ BT ...] [--mg-nv N ...] [--mg-setup-iters N ...]
              [--mg-smoother-steps N ...] [--mg-coarsest auto|lu|gcr] [--mg-precision double|single|half]
              [--no-mg-batch] [--no-mg-compare]
              [--time-bc antiperiodic|periodic] [--reunitarize | --no-reunitarize]
              [--out FILE [--out-precision 32|64] [--ksprop]] [--check REFERENCE] [--json] [--no-progress]

The links are built from the configuration (docs/conventions.md 1.3-1.6) and the solve uses the operators of
:mod:`solvers` (M = 2m + D, no factor 1/2):

* ``--operator M`` (default): x = M^-1 b, even-odd preconditioned as MILC's ``mat_invert_uml``: CG on
  A_m = 4m^2 - D_eo D_oe for the even sites, the odd sites reconstructed. The tolerance is MILC's
  ``error_for_propagator``: |r_e|^2 <= tol^2 |(M^dag b)_e|^2 on the even system.
* ``--operator MdagM``: x = (M^dag M)^-1 b on both parities, as MILC's ``ks_congrad(..., EVENANDODD)``; M^dag M =
  4m^2 - D^2 does not mix parities, so each parity is one CG with its own stopping rule.

The source is a SciDAC colour-vector file (``--source``; a ``.npy`` array of shape (nt, nz, ny, nx, 3) also works;
a USQCD KS propagator gives its scalar source times the unit vector of colour ``--color``),
a point source of colour C at (x, y, z, t) (``--point``, the default: colour 0 at the origin) or complex Gaussian
noise (``--random SEED``, unit variance per real component, drawn by global site index with the counter-based RNG,
so it does not depend on the decomposition).

``--solver mg`` solves M x = b on the full lattice with the Kahler-Dirac multigrid of :mod:`solvers.multigrid`
(``--operator M`` only; the tolerance is |b - M x| <= tol |b| on the full system). It prints the per-level
iteration counts, set-up and solve time and fine-operator applications, and next to them the even-odd CG solve of
the same source with the same tolerance (its M-equivalent applications: one per A_m product, plus one for the
source preparation and reconstruction); ``--no-mg-compare`` leaves CG out. The three sources of ``--ksprop`` share one
multigrid set-up and are solved together by the batched multigrid solve (:mod:`.solve_mg`; ``--no-mg-batch``: one
after another on that set-up); the progress line says what the set-up does (level, near-null vectors' CG iteration).

``--check REFERENCE`` compares the solution with a stored one (SciDAC colour vector, ``.npy``, or the solution of
colour ``--color`` in a USQCD KS propagator), as MILC's ``check_ks_invert`` does with its answer files, and reports
|x - ref|/|ref| and max|x - ref|/max|ref|.

``--out FILE`` writes the solution: a ``.npy`` array if FILE ends in ``.npy``, otherwise a SciDAC colour-vector
file (QIO's record layout, the one of MILC's ``ksvector.*`` files, with a scidac-checksum;
``lattice.io.write_color_vector``) that ``lattice.io.read_color_vector`` and MILC read; ``--out-precision 32``
stores single precision as MILC's test files. ``--ksprop`` solves the point source (or a KS propagator's scalar
source) for each of the three source colours and writes them as MILC's ``save_ksprop`` does with QIO: a USQCD KS
propagator, ``USQCD_ColorVector_ScalarSource_ThreeSink`` (``lattice.io.write_ksprop``, docs/formats.md); with
``--check`` the reference is then a KS propagator too and all three colours are compared.

Re-unitarization (``--reunitarize``, the default, or ``--no-reunitarize``)
--------------------------------------------------------------------------
MILC in double precision re-unitarizes the single-precision links after reading and computes everything from them
(docs/conventions.md 1.1); this is the default. In single precision it does not. MILC's asqtad reference files of
``ks_imp_utilities/test/check_ks_invert`` (``ksvector.ans.*.sample.l8``, written in 2005 in single precision) and
its ``fat.l8``/``long.l8`` were made from ``lat.sample.l8`` as stored. Both choices reproduce the answer files to
the precision they hold (mass 0.1, u0 0.502, antiperiodic time, tol 1e-12; |x - ref|/|ref|):

    ============================================  =================  ==============
    file (what it holds)                           --no-reunitarize   --reunitarize
    ============================================  =================  ==============
    ksvector.ans.Minv.sample.l8 (M^-1 src)          1.12e-7            1.14e-7
    ksvector.ans.MdaggerMinv.sample.l8              5.0e-8             6.3e-8
    ((M^dag M)^-1 src, both parities)
    ============================================  =================  ==============

so the files do not tell the two apart; the stored answers themselves only satisfy M x = b to 8e-8 (single
precision), and rounding a double solution to float32 alone changes it by 2.5e-8.

Everything here also runs on a decomposed lattice (``mpiexec``): sources and references are cut to each rank's
block, norms are global sums and ``--out`` gathers to rank 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from .progress import add_progress_arg, command_progress
from .solve_mg import add_mg_args, combined, mg_options, solve_sources_mg
from .solve_fields import SolveError, compare, is_ksprop_file, ksprop_sources, make_source, point_source, random_source, \
    read_vector, write_solution

__all__ = ["SolveError", "point_source", "random_source", "read_vector", "make_source", "compare", "solve_field",
           "load_links", "make_dslash", "run", "cli"]

ACTIONS = ("hisq", "asqtad")
OPERATORS = ("M", "MdagM")
SOLVERS = ("cg", "mixed", "mg")


# ------------------------------------------------------------------------------------------------ arguments
def add_link_args(p) -> None:
    """The arguments that choose the configuration and the fermion links (shared with ``hmc spectrum``)."""
    p.add_argument("config", help="a stored configuration (MILC v5/1996, NERSC, ILDG, SciDAC, openQCD) or a run "
                                  "file (RUN.h5, RUN.h5:N)")
    p.add_argument("--action", choices=ACTIONS, required=True, help="fermion links: HISQ or asqtad")
    p.add_argument("--mass", type=float, required=True, help="bare quark mass m (M = 2m + D, MILC's convention)")
    p.add_argument("--u0", type=float, default=None,
                   help="tadpole factor of the asqtad links (default 1; HISQ has none and ignores it)")
    p.add_argument("--eps", type=float, default=0.0, help="Naik epsilon of the HISQ links (default 0)")
    p.add_argument("--time-bc", choices=("antiperiodic", "periodic"), default="antiperiodic",
                   help="fermion boundary condition in time (default antiperiodic, MILC's)")
    p.add_argument("--reunitarize", dest="reunitarize", action=argparse.BooleanOptionalAction, default=True,
                   help="re-unitarize the stored links in double precision before building the fermion links, as "
                        "MILC does in double precision (default); --no-reunitarize uses them as stored")
    p.add_argument("--ignore-checksum", action="store_true", help="read a configuration whose checksum disagrees")
    p.add_argument("--force-reunitarize", action="store_true",
                   help="project links far from U(3) onto SU(3) instead of refusing the configuration")
    p.add_argument("--solver", choices=SOLVERS, default="cg",
                   help="cg (double precision), mixed (single-precision iteration, reliable updates) or mg "
                        "(Kahler-Dirac multigrid on the full lattice, M only)")
    p.add_argument("--tol", type=float, default=1e-10,
                   help="relative residual of the (even-site) normal system, MILC's error_for_propagator")
    p.add_argument("--maxiter", type=int, default=10000, help="most CG iterations per solve")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_progress_arg(p)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("solve", help="propagator solve M^-1 b or (M^dag M)^-1 b (HISQ or asqtad) on a configuration",
                       description="Solve M x = b (M = 2m + D) or M^dag M x = b with the HISQ or asqtad operator on "
                                   "a stored configuration; print iterations, true residual, time and GFLOP/s.")
    add_link_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--source", metavar="FILE", help="source: SciDAC colour-vector file (or .npy), or a USQCD KS "
                                                      "propagator's scalar source in colour --color")
    src.add_argument("--point", type=int, nargs=4, metavar=("X", "Y", "Z", "T"),
                     help="source: point source at (x, y, z, t) (default: the origin)")
    src.add_argument("--random", type=int, metavar="SEED", help="source: complex Gaussian noise from SEED")
    p.add_argument("--color", type=int, default=0, choices=(0, 1, 2), help="colour of the point source")
    p.add_argument("--operator", choices=OPERATORS, default="M",
                   help="M: x = M^-1 b (default); MdagM: x = (M^dag M)^-1 b on both parities")
    p.add_argument("--out", metavar="FILE", help="write the solution: SciDAC colour vector, or .npy")
    p.add_argument("--out-precision", type=int, choices=(32, 64), default=64,
                   help="precision of a SciDAC --out file (default 64)")
    p.add_argument("--ksprop", action="store_true",
                   help="solve the three colours of the point (or KS propagator) source and write --out as a USQCD "
                        "KS propagator (MILC's save_ksprop with QIO)")
    p.add_argument("--check", metavar="REFERENCE",
                   help="report |x - ref|/|ref| against a stored solution (SciDAC colour vector, .npy, or the "
                        "solution of colour --color in a USQCD KS propagator)")
    add_mg_args(p)
    return p


# ------------------------------------------------------------------------------------------------ links
def validate(args) -> None:
    if not (args.mass > 0 and math.isfinite(args.mass)):
        raise SolveError(f"--mass {args.mass:g}: the mass must be positive (the even-odd solve divides by 2m)")
    if not (args.tol > 0 and args.tol < 1):
        raise SolveError(f"--tol {args.tol:g}: the tolerance must lie in (0, 1)")
    if args.maxiter < 1:
        raise SolveError(f"--maxiter {args.maxiter}: must be at least 1")
    if args.action == "asqtad":
        if args.eps != 0.0:
            raise SolveError(f"--eps {args.eps:g}: the Naik epsilon belongs to HISQ; asqtad has none")
        if args.u0 is not None and not args.u0 > 0:
            raise SolveError(f"--u0 {args.u0:g}: the tadpole factor must be positive")


def load_links(args):
    """(GaugeField, FermionLinks, read info) for the configuration and link options in ``args``."""
    from force.hisq_links import asqtad_links, hisq_links

    from .lattice_source import read_lattice, split_spec

    validate(args)
    if not os.path.exists(split_spec(args.config)[0]):
        raise SolveError(f"{args.config}: no such file (check the path)")
    u, info = read_lattice(args.config, backend=getattr(args, "backend", None), ignore_checksum=args.ignore_checksum,
                           reunitarize=args.reunitarize, config=getattr(args, "run_config", None), check_links=True,
                           force_reunitarize=getattr(args, "force_reunitarize", False))
    if args.action == "hisq":
        links = hisq_links(u, eps=args.eps, time_bc=args.time_bc)
    else:
        links = asqtad_links(u, 1.0 if args.u0 is None else args.u0, args.time_bc)
    return u, links, info


def make_dslash(links):
    from solvers import StaggeredDslash

    return StaggeredDslash(links.geom, links.fat, links.long)


def inner_solver(name: str, tol: float, maxiter: int):
    from solvers import cg, mixed_precision

    return cg(tol, maxiter) if name == "cg" else mixed_precision(cg(tol, maxiter))


def describe_links(args, info) -> dict:
    d = {"config": os.fspath(args.config), "format": info.get("format"), "dims": list(info.get("dims", ())),
         "action": args.action, "mass": args.mass, "time_bc": args.time_bc, "reunitarized": bool(args.reunitarize)}
    if args.action == "asqtad":
        d["u0"] = 1.0 if args.u0 is None else args.u0
    else:
        d["eps"] = args.eps
        if args.u0 is not None and args.u0 != 1.0:
            d["u0_ignored"] = args.u0
    return d


def links_line(d: dict) -> str:
    act = f"asqtad (u0 {d['u0']:g})" if d["action"] == "asqtad" else f"HISQ (eps {d['eps']:g})"
    return (f"{act}, m = {d['mass']:g}, {d['time_bc']} time, {d['config']} ({'x'.join(map(str, d['dims']))}, "
            f"{d['format']}, links {'re-unitarized' if d['reunitarized'] else 'as stored'})")


# ------------------------------------------------------------------------------------------------ the solve
def _stats_dict(st) -> dict:
    return {"solver": st.solver, "precision": st.precision, "converged": bool(st.converged), "iters": st.iters,
            "milc_iters": st.milc_iters, "restarts": st.restarts, "true_residual": st.true_residual,
            "time_s": st.time, "flops": st.flops, "gflops": st.gflops}


def solve_field(D, mass: float, b, operator: str = "M", solver: str = "cg", tol: float = 1e-10,
                maxiter: int = 10000, mg: dict | None = None):
    """x = M^-1 b or (M^dag M)^-1 b with the dslash D; returns (x, result dict) with iterations (Krylov and MILC's
    count), the true residual(s), time, flops, GFLOP/s and the full residual |b - Op x|/|b|."""
    from solvers import even_odd, norm2, project

    geom, xp = D.geom, D.xp
    if solver == "mg":
        xs, res = solve_sources_mg(D, mass, [b], operator, tol, maxiter, mg)
        return xs[0], res
    inner = inner_solver(solver, tol, maxiter)
    bb = norm2(geom, b)
    t0 = time.perf_counter()
    if operator == "M":
        inv = even_odd(inner, check_residual=False)(D.even_odd(mass))
        x, st = inv.solve(b)
        parts = [st]
        full_op = D.matrix(mass)
        res = {"iters": st.iters, "milc_iters": st.milc_iters, "true_residual": st.true_residual,
               "converged": st.converged, "flops": st.flops, "solves": [_stats_dict(st)]}
    elif operator == "MdagM":
        x = xp.zeros_like(b)
        parts = []
        for parity in (0, 1):
            bp = project(b, geom, parity)
            if norm2(geom, bp) == 0.0:
                continue
            xpar, st = inner(D.even_odd(mass, parity).normal).solve(bp)
            x += project(xpar, geom, parity)
            parts.append(st)
        full_op = D.matrix(mass).normal()
        res = {"iters": sum(s.iters for s in parts), "milc_iters": sum(s.milc_iters for s in parts),
               "true_residual": max((s.true_residual or 0.0) for s in parts) if parts else 0.0,
               "converged": all(s.converged for s in parts), "flops": sum(s.flops for s in parts),
               "solves": [dict(_stats_dict(s), parity="even" if i == 0 else "odd") for i, s in enumerate(parts)]}
    else:
        raise SolveError(f"--operator {operator}: use one of {', '.join(OPERATORS)}")
    geom.backend.synchronize()
    elapsed = time.perf_counter() - t0
    res["time_s"] = elapsed
    res["gflops"] = res["flops"] / elapsed / 1e9 if elapsed > 0 else 0.0
    res["full_residual"] = math.sqrt(norm2(geom, b - full_op(x)) / bb) if bb > 0 else 0.0
    res["precision"] = parts[0].precision if parts else "double"
    return x, res


def solve_sources(args, D, sources, bar):
    """(solutions, result) of every source: by multigrid with one set-up (:func:`.solve_mg.solve_sources_mg`,
    batched unless --no-mg-batch), else one even-odd solve after another; ``bar`` is the command's progress."""
    if args.solver == "mg":
        bar.step("multigrid")
        return solve_sources_mg(D, args.mass, sources, args.operator, args.tol, args.maxiter, mg_options(args),
                                progress=lambda note: bar.update(bar.done, note))
    xs, results = [], []
    for i, b in enumerate(sources):
        bar.step(f"solve {i + 1} of {len(sources)}" + (f" (source colour {i})" if args.ksprop else ""))
        x, res = solve_field(D, args.mass, b, args.operator, args.solver, args.tol, args.maxiter)
        xs.append(x)
        results.append(res)
    return xs, results[0] if len(results) == 1 else combined(results)


def _check_out_args(args) -> None:
    if args.out is not None and not args.out:
        raise SolveError("--out needs a file name")
    if args.out and os.path.isdir(args.out):
        raise SolveError(f"--out {args.out} is a folder: name the file to write in it, e.g. "
                         f"{os.path.join(args.out, 'solution.npy')}")
    if args.ksprop and (not args.out or args.out.endswith(".npy")):
        raise SolveError("--ksprop writes a USQCD KS propagator: give --out FILE (not .npy)")
    if args.ksprop and args.check and not is_ksprop_file(args.check):
        raise SolveError(f"--ksprop --check {args.check}: the reference of three source colours must be a USQCD KS "
                         "propagator")


def run(args) -> dict:
    """``hmc solve`` without printing: the result dictionary (the --json output)."""
    from solvers import norm2

    _check_out_args(args)
    nsolves = 1 if args.solver == "mg" else 3 if args.ksprop else 1       # multigrid: one step, its notes
    with command_progress(2 + nsolves + bool(args.out), "hmc solve", not args.no_progress) as bar:
        bar.update(0, "reading the configuration")
        u, links, info = load_links(args)
        bar.step("the operator and the source")
        geom = u.geom
        D = make_dslash(links)
        if args.ksprop:
            sources, scalar, src_desc = ksprop_sources(geom, args)
        else:
            (b, src_desc), scalar = make_source(geom, args), None
            sources = [b]
        if norm2(geom, sources[0]) == 0.0:
            raise SolveError("the source is zero everywhere: nothing to solve")
        colors = range(3) if args.ksprop else [args.color]
        refs = [read_vector(args.check, geom, "reference", c) for c in colors] if args.check else []
        xs, res = solve_sources(args, D, sources, bar)
        out = describe_links(args, info)
        out.update({"operator": args.operator, "source": src_desc, "solver": args.solver, "tol": args.tol})
        out.update(res)
        if refs:
            checks = [compare(geom, x, r) for x, r in zip(xs, refs)]
            out["check"] = dict({k: max(c[k] for c in checks) for k in checks[0]}, reference=args.check)
        if args.out:
            bar.step(f"writing {args.out}")
            what = "M^-1 source" if args.operator == "M" else "(MdaggerM)^-1 source"
            written = write_solution(args.out, geom, xs, args.out_precision, scalar,
                                     file_info=f"hisq-hmc solve: {links_line(describe_links(args, info))}",
                                     record_info=f"answer = {what}")
            if written is not None:
                out["out"] = written
        bar.update(bar.total, f"{out['iters']} iterations")
    return out


def format_result(r: dict) -> str:
    op = "x = M^-1 b" if r["operator"] == "M" else "x = (M^dag M)^-1 b"
    s = r["source"]
    src = {"file": lambda: f"file {s.get('path')}", "random": lambda: f"random (seed {s.get('seed')})",
           "point": lambda: f"point at {tuple(s.get('site', ()))}"}[s["kind"]]()
    if "colors" in s:
        src += ", colours 0, 1, 2 (a KS propagator)"
    elif "color" in s:
        src += f", colour {s['color']}"
    lines = [f"hmc solve: {links_line(r)}"]
    if r["action"] == "hisq" and r.get("u0_ignored") is not None:
        lines.append(f"note: --u0 {r['u0_ignored']:g} ignored: HISQ links have no tadpole factor")
    lines += [
             f"source: {src}; {op}; {r['solver']} [{r['precision']}], tol {r['tol']:g}",
             f"{'converged' if r['converged'] else 'NOT converged'}: {r['iters']} iterations (MILC count "
             f"{r['milc_iters']}), true residual {r['true_residual']:.3e}, |b - Op x|/|b| = {r['full_residual']:.3e}",
             f"time {r['time_s']:.3f} s, {r['flops'] / 1e9:.3f} GFLOP, {r['gflops']:.3f} GFLOP/s"]
    if "mg" in r:
        g = r["mg"]
        bt = g.get("batched")
        solve = (f"solve {g['solve_time_s']:.3f} s, {g['outer_iters']} outer iterations, " if not bt else
                 f"batched solve of {bt['columns']} sources {g['solve_time_s']:.3f} s, outer iterations "
                 f"{', '.join(map(str, bt['iters']))}, ")
        lines.append(f"multigrid: set-up {g['setup_time_s']:.3f} s ({g['setup_fine_applies']} fine vector "
                     f"applications), {solve}{g['fine_applies']} fine-operator {'column ' if bt else ''}applications")
        lines += ["  " + line for line in g["level_lines"]]
    if "cg_compare" in r:
        c = r["cg_compare"]
        lines.append(f"even-odd CG, same source and tol: {c['iters']} iterations, {c['fine_applies']} "
                     f"M-equivalent applications, {c['time_s']:.3f} s, |b - M x|/|b| = {c['full_residual']:.3e}, "
                     f"|x_mg - x_cg|/|x_cg| = {c['rel_diff_to_mg']:.3e}")
    if "check" in r:
        c = r["check"]
        lines.append(f"check against {c['reference']}: |x - ref|/|ref| = {c['rel_diff']:.3e}, "
                     f"max|x - ref|/max|ref| = {c['max_rel_diff']:.3e}")
    if "out" in r:
        o = r["out"]
        kind = {"npy": "NumPy array", "scidac": "SciDAC colour vector",
                "usqcd-ksprop": "USQCD KS propagator, 3 source colours"}[o["format"]]
        kind += f", {o['precision']}-bit" if "precision" in o else ""
        lines.append(f"wrote {o['path']} ({kind})")
    return "\n".join(lines)


def report_error(args, e) -> int:
    """One line; exit status 1 for a solve that did not converge (a runtime failure), 2 for bad input."""
    from solvers import SolverConvergenceError

    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    print(f"hmc {args.command}: error: {msg}", file=sys.stderr)
    return 1 if isinstance(e, SolverConvergenceError) else 2


def cli(args) -> int:
    """Entry point of ``hmc solve`` (called by hmc.cli). Bad parameters (exit status 2) and solves that do not
    converge (1) are one-line errors; file errors reach hmc.cli's handler (2)."""
    return run_and_print(args, run, format_result)


def run_and_print(args, run_command, format_command) -> int:
    """Run a solving command (``hmc solve``, ``hmc spectrum``) and print its result on rank 0, as JSON with --json;
    a bad parameter or a solve that does not converge is a one-line error (:func:`report_error`)."""
    from solvers import SolverConvergenceError

    try:
        r = run_command(args)
    except (SolveError, SolverConvergenceError) as e:
        return report_error(args, e)
    if _rank0(r):
        print(json.dumps(r, indent=2) if args.json else format_command(r))
    return 0


def _rank0(_r=None) -> bool:
    try:
        from comms import world

        return world().rank == 0
    except Exception:
        return True
