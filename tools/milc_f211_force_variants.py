"""Diagnostic only: MILC's su3_rhmc_hisq.f211.2 trajectory with the force deliberately changed, to test whether a
force that is not the derivative of the action (a 2009 MILC bug or approximation in the charm's Naik-epsilon terms,
or an inconsistent gauge force) could explain our delta S offset of 1.1e-4 to 1.4e-4 from MILC's 2009 outputs.

Each variant runs the deck's one trajectory (about 40 s on one CPU core) with module attributes patched for that
run only, and prints delta S, the end actions and PLAQ; nothing here changes the physics code.

    PYTHONPATH=. python tools/milc_f211_force_variants.py base onelink=0 naik=0 ...

Variants (the charm's epsilon terms of the level-2 chain rule, force.hisq_force.hisq_level2_vjp):
  base          the deck as it is
  onelink=S     the eps W/8 one-link term of the force times S (S = 0: dropped)
  naik=S        the Naik term's weight 1 + eps -> 1 + S eps (S = 0: the eps part dropped)
  level=V|U     the eps one-link term applied to the V (or U) derivative instead of the W one, i.e. skipping the
                U(3) projection's derivative (or both smearing levels)
  yeps0         D_oe X_l of the charm (the odd half of its outer products) with the eps = 0 links
  gauge=X       the gauge force times 1 + X (action unchanged)
  rect=X        the rectangle coefficient of the gauge force (not of the action) times 1 + X
  fermion=X     every fermion force times 1 + X;  lastfermion=X: only the trajectory's last one (12th)
Several may be joined with '+', e.g. onelink=0+naik=0.

Measured (2026-11, NumPy, one CPU core; MILC: delta S -0.09694168 (2009-05), -0.09696766 (2009-09); PLAQ
1.7877231565695, 1.7865454427987 (2009-09)):

  variant                  delta S       PLAQ ss, st
  base                     -0.09708085   1.787723155400 1.786545442502
  onelink=0                -0.36421169   1.787738068447 1.786557154767
  naik=0                   -0.28408998   1.787726435562 1.786548221800
  onelink=0+naik=0         -0.55077004   1.787741347162 1.786559932066
  level=V                  -0.71127022   1.787500833133 1.786323770744
  level=U                  -0.43287897   1.787668272912 1.786469248486
  yeps0                    -0.40799163   1.787729105826 1.786548022907
  onelink=1.01+naik=1.01   -0.09246415   1.787722972163 1.786545296314
  gauge=1e-6               -0.09529602   1.787723926230 1.786546201656
  rect=1e-5                -0.09865688   1.787722554375 1.786544842510
  fermion=1e-4             -0.10688842   1.787723307086 1.786545625197
  lastfermion=0.01         -0.19141662   1.787723791523 1.786546047991
  momenta x (1 + s), s = 0, +-1e-15, +-3e-15, 1e-14 (tools/milc_f211_spread.py): delta S -0.0970749 +- 1.24e-5,
  PLAQ 1.7877231558549 +- 2.3e-9, 1.7865454429522 +- 8.3e-10 (mean +- standard deviation)

MILC's 2009-09 PLAQ lies within 0.3 standard deviations of our rounding cloud, its delta S 8.7 (2009-05: 10.8) away.
Its 34 full-precision G_LOOPs differ from ours by 8e-9 rms (rounding: 1.5e-9), but along the direction our own end
links take when the strange or charm MD solves are made exact (cosine 0.87-0.94, amplitude 9e-9, delta S changes only
-2.6e-5 and +1.4e-5), and our h_end is 1.2e-4 to 1.35e-4 below MILC's while g_end agrees to 1.7e-5. Solver-precision
changes with such small footprints (GR, FA or non-light MD solves made exact, alone or together: decks with
cgresid_md_fa_gr entries set to 1e-10/1e-12) scatter delta S over -0.097128 .. -0.097012 (12 runs with the last-bit
momenta changes: mean -0.0970751, standard deviation 3.4e-5); MILC's values sit 3.1 and 3.9 standard deviations above
that mean (4.4e-5 and 7.0e-5 beyond our largest). With GR and FA solved exactly the start action is 9744.17128215306,
2.0e-8 from MILC's May value (the deck's tolerances: 1.9e-7; all of it the light FA solve). That is no sign of tighter
MILC solves: f_start's truncation error is at the rounding floor (g x (1 + 1e-15) moves it by 2.4e-7), and MILC's
same-day total_iters match ours (tools/milc_f211_hisq2_2009.py). Per 1e-4 of delta S, PLAQ (ss, st) moves by:
  charm epsilon terms scaled (onelink=naik=1.01): -4e-9, -3e-9     (1.00024-1.00030 needed; disfavoured by st)
  discrete epsilon bugs (table above):             2e-9 .. 4e-8     (in size; they move delta S by 0.19-0.61: excluded)
  gauge force or its rectangle coefficient:        4e-8             (excluded)
  every fermion force (fermion=):                  -1.5e-9, -1.9e-9 (-1.2e-6 of itself needed; st 2.5 sd off)
  the last fermion force only (lastfermion=):      -7e-10, -6e-10   (-1.3e-5 of itself needed; compatible)
No epsilon variant matches MILC on both outputs with PLAQ kept: the Naik-epsilon force is not the cause.
A rescaling of the epsilon terms fails the f2111 control (three Naik groups, MILC -0.1272906, ours -0.1273191, inside
its spread -0.1273503 .. -0.1272646): onelink=1.0003+naik=1.0003 gives f211 -0.09696190 but f2111 -0.12721453 (7.6e-5
beyond MILC); naik=1.001 gives f211 -0.09691230, f2111 -0.12696646 (tools/milc_f211_hisq2_2009.py). Both MILC runs
print eps_naik -0.168750. (The start action does not test the epsilon: it is sum |g|^2 up to the solvers'
truncation, unchanged to 1e-9 by eps -0.16876.)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import force.gauge_action as gauge_action  # noqa: E402
import force.hisq_force as hisq_force  # noqa: E402
import hmc.rhmc as rhmc  # noqa: E402
from force import phases as _phases  # noqa: E402
from force.smearing import HISQ_EPS_CORRECTION, HISQ_LEVEL2  # noqa: E402
from force.smearing_derivative import fat_link_vjp, naik_link_vjp  # noqa: E402
from hmc.run import init_run, run  # noqa: E402

#: the number of fermion forces of the deck's trajectory (3G1F, 12 steps: one per step)
LAST_FERMION_FORCE = 12
FIXTURES = Path(os.environ.get("HMC_MILC_FIXTURES", ROOT.parent / "shared" / "fixtures" / "milc"))


@contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def level2_variant(onelink=1.0, naik=1.0, level="W", stash=None):
    """hisq_level2_vjp with the eps one-link term times ``onelink`` (put into ``stash`` when level != W) and the
    Naik weight 1 + naik * eps."""
    def vjp(geom, w, fat_outer, long_outer, time_bc="antiperiodic"):
        xp = geom.xp
        fat_g, long_g = hisq_force._as_groups(fat_outer), hisq_force._as_groups(long_outer)
        eta = _phases.staggered_phases(geom, time_bc)
        d_w = fat_link_vjp(geom, w, HISQ_LEVEL2,
                           _phases.apply_phases(hisq_force._summed(xp, w, [(1.0, f) for f in fat_g.values()]), eta))
        d_x1 = HISQ_EPS_CORRECTION.one_link * _phases.apply_phases(
            hisq_force._summed(xp, w, [(onelink * e, f) for e, f in fat_g.items()]), eta)
        if level == "W":
            d_w += d_x1
        else:
            stash["d"] = d_x1
        d_l = hisq_force._summed(xp, w, [(1.0 + naik * e, f) for e, f in long_g.items()])
        d_w += naik_link_vjp(geom, w, HISQ_LEVEL2.naik, _phases.apply_phases(d_l, _phases.naik_phases(geom, time_bc)))
        return d_w
    return vjp


def apply_variant(stack: ExitStack, spec: str) -> None:
    """Patch for one '+'-joined variant spec (module docstring)."""
    opts = dict(part.split("=", 1) if "=" in part else (part, "1") for part in spec.split("+") if part != "base")
    known = ("onelink", "naik", "level", "yeps0", "gauge", "rect", "fermion", "lastfermion")
    unknown = set(opts) - set(known)
    if unknown:
        raise SystemExit(f"unknown variant {', '.join(sorted(unknown))}: use {', '.join(known)}")
    level = opts.get("level", "W")
    if level not in ("W", "V", "U"):
        raise SystemExit(f"level={level}: use W, V or U")
    stash = {}
    if {"onelink", "naik", "level"} & set(opts):
        stack.enter_context(patched(hisq_force, "hisq_level2_vjp", level2_variant(
            float(opts.get("onelink", 1.0)), float(opts.get("naik", 1.0)), level, stash)))
    if level == "V":
        orig_vjp = hisq_force.u3_unitarize_vjp

        def u3_vjp(v, d_w, force_filter):
            d_v, info = orig_vjp(v, d_w, force_filter)
            return d_v + stash.pop("d"), info
        stack.enter_context(patched(hisq_force, "u3_unitarize_vjp", u3_vjp))
    elif level == "U":
        orig_fat = hisq_force.fat_link_vjp

        def fat_vjp(geom, links, coeffs, d):
            out = orig_fat(geom, links, coeffs, d)
            return out + stash.pop("d") if coeffs is hisq_force.FAT7 else out
        stack.enter_context(patched(hisq_force, "fat_link_vjp", fat_vjp))
    if "yeps0" in opts:
        orig_outer = rhmc.FermionMonomial.outer_products

        def outer_products(self, u, ls=None):
            ls = ls if ls is not None else self.links(u)
            d0 = ls.ops[self.epsilons[0]][0]
            real_ops, real_solve = ls.ops, self._solve
            swapped = {e: (d0, a) for e, (_, a) in real_ops.items()}

            def solve(ls_, *args, **kw):          # the solves keep their own operators
                ls_.ops = real_ops
                try:
                    return real_solve(ls_, *args, **kw)
                finally:
                    ls_.ops = swapped
            self._solve, ls.ops = solve, swapped
            try:
                return orig_outer(self, u, ls)
            finally:
                ls.ops = real_ops
                del self._solve
        stack.enter_context(patched(rhmc.FermionMonomial, "outer_products", outer_products))
    if "gauge" in opts or "rect" in opts:
        scale, rect = float(opts.get("gauge", 0.0)), float(opts.get("rect", 0.0))
        orig_force = gauge_action.GaugeAction.force_reference

        def force_reference(self, u):
            saved = self.shapes
            self.shapes = {k: ((c * (1.0 + rect) if k == "rectangle" else c), p) for k, (c, p) in saved.items()}
            try:
                return orig_force(self, u) * (1.0 + scale)
            finally:
                self.shapes = saved
        stack.enter_context(patched(gauge_action.GaugeAction, "force_reference", force_reference))
    if "fermion" in opts or "lastfermion" in opts:
        every, last, calls = float(opts.get("fermion", 0.0)), float(opts.get("lastfermion", 0.0)), [0]
        orig_fforce = rhmc.FermionMonomial.force

        def fermion_force(self, u):
            calls[0] += 1
            return orig_fforce(self, u) * ((1.0 + every) * (1.0 + (last if calls[0] == LAST_FERMION_FORCE else 0.0)))
        stack.enter_context(patched(rhmc.FermionMonomial, "force", fermion_force))


def trajectory(deck: str, workdir: str, gloops: bool = False):
    """(history row, MILC's 34 G_LOOP averages of the end configuration or None)."""
    out = os.path.join(workdir, "t.h5")
    init_run(deck, out, str(FIXTURES / "lat.sample.hisq.f211b670.l6666"), force=True, log=lambda *a: None,
             rationals=str(FIXTURES / "rationals.sample.su3_rhmc_hisq_f211"))
    row = run(out, show_progress=False, log=lambda *a: None).history[-1]
    if not gloops:
        return row, None
    from hmc import runfile
    from hmc.assemble import make_geometry
    from lattice import GaugeField
    from force.gauge_action import SymanzikAction

    state = runfile.load(out)
    geom = make_geometry(state.deck, None)
    g = state.deck["gauge"]
    traces = SymanzikAction(g["beta"], g["u0"], g["nf"]).loop_traces(
        GaugeField.from_site_major(geom, geom.local_part(state.links)))
    return row, [v for k in ("plaquette", "rectangle", "parallelogram") for v in traces[k]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", default=["base"], help="variant specs (module docstring)")
    ap.add_argument("--deck", default=str(ROOT / "runs" / "milc_su3_rhmc_hisq_f211.toml"))
    ap.add_argument("--gloops", action="store_true",
                    help="also print the end configuration's 34 G_LOOP averages in MILC's order (MILC's 2009-09 "
                         "values, in full precision: ks_imp_rhmc/test/out.test.su3_rhmc_hisq.f211.2)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in a.variants:
            with ExitStack() as stack:
                apply_variant(stack, spec)
                row, loops = trajectory(a.deck, tmp, a.gloops)
            print(f"{spec:20s} delta S {row['dH']:+.8f}  g_end {row['g_end']:.8f}  h_end {row['h_end']:.8f}  "
                  f"f_end {row['f_end']:.8f}  PLAQ {row['plaq_ss']:.12f} {row['plaq_st']:.12f}", flush=True)
            if loops is not None:
                print(f"{spec:20s} G_LOOP " + " ".join(f"{v:.16e}" for v in loops), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
