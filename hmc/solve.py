"""``hmc solve``: a propagator solve with the HISQ or asqtad operator on a stored configuration.

    hmc solve CONFIG --action hisq|asqtad [--u0 U] [--eps E] --mass M
              [--source FILE | --point X Y Z T [--color C] | --random SEED]
              [--operator M|MdagM] [--solver cg|mixed|mg] [--tol T] [--maxiter N]
              [--mg-levels L] [--mg-block BX BY BZ BT ...] [--mg-nv N ...] [--mg-setup-iters N ...]
              [--mg-smoother-steps N ...] [--mg-coarsest auto|lu|gcr] [--mg-precision double|single]
              [--no-mg-compare]
              [--time-bc antiperiodic|periodic] [--reunitarize | --no-reunitarize]
              [--out FILE [--out-precision 32|64]] [--check REFERENCE] [--json]

The links are built from the configuration (docs/conventions.md 1.3-1.6) and the solve uses the operators of
:mod:`solvers` (M = 2m + D, no factor 1/2):

* ``--operator M`` (default): x = M^-1 b, even-odd preconditioned as MILC's ``mat_invert_uml``: CG on
  A_m = 4m^2 - D_eo D_oe for the even sites, the odd sites reconstructed. The tolerance is MILC's
  ``error_for_propagator``: |r_e|^2 <= tol^2 |(M^dag b)_e|^2 on the even system.
* ``--operator MdagM``: x = (M^dag M)^-1 b on both parities, as MILC's ``ks_congrad(..., EVENANDODD)``; M^dag M =
  4m^2 - D^2 does not mix parities, so each parity is one CG with its own stopping rule.

The source is a SciDAC colour-vector file (``--source``; a ``.npy`` array of shape (nt, nz, ny, nx, 3) also works),
a point source of colour C at (x, y, z, t) (``--point``, the default: colour 0 at the origin) or complex Gaussian
noise (``--random SEED``, unit variance per real component, drawn by global site index with the counter-based RNG,
so it does not depend on the decomposition).

``--solver mg`` solves M x = b on the full lattice with the Kahler-Dirac multigrid of :mod:`solvers.multigrid`
(``--operator M`` only; the tolerance is |b - M x| <= tol |b| on the full system). It prints the per-level
iteration counts, set-up and solve time and fine-operator applications, and next to them the even-odd CG solve of
the same source with the same tolerance (its M-equivalent applications: one per A_m product, plus one for the
source preparation and reconstruction); ``--no-mg-compare`` leaves CG out.

``--check REFERENCE`` compares the solution with a stored one (SciDAC colour vector or ``.npy``), as MILC's
``check_ks_invert`` does with its answer files, and reports |x - ref|/|ref| and max|x - ref|/max|ref|.

``--out FILE`` writes the solution: a ``.npy`` array if FILE ends in ``.npy``, otherwise a SciDAC colour-vector
file (QIO's record layout, the one of MILC's ``ksvector.*`` files, with a scidac-checksum) that
``lattice.io.read_color_vector`` and MILC read; ``--out-precision 32`` stores single precision as MILC's test files.
``lattice.io`` has no colour-vector writer, so :func:`write_color_vector` builds the file here from its LIME and
checksum primitives.

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

import numpy as np

ACTIONS = ("hisq", "asqtad")
OPERATORS = ("M", "MdagM")
SOLVERS = ("cg", "mixed", "mg")


class SolveError(ValueError):
    """Bad input to ``hmc solve`` / ``hmc spectrum`` (one-line message, exit status 2)."""


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


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("solve", help="propagator solve M^-1 b or (M^dag M)^-1 b (HISQ or asqtad) on a configuration",
                       description="Solve M x = b (M = 2m + D) or M^dag M x = b with the HISQ or asqtad operator on "
                                   "a stored configuration; print iterations, true residual, time and GFLOP/s.")
    add_link_args(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--source", metavar="FILE", help="source: SciDAC colour-vector file (or .npy)")
    src.add_argument("--point", type=int, nargs=4, metavar=("X", "Y", "Z", "T"),
                     help="source: point source at (x, y, z, t) (default: the origin)")
    src.add_argument("--random", type=int, metavar="SEED", help="source: complex Gaussian noise from SEED")
    p.add_argument("--color", type=int, default=0, choices=(0, 1, 2), help="colour of the point source")
    p.add_argument("--operator", choices=OPERATORS, default="M",
                   help="M: x = M^-1 b (default); MdagM: x = (M^dag M)^-1 b on both parities")
    p.add_argument("--out", metavar="FILE", help="write the solution: SciDAC colour vector, or .npy")
    p.add_argument("--out-precision", type=int, choices=(32, 64), default=64,
                   help="precision of a SciDAC --out file (default 64)")
    p.add_argument("--check", metavar="REFERENCE",
                   help="report |x - ref|/|ref| against a stored solution (SciDAC colour vector or .npy)")
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
    g.add_argument("--mg-precision", choices=("double", "single"), default="double",
                   help="precision of the preconditioner (K-cycle, smoothers, coarse operators, coarsest solve); the "
                        "outer GCR and its true residual stay double (default double)")
    g.add_argument("--no-mg-compare", dest="mg_compare", action="store_false",
                   help="do not run the even-odd CG solve next to the multigrid one")
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
    from solvers import cg, mixed_cg

    return (cg if name == "cg" else mixed_cg)(tol, maxiter)


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


# ------------------------------------------------------------------------------------------------ fields
def read_vector(path, geom, what: str):
    """A global colour-vector field from a SciDAC file or a .npy array, cut to this rank's block, on the backend."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise SolveError(f"{path}: no such file ({what})")
    if os.path.isdir(path):
        raise SolveError(f"{path} is a folder, not a {what} file: name the SciDAC or .npy file in it")
    if path.endswith(".npy"):
        try:
            a = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise SolveError(f"{path}: not a readable .npy array ({e})") from None
    else:
        from lattice.io import read_color_vector

        a = read_color_vector(path)
    nx, ny, nz, nt = geom.dims
    want = (nt, nz, ny, nx, 3)
    if tuple(a.shape) != want:
        raise SolveError(f"{path}: {what} has shape {tuple(a.shape)}, but the lattice needs {want} "
                         "(nt, nz, ny, nx, colour)")
    if not np.iscomplexobj(a):
        a = a.astype(np.complex128)
    return geom.xp.asarray(np.ascontiguousarray(geom.local_part(a), dtype=np.complex128))


def point_source(geom, site, color: int = 0):
    """1 at colour ``color`` of the global site (x, y, z, t), 0 elsewhere; this rank's block."""
    x, y, z, t = (int(c) for c in site)
    for c, n, name in zip((x, y, z, t), geom.dims, "xyzt"):
        if not 0 <= c < n:
            raise SolveError(f"point source {name} = {c} lies outside the lattice (0 <= {name} < {n})")
    if color not in (0, 1, 2):
        raise SolveError(f"colour {color}: use 0, 1 or 2")
    xp = geom.xp
    src = xp.zeros(geom.shape + (3,), dtype=np.complex128)
    (ox, oy, oz, ot), (lx, ly, lz, lt) = geom.offset, geom.local_dims
    if ox <= x < ox + lx and oy <= y < oy + ly and oz <= z < oz + lz and ot <= t < ot + lt:
        src[t - ot, z - oz, y - oy, x - ox, color] = 1.0
    return src


def random_source(geom, seed: int):
    from lattice.rng import CounterRNG

    g = CounterRNG(int(seed)).gaussian("hmc-solve-source", geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    return (g[..., 0] + 1j * g[..., 1]).astype(np.complex128)


def make_source(geom, args):
    """(source field, description) from --source / --point / --random (default: point, colour 0, origin)."""
    if args.source:
        return read_vector(args.source, geom, "source"), {"kind": "file", "path": args.source}
    if args.random is not None:
        return random_source(geom, args.random), {"kind": "random", "seed": args.random}
    site = tuple(args.point) if args.point else (0, 0, 0, 0)
    return point_source(geom, site, args.color), {"kind": "point", "site": list(site), "color": args.color}


def write_color_vector(path, x, precision: int = 64, title: str = "hisq-hmc colour vector",
                       info: str = "solution color vector field") -> dict:
    """Write the global colour-vector field ``x`` (nt, nz, ny, nx, 3) as a SciDAC file (QIO's layout, as MILC's
    ``save_ks_vector_scidac``: file message [private file XML, file XML], record message [private record XML, record
    XML, binary data, checksum]), atomically. Returns {"suma", "sumb"}."""
    from xml.sax.saxutils import escape

    from lattice.io import lime
    from lattice.io.common import atomic_write, scidac_checksum

    if precision not in (32, 64):
        raise ValueError(f"precision {precision}: use 32 or 64")
    x = np.asarray(x)
    if x.ndim != 5 or x.shape[-1] != 3:
        raise ValueError(f"a colour-vector field has shape (nt, nz, ny, nx, 3), not {x.shape}")
    nt, nz, ny, nx = x.shape[:4]
    nbytes = precision // 8
    raw = np.ascontiguousarray(np.asarray(x, dtype=np.complex128).view(np.float64), dtype=f">f{nbytes}").tobytes()
    suma, sumb = scidac_checksum(raw, 6 * nbytes)
    p = "F" if precision == 32 else "D"
    head = '<?xml version="1.0" encoding="UTF-8"?>'
    stamp = time.strftime("%a %b %d %H:%M:%S %Y UTC", time.gmtime())

    def z(s: str) -> bytes:
        return s.encode() + b"\0"

    messages = [
        [("scidac-private-file-xml", z(f"{head}<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                                       f"<dims>{nx} {ny} {nz} {nt} </dims><volfmt>0</volfmt></scidacFile>")),
         ("scidac-file-xml", z(title))],
        [("scidac-private-record-xml", z(
            f"{head}<scidacRecord><version>1.0</version><date>{stamp}</date><globaldata>0</globaldata>"
            f"<datatype>QDP_{p}3_ColorVector</datatype><precision>{p}</precision><colors>3</colors>"
            f"<typesize>{6 * nbytes}</typesize><datacount>1</datacount></scidacRecord>")),
         ("scidac-record-xml", z(escape(info))),
         ("scidac-binary-data", raw),
         ("scidac-checksum", z(f"{head}<scidacChecksum><version>1.0</version><suma>{suma:x}</suma>"
                               f"<sumb>{sumb:x}</sumb></scidacChecksum>"))],
    ]
    with atomic_write(path) as f:
        lime.write_messages(f, messages)
    return {"suma": suma, "sumb": sumb}


def compare(geom, x, ref) -> dict:
    """|x - ref|/|ref| (MILC's check) and max_site,colour |x - ref| / max |ref|, global."""
    from solvers import norm2

    xp = geom.xp
    d = x - ref
    nref = norm2(geom, ref)
    rel = math.sqrt(norm2(geom, d) / nref) if nref > 0 else math.inf
    mx = geom.grid.max(float(xp.abs(d).max()))
    mr = geom.grid.max(float(xp.abs(ref).max()))
    return {"rel_diff": rel, "max_abs_diff": mx, "max_rel_diff": mx / mr if mr > 0 else math.inf}


# ------------------------------------------------------------------------------------------------ the solve
def _stats_dict(st) -> dict:
    return {"solver": st.solver, "precision": st.precision, "converged": bool(st.converged), "iters": st.iters,
            "milc_iters": st.milc_iters, "restarts": st.restarts, "true_residual": st.true_residual,
            "time_s": st.time, "flops": st.flops, "gflops": st.gflops}


def solve_field(D, mass: float, b, operator: str = "M", solver: str = "cg", tol: float = 1e-10,
                maxiter: int = 10000, mg: dict | None = None):
    """x = M^-1 b or (M^dag M)^-1 b with the dslash D; returns (x, result dict) with iterations (Krylov and MILC's
    count), the true residual(s), time, flops, GFLOP/s and the full residual |b - Op x|/|b|."""
    from solvers import even_odd_inverse, norm2, project

    geom, xp = D.geom, D.xp
    if solver == "mg":
        return solve_field_mg(D, mass, b, operator, tol, maxiter, mg)
    inner = inner_solver(solver, tol, maxiter)
    bb = norm2(geom, b)
    t0 = time.perf_counter()
    if operator == "M":
        inv = even_odd_inverse(D.even_odd(mass), inner, check_residual=False)
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


def mg_options(args) -> dict:
    """The multigrid parameters of ``--mg-*`` (defaults where ``args`` has none, e.g. ``hmc spectrum``)."""
    blocks = getattr(args, "mg_block", None)
    return {"levels": getattr(args, "mg_levels", 3), "blocks": [tuple(b) for b in blocks] if blocks else (),
            "nv": list(getattr(args, "mg_nv", [48])), "setup_iters": list(getattr(args, "mg_setup_iters", [50])),
            "smoother_steps": list(getattr(args, "mg_smoother_steps", [0, 4])),
            "coarsest": getattr(args, "mg_coarsest", "auto"), "precision": getattr(args, "mg_precision", "double"),
            "compare": getattr(args, "mg_compare", True)}


def solve_field_mg(D, mass, b, operator, tol, maxiter, mg):
    """x = M^-1 b by multigrid (and, with mg["compare"], the even-odd CG solve next to it)."""
    from solvers import cg, even_odd_inverse, norm2
    from solvers.multigrid import MultigridError, multigrid

    if operator != "M":
        raise SolveError(f"--solver mg solves M x = b: use --operator M, not {operator}")
    opts = dict(mg_options(None), compare=False)
    opts.update(mg or {})
    compare = opts.pop("compare")
    geom = D.geom
    try:
        inv = multigrid(tol, maxiter, **opts)(D.matrix(mass))
    except MultigridError as e:
        raise SolveError(str(e)) from None
    x, st = inv.solve(b)
    bb = norm2(geom, b)
    full = math.sqrt(norm2(geom, b - D.matrix(mass)(x)) / bb) if bb > 0 else 0.0
    res = {"iters": st.iters, "milc_iters": st.iters, "true_residual": st.true_residual, "converged": st.converged,
           "flops": st.flops, "time_s": st.time, "full_residual": full, "precision": st.precision,
           "gflops": st.flops / st.time / 1e9 if st.time > 0 else 0.0,
           "solves": [{"solver": st.solver, "converged": bool(st.converged), "iters": st.iters,
                       "true_residual": st.true_residual, "time_s": st.time}],
           "mg": {"setup_time_s": st.setup_time, "solve_time_s": st.solve_time, "outer_iters": st.iters,
                  "fine_applies": st.fine_applies, "setup_fine_applies": st.setup_fine_applies,
                  "levels": [{k: v for k, v in d.items() if k != "time_inclusive"} for d in st.levels],
                  "level_lines": st.level_lines(),
                  "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in
                             (("levels", inv.params.levels), ("blocks", [list(b) for b in inv.params.blocks]),
                              ("nv", inv.params.nv), ("setup_iters", inv.params.setup_iters),
                              ("smoother_steps", inv.params.smoother_steps),
                              ("precision", inv.params.precision))}}}
    if compare:
        xc, sc = even_odd_inverse(D.even_odd(mass), cg(tol, 100000), check_residual=True).solve(b)
        res["cg_compare"] = {"iters": sc.iters, "fine_applies": sc.matvecs + 1, "time_s": sc.time,
                             "full_residual": sc.full_residual, "converged": bool(sc.converged),
                             "rel_diff_to_mg": math.sqrt(norm2(geom, x - xc) / norm2(geom, xc))}
    return x, res


def run(args) -> dict:
    """``hmc solve`` without printing: the result dictionary (the --json output)."""
    if args.out is not None and not args.out:
        raise SolveError("--out needs a file name")
    if args.out and os.path.isdir(args.out):
        raise SolveError(f"--out {args.out} is a folder: name the file to write in it, e.g. "
                         f"{os.path.join(args.out, 'solution.npy')}")
    u, links, info = load_links(args)
    geom = u.geom
    D = make_dslash(links)
    b, src_desc = make_source(geom, args)
    from solvers import norm2

    if norm2(geom, b) == 0.0:
        raise SolveError("the source is zero everywhere: nothing to solve")
    ref = read_vector(args.check, geom, "reference") if args.check else None
    x, res = solve_field(D, args.mass, b, args.operator, args.solver, args.tol, args.maxiter, mg_options(args))
    out = describe_links(args, info)
    out.update({"operator": args.operator, "source": src_desc, "solver": args.solver, "tol": args.tol})
    out.update(res)
    if ref is not None:
        out["check"] = dict(compare(geom, x, ref), reference=args.check)
    if args.out:
        xg = geom.gather(x)
        if xg is not None:
            if args.out.endswith(".npy"):
                from lattice.io.common import atomic_write

                with atomic_write(args.out) as f:
                    np.save(f, xg)
                out["out"] = {"path": args.out, "format": "npy"}
            else:
                what = "M^-1 source" if args.operator == "M" else "(MdaggerM)^-1 source"
                sums = write_color_vector(args.out, xg, args.out_precision,
                                          title=f"hisq-hmc solve: {links_line(describe_links(args, info))}",
                                          info=f"answer = {what}")
                out["out"] = {"path": args.out, "format": "scidac", "precision": args.out_precision,
                              "checksums": {"suma": f"{sums['suma']:x}", "sumb": f"{sums['sumb']:x}"}}
    return out


def format_result(r: dict) -> str:
    op = "x = M^-1 b" if r["operator"] == "M" else "x = (M^dag M)^-1 b"
    s = r["source"]
    src = {"file": lambda: f"file {s.get('path')}", "random": lambda: f"random (seed {s.get('seed')})",
           "point": lambda: f"point at {tuple(s.get('site', ()))}, colour {s.get('color')}"}[s["kind"]]()
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
        lines.append(f"multigrid: set-up {g['setup_time_s']:.3f} s ({g['setup_fine_applies']} fine vector "
                     f"applications), solve {g['solve_time_s']:.3f} s, {g['outer_iters']} outer iterations, "
                     f"{g['fine_applies']} fine-operator applications")
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
        kind = "NumPy array" if o["format"] == "npy" else f"SciDAC colour vector, {o['precision']}-bit"
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
    from solvers import SolverConvergenceError

    try:
        r = run(args)
    except (SolveError, SolverConvergenceError) as e:
        return report_error(args, e)
    if _rank0(r):
        print(json.dumps(r, indent=2) if args.json else format_result(r))
    return 0


def _rank0(_r=None) -> bool:
    try:
        from comms import world

        return world().rank == 0
    except Exception:
        return True
