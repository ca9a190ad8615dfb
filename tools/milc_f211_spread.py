"""How reproducible is delta S of MILC's su3_rhmc_hisq.f211.2 trajectory in floating point?

Runs the deck's one trajectory with one input scaled by (1 + s) for tiny s (1e-15: a change in the last bits, far
below anything physical) and prints delta S for each: the initial momenta (default), the heat-bath Gaussians g
(``--kind g``) or the fat links (``--kind fat``). The spread is the floor for comparing two implementations whose
arithmetic differs (summation orders, fused updates).

Measured (2026-11-29, NumPy, the plain deck with MILC's rationals file, base delta S -0.09708085):

  kind      s                        delta S
  momenta   +1e-15 -1e-15 +3e-15     -0.09707597 -0.09707263 -0.09705156
  momenta   +1e-12 -1e-12 +1e-10     -0.09710058 -0.09706046 -0.09708279
  g         +1e-15 -1e-15 +1e-13     -0.09705377 -0.09706532 -0.09708200
  g         +1e-11 -1e-11            -0.09706174 -0.09709077
  fat       +1e-15 +1e-13 -1e-13     -0.09706564 -0.09702902 -0.09709566

The change does not grow with s from 1e-15 to 1e-10: it is a noise floor, not a linear response. Over these 15
trajectories (base included) delta S is -0.0970713 +- 1.9e-5 (range -0.0971006 .. -0.0970290); g_end, h_end and
f_end scatter by 1e-5 each. MILC's May 2009 value (-0.09694168) is 6.9 standard deviations above that mean.
The same momenta scalings leave the 2+1 control of tools/milc_f211_hisq2_2009.py unchanged to 4e-12 in delta S.
Perturbing every force evaluation instead (tools/milc_f211_force_variants.py fermion=1e-13, -1e-13, 1e-15, -1e-15,
3e-14, gauge=1e-13, -1e-13, 1e-15, -1e-14) gives -0.09707215 -0.09710072 -0.09708819 -0.09711495 -0.09706540
-0.09704584 -0.09708659 -0.09703103 -0.09706731: the same spread (for f2111 these perturbations widen its spread
tenfold, which puts MILC inside it; for f211 they do not). Summing the Dslash's 16 hops in reverse order, as another
implementation might, gives -0.09703769.

f_start is no check of MILC's solver precision: it is sum |g|^2 plus the truncation error of the GR and FA solves,
and that truncation error is itself at the rounding floor: g x (1 + 1e-15) moves f_start by -2.4e-7, the fat links
x (1 + 1e-15) by -3.1e-7 (MILC - ours: +1.87e-7 in both the May and the September run, and in f2111).

    PYTHONPATH=. python tools/milc_f211_spread.py [--deck runs/milc_su3_rhmc_hisq_f211.toml] [--kind momenta|g|fat]
        [--scales 0,1e-15,-1e-15,...]

Needs MILC's lattice and rationals (../shared/fixtures/milc or HMC_MILC_FIXTURES); about 35 s per trajectory on one
CPU core.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hmc.rhmc as rhmc  # noqa: E402
import hmc.trajectory as trajectory  # noqa: E402
from hmc.run import init_run, run  # noqa: E402

FIXTURES = Path(os.environ.get("HMC_MILC_FIXTURES", ROOT.parent / "shared" / "fixtures" / "milc"))


def delta_s(deck: str, scale: float, workdir: str, kind: str = "momenta") -> dict:
    """One trajectory of ``deck`` with one input scaled by 1 + scale: its history row. ``kind``: the initial momenta,
    the heat-bath Gaussians g of every pseudofermion, or the fat links of every Naik group (at every build)."""

    draw, sources, links = trajectory.draw_momenta, rhmc.pseudofermion_sources, rhmc.hisq_links_multi
    if kind == "momenta":
        trajectory.draw_momenta = lambda geom, rng: draw(geom, rng) * (1.0 + scale)
    elif kind == "g":
        rhmc.pseudofermion_sources = lambda *a: [g * (1.0 + scale) for g in sources(*a)]
    elif kind == "fat":
        def scaled_links(*a, **kw):
            out = links(*a, **kw)
            for fl in out:
                fl.fat = fl.fat * (1.0 + scale)
            return out
        rhmc.hisq_links_multi = scaled_links
    else:
        raise ValueError(f"unknown perturbation {kind!r}: use momenta, g or fat")
    try:
        out = os.path.join(workdir, "t.h5")
        init_run(deck, out, str(FIXTURES / "lat.sample.hisq.f211b670.l6666"), force=True, log=lambda *a: None,
                 rationals=str(FIXTURES / "rationals.sample.su3_rhmc_hisq_f211"))
        return run(out, show_progress=False, log=lambda *a: None).history[-1]
    finally:
        trajectory.draw_momenta, rhmc.pseudofermion_sources, rhmc.hisq_links_multi = draw, sources, links


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deck", default=str(ROOT / "runs" / "milc_su3_rhmc_hisq_f211.toml"))
    ap.add_argument("--scales", type=lambda t: [float(v) for v in t.split(",")],
                    default=[0.0, 1e-15, -1e-15, 3e-15, -3e-15, 1e-14],
                    help="comma-separated relative changes, e.g. 0,1e-15,-1e-15")
    ap.add_argument("--kind", choices=("momenta", "g", "fat"), default="momenta",
                    help="what is scaled: the initial momenta (default), the heat-bath Gaussians, the fat links")
    a = ap.parse_args(argv)
    values = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.scales:
            row = delta_s(a.deck, s, tmp, a.kind)
            values.append(row["dH"])
            print(f"{a.kind} x (1 + {s:+.0e}): delta S = {row['dH']:+.8e}  f_start {row['f_start']:.11f}  "
                  f"g_end {row['g_end']:.8f}  h_end {row['h_end']:.8f}  f_end {row['f_end']:.8f}  "
                  f"PLAQ {row['plaq_ss']:.12f} {row['plaq_st']:.12f}", flush=True)
    print(f"delta S: mean {statistics.mean(values):+.8e}, spread (max - min) {max(values) - min(values):.2e}, "
          f"standard deviation {statistics.pstdev(values):.2e} over {len(values)} trajectories")
    return 0


if __name__ == "__main__":
    sys.exit(main())
