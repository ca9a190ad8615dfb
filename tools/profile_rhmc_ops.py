"""Where a trajectory's time goes, operation by operation: ``hmc run`` of a production deck in this process with every
dispatched operation (:func:`lattice.placement.lookup`: smearing, unitarization, the chain rule's pieces, the gauge
force, outer products) and the multishift solves' two stages timed, the device synchronized around each.

    PYTHONPATH=. python3 tools/profile_rhmc_ops.py 32 --backend cupy --trajectories 2 [--cgprec 1 2 2]

Prints, for the last trajectory, each operation's calls, seconds and ms a call, nested operations under their caller
(``caller/callee``, inclusive times), and for the multishift solves by phase (GR, FA, MD): the first stage and the
refinement (seconds, iterations). The synchronizations cost a little; the totals are close to ``hmc bench rhmc``'s.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.rhmc import make_deck  # noqa: E402
from hmc import cli, run as hmc_run  # noqa: E402
from lattice import placement  # noqa: E402
from solvers import multishift  # noqa: E402

TOTALS = defaultdict(lambda: [0, 0.0])       # path -> [calls, seconds]
STACK: list = []
SYNC = [lambda: None]


def _timed(label, fn):
    """``fn`` timed under the frame ``label`` of the stack (inclusive seconds, keyed by the path of labels)."""
    def run(*a, **k):
        SYNC[0]()
        path = "/".join(STACK + [label])
        STACK.append(label)
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SYNC[0]()
            STACK.pop()
            rec = TOTALS[path]
            rec[0] += 1
            rec[1] += time.perf_counter() - t
    return run


def _timed_lookup(original):
    def lookup(name, geom, config=None, **ctx):
        fn = original(name, geom, config, **ctx)
        if name in ("staggered.hop", "solvers.fused_blas"):       # built once per operator, run inside graphs
            return fn
        return _timed(name, fn)
    return lookup


def _patch_lookups() -> None:
    wrapped = _timed_lookup(placement.lookup)
    for mod in list(sys.modules.values()):
        if getattr(mod, "lookup", None) is placement.lookup:
            mod.lookup = wrapped
    placement.lookup = wrapped


def _patch_refinement() -> None:
    cls = multishift.RefinedShiftInverse
    solve, refine = cls._solve, multishift.ShiftByShift.solve_from_residuals

    def _solve(self, b, guesses):
        return _timed("multishift (both stages)", lambda: solve(self, b, guesses))()

    def _refine(self, b, guesses, residuals):
        out = _timed("refinement", lambda: refine(self, b, guesses, residuals))()
        TOTALS["/".join(STACK + ["refinement iterations"])][0] += int(self.stats.iters)
        return out
    cls._solve, multishift.ShiftByShift.solve_from_residuals = _solve, _refine


def _patch_methods() -> None:
    """The monomials' phases, the link updates and the chain rule as named frames of the stack."""
    from force import hisq_force as hf, hisq_links, phases
    from solvers import staggered
    from hmc import monomials, rhmc, trajectory
    from lattice import gauge, su3

    for owner, attr, label in ((rhmc.FermionMonomial, "refresh", "fermion heat bath"),
                               (rhmc.FermionMonomial, "action", "fermion action"),
                               (rhmc.FermionMonomial, "force", "fermion force"),
                               (rhmc.FermionMonomial, "links", "fermion links (smearing, cached)"),
                               (monomials.GaugeMonomial, "force", "gauge force"),
                               (gauge.GaugeField, "reunitarize", "reunitarize"),
                               (hf, "hisq_level2_vjp", "chain rule level 2 (with phases, sums)"),
                               (hisq_links, "hisq_level1", "level 1 (fat7, unitarization)"),
                               (hisq_links, "smear", "level 2 (smear)"),
                               (phases, "apply_phases", "phases applied"),
                               (staggered.StaggeredDslash, "set_links", "operator's links set (tables)")):
        setattr(owner, attr, _named(label, getattr(owner, attr)))
    rhmc.hisq_force = _named("chain rule (hisq_force)", rhmc.hisq_force)
    trajectory.su3.exp_update = _named("link update (exp_update)", su3.exp_update)
    solve = rhmc.FermionMonomial._solve

    def _solve(self, ls, k, phase, call, b, label=None):
        return _timed(f"solve {label or phase} pf {k}", solve)(self, ls, k, phase, call, b, label)
    rhmc.FermionMonomial._solve = _solve


def _named(label, fn):
    def run(*a, **k):
        return _timed(label, fn)(*a, **k)
    return run


def _patch_trajectory(cprofile: str | None, cuda_profile: int | None = None) -> None:
    """Each trajectory starts the tables afresh (the last one is printed); with ``cprofile``, each runs under
    cProfile, its host-side table written to that file (the last trajectory's stays); with ``cuda_profile`` n,
    trajectory n runs between cupy.cuda.profiler.start() and stop() (for ``ncu --profile-from-start off``)."""
    original = hmc_run.hmc_trajectory
    count = [0]

    def traj(*a, **k):
        TOTALS.clear()
        count[0] += 1
        if cuda_profile is not None:
            if count[0] != cuda_profile:
                return original(*a, **k)
            import cupy as cp

            SYNC[0]()
            cp.cuda.profiler.start()
            try:
                return original(*a, **k)
            finally:
                SYNC[0]()
                cp.cuda.profiler.stop()
        if cprofile is None:
            return _timed("trajectory", original)(*a, **k)
        prof = cProfile.Profile()
        out = prof.runcall(original, *a, **k)
        SYNC[0]()
        with open(cprofile, "w") as f:
            stats = pstats.Stats(prof, stream=f)
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats(70)
        return out
    hmc_run.hmc_trajectory = traj


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("L", type=int)
    p.add_argument("--backend", default="cupy")
    p.add_argument("--deck", default=str(ROOT / "runs" / "hisq211_16.toml"))
    p.add_argument("--trajectories", type=int, default=2)
    p.add_argument("--steps", type=int, default=36)
    p.add_argument("--cgprec", nargs=3, type=int, default=[1, 2, 2])
    p.add_argument("--cprofile", metavar="FILE", help="instead of the timers: cProfile each trajectory (host time, "
                                                       "no synchronizations added), the last one's tables to FILE")
    p.add_argument("--cuda-profile", type=int, metavar="N", help="instead of the timers: trajectory N between "
                   "cupy.cuda.profiler.start and stop, for ncu --profile-from-start off (tools/device/ncu_kernels.sh)")
    args = p.parse_args(argv)
    plain = args.cprofile is None and args.cuda_profile is None
    if args.backend == "cupy":
        import cupy as cp
        SYNC[0] = cp.cuda.Device().synchronize
    out = Path(tempfile.mkdtemp())
    deck, runfile = out / "deck.toml", out / "run.h5"
    make_deck(Path(args.deck), deck, args.L, args.steps, args.trajectories, args.cgprec)
    if cli.main(["--backend", args.backend, "init", str(deck), "-o", str(runfile), "--force"]) != 0:
        return 1
    if plain:
        _patch_lookups()
        _patch_refinement()
        _patch_methods()
    _patch_trajectory(args.cprofile, args.cuda_profile)
    rc = cli.main(["--backend", args.backend, "run", str(runfile), "--no-progress"])
    if not plain:
        return rc
    print(f"\nthe last trajectory, {args.L}^4 {args.backend}, operation by operation (inclusive seconds; the "
          "pseudofermions' solves summed):")
    summed = defaultdict(lambda: [0, 0.0])
    for path, (calls, secs) in TOTALS.items():
        rec = summed[re.sub(r" pf \d+", "", path)]
        rec[0] += calls
        rec[1] += secs
    for path, (calls, secs) in sorted(summed.items()):
        if path.endswith("refinement iterations"):
            print(f"  {path:90s} {calls:8d} iterations")
        else:
            print(f"  {path:90s} {calls:6d} calls {secs:9.3f} s {1e3 * secs / max(calls, 1):9.3f} ms a call")
    return rc


if __name__ == "__main__":
    sys.exit(main())
