"""Multigrid against mixed-precision CG at the lightest mass (issue 7, "Benchmarks"; docs/multigrid.md).

    PYTHONPATH=. python3 -m hmc bench mg --lattice 32 [--mass 0.001] [--tol 1e-10] [--budget 130] [--out DIR]

One process, four phases, each timed; the JSON (``mg_bench_L<L>.json``) is rewritten after every phase, so a run
stopped by ``timeout`` still says how far it got and what each phase cost:

1. gauge field: a quenched Wilson beta = 6.0 configuration made here (no file needed): cold start, then
   ``--therm`` pure-gauge molecular-dynamics trajectories (Omelyan, ``--steps`` steps, tau 1) without the
   accept/reject step (warm-up trajectories, as a deck's ``warmups``; the O(dt^2) bias of the unadjusted dynamics
   is not corrected). The plaquette of every trajectory is stored: it reaches the equilibrium value
   (ReTr P/3 = 0.5937 at beta 6.0) within ~15 trajectories; the low modes and the topology are not decorrelated
   from the start, so the field is rough and thermalized in the plaquette, not an independent ensemble member.
2. HISQ fat and long links (eps 0, antiperiodic time) of that field;
3. mixed-precision CG (single-precision iteration, reliable updates in double: ``solvers.mixed_cg``) on the
   even-site system 4m^2 - D_eo D_oe, odd sites reconstructed, stopping at |r_e| <= tau |(M^dag b)_e| with
   tau = tol 2m |b| / |(M^dag b)_e|, so that the full residual |b - M x| = |r_e|/(2m) meets the same tol |b| as
   multigrid's; after a short warm-up solve (kernel compilation);
4. multigrid (Kahler-Dirac step + aggregation, ``solvers.multigrid``; on one GPU its CuPy kernels for X^-1 and
   the coarse stencil): set-up (near-null vectors, transfers, coarse operators, LU) timed on its own, then the
   solve of the same random source, and, when the budget allows, a second source (warm: the first solve also
   compiles the kernels of the Krylov loops). The solve of the second source is the one compared.

Operator applications: multigrid's are the applications of M during the solve (the outer GCR, the level-0
smoother, the level-1 K-cycle's A = X^-1 M); CG's are its A_m products (each two half-lattice hops: one
M-equivalent, in single precision) plus one for the source preparation and reconstruction. Both true residuals
|b - M x|/|b| are recomputed here in double precision. Break-even number of right-hand sides:
setup / (t_cg - t_mg) when multigrid's solve is faster; the issue's goal compares 12 t_cg with setup + 12 t_mg.

The multigrid hierarchy by default: 4^4 aggregates of the fine lattice, then 2^4 aggregates of each coarse
lattice until it is 2^4 (8^4: 3 levels, 16^4: 4, 32^4: 5), so the coarsest solve is an exact LU of 16 x 2 Nv
unknowns (a sparse LU of a larger 4-d stencil fills in and takes minutes on the host; with ``--mg-coarsest auto``
a coarsest lattice of more than 5000 unknowns is solved by GCR instead); Nv 48 on every level,
50 set-up iterations (more do not help: solvers/multigrid's notes), smoothers (0, 4) (none on M itself), the
preconditioner in double precision (``--mg-precision single``: K-cycle, smoothers, coarse operators and coarsest
solve in complex64, the outer GCR in double).
The ``--mg-*`` options change them; the suite ``mg`` of bench/suites.toml runs it on a GPU (its variable ``args``
passes more options). The backend: ``--backend``, else the run configuration's when it states one (HMC_BACKEND),
else auto.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback

import numpy as np

from hmc.cli import count
from lattice import Geometry, get_backend

from .mg_batched import run_mg_batched

T_START = time.perf_counter()
LU_MAX_UNKNOWNS = 5000             # "auto" coarsest: exact LU up to this many unknowns, GCR above
PLAQ_EQUILIBRIUM = 0.5937          # <ReTr P>/3, quenched Wilson beta 6.0, large volume (runs/wilson8_b6.toml)


def elapsed() -> float:
    return time.perf_counter() - T_START


# ------------------------------------------------------------------------------------------------ arguments
def parse(argv=None):
    """The arguments of ``python -m bench.mg``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(p)
    return finish_args(p.parse_args(argv))


def add_arguments(p, backend: bool = True):
    """The benchmark's options on ``p`` (``hmc bench mg``: ``backend=False``, the global ``--backend`` holds it)."""
    p.add_argument("--lattice", type=count(2), default=32, help="L of the L^4 lattice (default 32)")
    p.add_argument("--mass", type=float, default=0.001, help="bare quark mass m, M = 2m + D (default 0.001)")
    p.add_argument("--tol", type=float, default=1e-10, help="|b - M x| <= tol |b| for both solvers (default 1e-10)")
    p.add_argument("--beta", type=float, default=6.0, help="Wilson gauge coupling (default 6.0)")
    p.add_argument("--therm", type=count(0), default=20, help="pure-gauge trajectories from the cold start (default 20)")
    p.add_argument("--steps", type=count(1), default=10, help="Omelyan steps per trajectory, tau 1 (default 10)")
    p.add_argument("--seed", type=int, default=7, help="seed of the momenta and of the sources")
    p.add_argument("--budget", type=float, default=130.0,
                   help="seconds this process plans within: thermalization stops at 25%% of it, the second "
                        "multigrid source is skipped when it would not fit (default 130)")
    p.add_argument("--cg-maxiter", type=count(1), default=30000, help="most CG iterations (default 30000)")
    if backend:
        p.add_argument("--backend", default=None, help="numpy, cupy or auto (default: HMC_BACKEND, else auto)")
    p.add_argument("--out", default=".", help="folder of the JSON and Markdown files (default .)")
    g = p.add_argument_group("multigrid")
    g.add_argument("--mg-levels", type=int, default=None, help="levels (default from the lattice, see above)")
    g.add_argument("--mg-blocks", default=None, help='aggregation blocks, e.g. "4,4,4,4 2,2,2,2" (one per aggregation level)')
    g.add_argument("--mg-nv", default="48", help='near-null vectors per level, e.g. "24" or "24 32"')
    g.add_argument("--mg-setup-iters", default="50", help="set-up CG iterations per level")
    g.add_argument("--mg-smoother-steps", default="0 4", help="GCR smoother steps")
    g.add_argument("--mg-coarsest", default="auto", choices=("auto", "lu", "gcr"))
    p.add_argument("--scan-masses", type=float, nargs="*", default=[],
                   help="after the comparison, multigrid (same near-null vectors) and CG at these masses too: "
                        "the flat-in-mass check (e.g. 0.1 0.01)")
    g.add_argument("--mg-maxiter", type=count(1), default=300, help="most outer iterations (default 300)")
    g.add_argument("--mg-batch", type=count(0), default=0,
                   help="also solve this many right-hand sides at once (solvers/multigrid/batched.py: one batched "
                        "outer GCR and K-cycle) and report their time as the batched 12-rhs figure (12; default 0: off)")
    g.add_argument("--mg-precision", default="double", choices=("double", "single", "half"),
                   help="precision of the preconditioner (K-cycle, smoothers, coarse operators, coarsest solve); "
                        "the outer GCR and its true residual stay double (default double)")


def finish_args(a):
    """The run configuration (``a.run_config``: the command line's, else built from the environment now) and the
    backend: ``--backend``, else the configuration's when it states one, else auto."""
    from comms.config import RunConfig

    if getattr(a, "run_config", None) is None:
        a.run_config = RunConfig.from_environment()
    if a.backend is None:
        a.backend = a.run_config.backend if "backend" in a.run_config.stated else "auto"
    return a


def ints(s) -> list[int]:
    return [int(v) for v in str(s).replace(",", " ").split()]


def hierarchy_params(args, dims) -> dict:
    """Levels and blocks: explicit ones, or 4^4 then 2^4 aggregates until the coarse lattice is 2^4."""
    if args.mg_blocks:
        blocks = [tuple(ints(b)) for b in args.mg_blocks.split()]
    else:
        blocks, c = [(4, 4, 4, 4)], [n // 4 for n in dims]
        while all(n % 2 == 0 and n > 2 for n in c) and (args.mg_levels is None or len(blocks) + 2 < args.mg_levels):
            blocks.append((2, 2, 2, 2))
            c = [n // 2 for n in c]
    if args.mg_levels is not None:
        blocks = blocks[:max(1, args.mg_levels - 2)]
    nv = ints(args.mg_nv)
    coarse = int(np.prod(dims))
    for b in blocks:
        coarse //= int(np.prod(b))
    coarsest = args.mg_coarsest
    if coarsest == "auto" and coarse * 2 * nv[min(len(blocks), len(nv)) - 1] > LU_MAX_UNKNOWNS:
        coarsest = "gcr"        # a host sparse LU of a larger 4-d stencil fills in: minutes, not seconds
    return {"levels": len(blocks) + 2, "blocks": blocks, "nv": nv, "setup_iters": ints(args.mg_setup_iters),
            "smoother_steps": ints(args.mg_smoother_steps), "coarsest": coarsest, "precision": args.mg_precision}


# ------------------------------------------------------------------------------------------------ output
class Report:
    """The result dictionary, written (atomically) after every phase."""

    def __init__(self, args):
        self.args = args
        os.makedirs(args.out, exist_ok=True)
        self.base = os.path.join(args.out, f"mg_bench_L{args.lattice}")
        self.r = {"what": "issue 7 benchmark: KD multigrid against mixed-precision CG at the lightest mass",
                  "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                  "lattice": [args.lattice] * 4, "mass": args.mass, "tol": args.tol, "status": "running",
                  "phases_s": {}, "machine": machine(), "commit": commit(args.run_config)}

    def start(self, name):
        """Mark the phase now running (what a run stopped by timeout was doing)."""
        self.r["in_progress"] = name
        self.r["elapsed_s"] = round(elapsed(), 3)
        self.write()

    def phase(self, name, t0):
        self.r.pop("in_progress", None)
        self.r["phases_s"][name] = round(time.perf_counter() - t0, 3)
        self.r["elapsed_s"] = round(elapsed(), 3)
        self.write()

    def write(self):
        tmp = self.base + ".json.tmp"
        with open(tmp, "w") as f:
            json.dump(self.r, f, indent=2, default=_jsonable)
        os.replace(tmp, self.base + ".json")
        with open(self.base + ".md", "w") as f:
            f.write(markdown(self.r) + "\n")


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    return str(o)


def machine() -> dict:
    d = {"host": platform.node(), "python": platform.python_version()}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        d["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        d["cupy"] = cupy.__version__
    except Exception:
        d["gpu"] = None
    return d


def commit(config) -> str:
    """The configuration's git_commit (HMC_GIT_COMMIT) when set (the device copy of the tree may carry a stale
    .git), else git's HEAD."""
    import subprocess

    if config.git_commit:
        return config.git_commit
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                           cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except Exception:
        c = ""
    return c or "unknown"


def fmt(v, spec=".3g", none="-"):
    if v is None:
        return none
    if isinstance(v, str):
        return v
    return format(v, spec)


def markdown(r: dict) -> str:
    L = "x".join(map(str, r["lattice"]))
    lines = [f"# Multigrid against mixed-precision CG, {L}, m = {r['mass']:g}, tol {r['tol']:.0e}", ""]
    m = r.get("machine", {})
    lines.append(f"Backend {r.get('backend', '?')} ({m.get('gpu') or 'CPU'}), commit {r.get('commit')}, "
                 f"status: **{r['status']}**, {r.get('elapsed_s', 0):.1f} s in all.")
    g = r.get("gauge")
    if g:
        lines += ["", f"Gauge field: {g['description']}"]
    cg, mg, c = r.get("cg"), r.get("mg"), r.get("comparison", {})
    lines += ["", "| | mixed-precision CG (even-odd) | multigrid (KD + aggregation) |", "| --- | --- | --- |"]

    def row(label, a, b):
        lines.append(f"| {label} | {a} | {b} |")

    s = (mg or {}).get("solve")
    row("set-up time", "-", f"{fmt(mg.get('setup_time_s'))} s" if mg and "setup_time_s" in mg else "-")
    row("solve time (compared)", f"{fmt(cg['time_s'])} s" if cg else "-", f"{fmt(s['time_s'])} s" if s else "-")
    if mg and mg.get("solves") and len(mg["solves"]) > 1:
        row("solve time, first source (compiles kernels)", "-", f"{fmt(mg['solves'][0]['time_s'])} s")
    row("iterations", f"{cg['iters']} CG" if cg else "-", f"{s['outer_iters']} outer (flexible GCR)" if s else "-")
    row("fine-operator applications per solve (M-equivalent)",
        f"{cg['fine_applies']} (single precision)" if cg else "-",
        f"{s['fine_applies']} (double precision)" if s else "-")
    row("set-up fine-operator vector applications", "-", str(mg["setup_fine_applies"]) if mg and
        "setup_fine_applies" in mg else "-")
    row("true residual \\|b - M x\\|/\\|b\\|", fmt(cg["true_residual"], ".2e") if cg else "-",
        fmt(s["true_residual"], ".2e") if s else "-")
    row("converged", str(cg["converged"]) if cg else "-", str(s["converged"]) if s else "-")
    row("stopping rule", f"\\|r_e\\| <= {fmt(cg['tol_even'], '.2e')} \\|(M^dag b)_e\\|" if cg else "-",
        f"\\|b - M x\\| <= {r['tol']:.0e} \\|b\\| (recomputed)")
    if c:
        lines += ["", "| comparison | value |", "| --- | --- |"]
        for k, label, spec in (("applications_ratio", "CG applications / MG applications per solve (goal >= 5)",
                                ".2f"),
                               ("time_ratio", "CG solve time / MG solve time", ".2f"),
                               ("break_even_rhs", "break-even right-hand sides, set-up / (t_cg - t_mg)", ".1f"),
                               ("cg_12_rhs_s", "12 right-hand sides by CG (s)", ".3g"),
                               ("mg_12_rhs_s", "12 right-hand sides by MG, set-up included (s)", ".3g"),
                               ("mg_12_rhs_batched_s", "12 right-hand sides by batched MG, set-up included (s)",
                                ".3g"),
                               ("rel_diff_mg_cg", "\\|x_mg - x_cg\\|/\\|x_cg\\|", ".2e")):
            if k in c:
                v = c[k]
                lines.append(f"| {label} | {fmt(v, spec) if not isinstance(v, str) else v} |")
        if "goal_12_rhs" in c:
            lines.append(f"| wall-clock win over 12 right-hand sides | {c['goal_12_rhs']} |")
    if r.get("mass_scan"):
        lines += ["", "Flat in mass (the same near-null vectors at every mass; docs/multigrid.md: MG outer iterations within "
                      "30 % from m = 0.1 to 0.001 while CG's grow):", "",
                  "| m | CG iterations | CG applications | MG outer | MG applications | CG/MG applications | "
                  "MG rebuild (X^-1, coarse ops) | MG solve | CG solve |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for q in r["mass_scan"]:
            if "mg_outer" not in q:
                lines.append(f"| {q['mass']:g} | {q.get('skipped', '-')} | | | | | | | |")
                continue
            lines.append(f"| {q['mass']:g} | {q['cg_iters']} | {q['cg_applies']} | {q['mg_outer']} | {q['mg_applies']} | "
                         f"{q['cg_applies'] / max(q['mg_applies'], 1):.2f} | {fmt(q['mg_rebuild_s'])} s | "
                         f"{fmt(q['mg_time_s'])} s | {fmt(q['cg_time_s'])} s |")
        if "mass_scan_spread" in r:
            lines.append(f"\nMG outer iterations: largest / smallest - 1 = {r['mass_scan_spread']:.2f} (goal <= 0.30).")
    if mg and mg.get("params"):
        p = mg["params"]
        lines += ["", f"Multigrid: {p['levels']} levels, blocks {p['blocks']}, Nv {p['nv']}, set-up iterations "
                      f"{p['setup_iters']}, smoothers {p['smoother_steps']}, coarsest {mg.get('coarsest', '?')}, "
                      f"preconditioner in {p.get('precision', 'double')} precision."]
    if s and s.get("level_lines"):
        lines += ["", "Per level (compared solve):", "", "```"] + s["level_lines"] + ["```"]
    if r.get("phases_s"):
        lines += ["", "Phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())]
    if r.get("error"):
        lines += ["", f"Error: `{r['error']}`"]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ phases
def thermalize(args, geom, rep):
    """Cold start, then pure-gauge MD trajectories (no accept/reject); stores the plaquette history."""
    from hmc.assemble import make_gauge_action
    from hmc.integrators import Level, build_schedule
    from hmc.monomials import GaugeMonomial
    from hmc.trajectory import hmc_trajectory
    from lattice import CounterRNG, GaugeField
    from lattice.gauge import plaquette

    rep.start("gauge")
    t0 = time.perf_counter()
    rng = CounterRNG(args.seed)
    u = GaugeField.unit(geom)
    mon = [GaugeMonomial(make_gauge_action({"action": "wilson", "beta": args.beta}))]
    sched = build_schedule([Level("omelyan", args.steps, ["gauge"])], 1.0)
    plaqs, dhs, times = [], [], []
    limit = 0.25 * args.budget
    for i in range(args.therm):
        t1 = time.perf_counter()
        u, res = hmc_trajectory(u, rng, mon, sched, metropolis=False)
        ps, pt = plaquette(u)
        plaqs.append(round((ps + pt) / 6.0, 6))            # <ReTr P>/3 over all planes
        dhs.append(round(float(res.delta_h), 4))
        times.append(round(time.perf_counter() - t1, 3))
        if time.perf_counter() - t0 > limit and i + 1 < args.therm:
            break
    n = len(plaqs)
    tail = plaqs[-5:]
    # thermalized in the plaquette: the last five within 1% of the equilibrium value (beta 6.0 only)
    thermalized = args.beta == 6.0 and all(abs(p / PLAQ_EQUILIBRIUM - 1) < 0.01 for p in tail) and n >= 5
    verdict = ("thermalized in the plaquette, low modes and topology not decorrelated from the start" if thermalized
               else "NOT thermalized in the plaquette (more trajectories needed: --therm, --budget)"
               if args.beta == 6.0 else f"equilibrium plaquette at beta {args.beta:g} not known here")
    desc = (f"quenched Wilson beta {args.beta:g}, made here: cold start and {n} pure-gauge MD trajectories "
            f"(Omelyan {args.steps} steps, tau 1, no accept/reject); plaquette <ReTr P>/3 = {plaqs[-1]:.4f} "
            f"(last {len(tail)}: {min(tail):.4f}..{max(tail):.4f}; equilibrium at beta 6.0 {PLAQ_EQUILIBRIUM}); "
            f"{verdict}")
    rep.r["gauge"] = {"description": desc, "start": "cold", "action": "wilson", "beta": args.beta,
                      "trajectories": n, "requested": args.therm, "steps": args.steps, "tau": 1.0,
                      "metropolis": False, "thermalized_in_plaquette": thermalized, "plaquette_history": plaqs, "delta_h": dhs, "trajectory_s": times}
    rep.phase("gauge", t0)
    print(f"[{elapsed():6.1f} s] gauge: {desc}", flush=True)
    return u


def fermion_links(args, u, rep):
    from force.hisq_links import hisq_links
    from solvers import StaggeredDslash

    rep.start("hisq_links")
    t0 = time.perf_counter()
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    D = StaggeredDslash(u.geom, links.fat, links.long)
    u.geom.backend.synchronize()
    rep.r["links"] = {"action": "hisq", "eps": 0.0, "time_bc": "antiperiodic"}
    rep.phase("hisq_links", t0)
    print(f"[{elapsed():6.1f} s] HISQ links {rep.r['phases_s']['hisq_links']:.2f} s", flush=True)
    return D


def true_residual(geom, M, x, b) -> float:
    from solvers import norm2

    return math.sqrt(norm2(geom, b - M(x)) / norm2(geom, b))


def cg_solve(args, D, b, m):
    """Mixed-precision even-odd CG at mass m with the full-system tolerance of multigrid: (x, result dict)."""
    from solvers import even_odd_inverse, mixed_cg, norm2

    geom = D.geom
    M_eo = D.even_odd(m)
    src = M_eo.prepare(b)
    tol_even = args.tol * 2 * m * math.sqrt(norm2(geom, b) / norm2(geom, src))
    tol_even = max(tol_even, 1e-15)
    inv = even_odd_inverse(M_eo, mixed_cg(tol_even, args.cg_maxiter, raise_on_fail=False), check_residual=False)
    t0 = time.perf_counter()
    x, st = inv.solve(b)
    geom.backend.synchronize()
    t = time.perf_counter() - t0
    res = true_residual(geom, D.matrix(m), x, b)
    return x, {"solver": "mixed-precision CG (complex64 iteration, reliable updates), even-odd",
               "tol_even": tol_even, "iters": st.iters, "matvecs": st.matvecs, "restarts": st.restarts,
               "fine_applies": st.matvecs + 1, "time_s": t, "true_residual": res,
               "even_residual": st.true_residual, "converged": bool(res <= args.tol * 1.0001),
               "cg_converged_flag": bool(st.converged), "precision": st.precision}


def run_cg(args, D, b, rep):
    """Mixed-precision even-odd CG at the benchmark's mass, after a short warm-up solve (kernel compilation)."""
    from solvers import even_odd_inverse, mixed_cg

    geom, m = D.geom, args.mass
    rep.start("cg")
    t0 = time.perf_counter()
    even_odd_inverse(D.even_odd(m), mixed_cg(1e-2, 20, raise_on_fail=False), check_residual=False).solve(b)
    geom.backend.synchronize()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    x, rep.r["cg"] = cg_solve(args, D, b, m)
    rep.r["cg"]["warmup_s"] = warm
    rep.phase("cg", t0)
    c = rep.r["cg"]
    print(f"[{elapsed():6.1f} s] mixed CG: {c['iters']} iterations, {c['time_s']:.3f} s, true residual "
          f"{c['true_residual']:.2e} (even tol {c['tol_even']:.2e})", flush=True)
    return x


def run_mass_scan(args, D, b, rep):
    """docs/multigrid.md's flat-in-mass check: multigrid (the same near-null vectors, ``with_mass``: new X^-1, coarse
    operators and LU) against mixed CG at every mass of ``--scan-masses``; the benchmark's own mass is taken from
    the comparison above."""
    inv = getattr(rep, "inverse", None)
    if inv is None or not args.scan_masses:
        return
    scan = rep.r["mass_scan"] = []
    cg0, s0 = rep.r["cg"], rep.r["mg"]["solves"][0]       # the first multigrid source is CG's b
    for m in sorted(set(args.scan_masses) | {args.mass}, reverse=True):
        if m == args.mass:
            row = {"mass": m, "cg_iters": cg0["iters"], "cg_applies": cg0["fine_applies"], "cg_time_s": cg0["time_s"],
                   "mg_outer": s0["outer_iters"], "mg_applies": s0["fine_applies"],
                   "mg_time_s": rep.r["mg"]["solve"]["time_s"],
                   "mg_rebuild_s": 0.0, "mg_true_residual": s0["true_residual"]}
        else:
            if elapsed() + 20 > args.budget:
                row = {"mass": m, "skipped": f"budget ({elapsed():.0f} s used of {args.budget:g})"}
                scan.append(row)
                rep.write()
                continue
            rep.start(f"scan_{m:g}")
            t0 = time.perf_counter()
            _, c = cg_solve(args, D, b, m)
            t1 = time.perf_counter()
            im = inv.with_mass(m)
            im.setup()
            D.geom.backend.synchronize()
            rebuild = time.perf_counter() - t1
            t2 = time.perf_counter()
            x, st = im.solve(b)
            D.geom.backend.synchronize()
            t_mg = time.perf_counter() - t2
            row = {"mass": m, "cg_iters": c["iters"], "cg_applies": c["fine_applies"], "cg_time_s": c["time_s"],
                   "mg_outer": st.iters, "mg_applies": st.fine_applies, "mg_time_s": t_mg, "mg_rebuild_s": rebuild,
                   "mg_true_residual": true_residual(D.geom, D.matrix(m), x, b)}
            rep.phase(f"scan_{m:g}", t0)
        scan.append(row)
        rep.write()
        print(f"[{elapsed():6.1f} s] mass scan m = {m:g}: CG {row['cg_iters']} iterations, MG {row['mg_outer']} "
              f"outer ({row['mg_applies']} applications)", flush=True)
    done = [r for r in scan if "mg_outer" in r]
    if len(done) > 1:
        outer = [r["mg_outer"] for r in done]
        rep.r["mass_scan_spread"] = max(outer) / min(outer) - 1.0


def run_mg(args, D, b, b2, rep, x_cg):
    from solvers import norm2
    from solvers.multigrid import multigrid

    geom, m = D.geom, args.mass
    hp = hierarchy_params(args, geom.dims)
    mg = rep.r["mg"] = {"params": dict(hp), "solves": []}
    inv = multigrid(args.tol, args.mg_maxiter, raise_on_fail=False, **hp)(D.matrix(m))
    rep.inverse = inv                                       # the mass scan reuses its near-null vectors
    mg["coarsest"] = inv.hierarchy.coarsest_mode() if inv.hierarchy else None
    rep.start("mg_setup")
    t0 = time.perf_counter()
    inv.setup()
    geom.backend.synchronize()
    mg["setup_time_s"] = time.perf_counter() - t0
    pend = inv._pending
    mg["setup_fine_applies"] = int(sum(c for _, _, c in pend))
    mg["coarsest"] = inv.hierarchy.coarsest_mode()
    mg["levels_built"] = [{"level": l, "lattice": "x".join(map(str, op.geom.dims)),
                           "unknowns": int(op.geom.volume * (op.n if hasattr(op, "n") else 3))}
                          for l, op in enumerate(inv.hierarchy.ops) if op is not None]
    rep.phase("mg_setup", t0)
    print(f"[{elapsed():6.1f} s] MG set-up {mg['setup_time_s']:.2f} s ({mg['setup_fine_applies']} fine vector "
          f"applications), levels {mg['levels_built']}, coarsest {mg['coarsest']}", flush=True)
    x = None
    for k, src in enumerate((b, b2)):
        if k == 1:
            last = mg["solves"][-1]["time_s"]
            if elapsed() + 1.5 * last + 5 > args.budget:
                mg["second_source_skipped"] = f"{elapsed():.0f} s used, first solve {last:.1f} s, budget {args.budget:g} s"
                break
        rep.start(f"mg_solve_{k}")
        t0 = time.perf_counter()
        xk, st = inv.solve(src)
        geom.backend.synchronize()
        t = time.perf_counter() - t0
        res = true_residual(geom, D.matrix(m), xk, src)
        d = {"source": k, "time_s": t, "solve_time_s": st.solve_time, "outer_iters": st.iters,
             "fine_applies": st.fine_applies, "true_residual": res, "converged": bool(res <= args.tol * 1.0001),
             "setup": st.setup, "level_lines": st.level_lines(),
             "levels": [{kk: v for kk, v in lv.items() if kk != "time_inclusive"} for lv in st.levels]}
        if k == 0:
            x = xk
            d["rel_diff_to_cg"] = math.sqrt(norm2(geom, xk - x_cg) / norm2(geom, x_cg))
        mg["solves"].append(d)
        rep.phase(f"mg_solve_{k}", t0)
        print(f"[{elapsed():6.1f} s] MG solve {k}: {st}", flush=True)
        print("    " + "\n    ".join(st.level_lines()), flush=True)
    mg["solve"] = mg["solves"][-1]
    return x


def compare(args, rep, b2_cg_time=None):
    cg, mg = rep.r.get("cg"), rep.r.get("mg")
    if not cg or not mg or not mg.get("solves"):
        return
    s = mg["solve"]
    c = rep.r["comparison"] = {}
    c["applications_ratio"] = cg["fine_applies"] / max(s["fine_applies"], 1)
    c["time_ratio"] = cg["time_s"] / s["time_s"] if s["time_s"] > 0 else None
    c["rel_diff_mg_cg"] = mg["solves"][0].get("rel_diff_to_cg")
    gain = cg["time_s"] - s["time_s"]
    c["break_even_rhs"] = mg["setup_time_s"] / gain if gain > 0 else "never (MG solve not faster than CG)"
    c["cg_12_rhs_s"] = 12 * cg["time_s"]
    c["mg_12_rhs_s"] = mg["setup_time_s"] + 12 * s["time_s"]
    c["goal_12_rhs"] = "yes" if c["mg_12_rhs_s"] < c["cg_12_rhs_s"] else "no"
    bt = mg.get("batched")
    if bt:                                              # the batched solve, scaled to 12 right-hand sides
        c["mg_12_rhs_batched_s"] = mg["setup_time_s"] + bt["time_s"] * 12 / bt["columns"]
        c["goal_12_rhs"] = "yes" if min(c["mg_12_rhs_s"], c["mg_12_rhs_batched_s"]) < c["cg_12_rhs_s"] else "no"
    c["goal_5x_applications"] = "yes" if c["applications_ratio"] >= 5 else "no"


def main(argv=None, args=None) -> int:
    """One benchmark run from ``argv`` (or parsed ``args``, as ``hmc bench mg`` passes them)."""
    args = args if args is not None else parse(argv)
    rep = Report(args)
    be = get_backend(args.backend, args.run_config)          # bad input: one line from hmc (exit 2), no report
    L = args.lattice
    geom = Geometry((L, L, L, L), be, config=args.run_config)
    rep.r["backend"] = be.name
    try:
        hp = hierarchy_params(args, geom.dims)
        print(f"[{elapsed():6.1f} s] mg_bench {L}^4 on {be.name} ({rep.r['machine'].get('gpu') or 'CPU'}), "
              f"m = {args.mass}, tol {args.tol:g}, budget {args.budget:g} s; multigrid {hp}", flush=True)
        u = thermalize(args, geom, rep)
        D = fermion_links(args, u, rep)
        del u
        from hmc.solve import random_source

        b = geom.xp.asarray(random_source(geom, args.seed))
        b2 = geom.xp.asarray(random_source(geom, args.seed + 1))
        x_cg = run_cg(args, D, b, rep)
        run_mg(args, D, b, b2, rep, x_cg)
        if args.mg_batch > 0:
            run_mg_batched(args, geom, rep)
            print(f"[{elapsed():6.1f} s] MG batched solve: {rep.r['mg']['batched']}", flush=True)
        compare(args, rep)
        run_mass_scan(args, D, b, rep)
        ok = rep.r["cg"]["converged"] and rep.r["mg"]["solve"]["converged"]
        rep.r["status"] = "complete" if ok else "complete, but a solver did not reach the tolerance"
        rep.r["elapsed_s"] = round(elapsed(), 3)
        rep.write()
        print(markdown(rep.r), flush=True)
        return 0
    except BaseException as e:          # KeyboardInterrupt / SIGTERM via timeout too: keep what was measured
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)      # a second TERM must not interrupt the report
        where = rep.r.get("in_progress", "start-up")
        rep.r["status"] = (f"stopped by timeout during {where}" if "SIGTERM" in str(e) else f"interrupted during "
                           f"{where}" if isinstance(e, KeyboardInterrupt) else f"failed during {where}: {type(e).__name__}")
        rep.r["error"] = (str(e).splitlines() or [type(e).__name__])[0][:300]
        rep.r["traceback"] = traceback.format_exc()[-3000:]
        compare(args, rep)
        rep.r["elapsed_s"] = round(elapsed(), 3)
        rep.write()
        if isinstance(e, KeyboardInterrupt):       # Ctrl-C (130) or SIGTERM (143): one line, as every hmc command
            print(f"hmc bench mg: {rep.r['status']}; report so far: {rep.base}.json", file=sys.stderr, flush=True)
            return 143 if "SIGTERM" in str(e) else 130
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        return 1


def main_terminable(argv=None, args=None) -> int:
    """:func:`main` with SIGTERM (``timeout``) raised as an interruption, so the report says how far it got."""
    import signal

    def _terminated(signum, frame):
        raise KeyboardInterrupt("SIGTERM (timeout): stopped before the end")

    signal.signal(signal.SIGTERM, _terminated)
    return main(argv, args)


if __name__ == "__main__":
    sys.exit(main_terminable())
