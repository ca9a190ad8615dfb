"""How reproducible is delta S of MILC's su3_rhmc_hisq.f211.2 trajectory in floating point?

Runs the deck's one trajectory with the initial momenta scaled by (1 + s) for tiny s (1e-15: a change in the last
bits, far below anything physical) and prints delta S for each. The spread is the floor for comparing two
implementations whose arithmetic differs (summation orders, fused updates): on this trajectory the standard deviation
is 2.6e-5 (range 1e-4 over 8 trajectories), above the 2e-5 one might ask of it (runs/milc_su3_rhmc_hisq_f211.toml).

    PYTHONPATH=. python tools/milc_f211_spread.py [--deck runs/milc_su3_rhmc_hisq_f211.toml] [--scales 0,1e-15,-1e-15,...]

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

import hmc.trajectory as trajectory  # noqa: E402
from hmc.run import init_run, run  # noqa: E402

FIXTURES = Path(os.environ.get("HMC_MILC_FIXTURES", ROOT.parent / "shared" / "fixtures" / "milc"))


def delta_s(deck: str, scale: float, workdir: str) -> dict:
    """One trajectory of ``deck`` with the momenta scaled by 1 + scale: its history row."""
    draw = trajectory.draw_momenta
    trajectory.draw_momenta = lambda geom, rng: draw(geom, rng) * (1.0 + scale)
    try:
        out = os.path.join(workdir, "t.h5")
        init_run(deck, out, str(FIXTURES / "lat.sample.hisq.f211b670.l6666"), force=True, log=lambda *a: None,
                 rationals=str(FIXTURES / "rationals.sample.su3_rhmc_hisq_f211"))
        return run(out, show_progress=False, log=lambda *a: None).history[-1]
    finally:
        trajectory.draw_momenta = draw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deck", default=str(ROOT / "runs" / "milc_su3_rhmc_hisq_f211.toml"))
    ap.add_argument("--scales", type=lambda t: [float(v) for v in t.split(",")],
                    default=[0.0, 1e-15, -1e-15, 3e-15, -3e-15, 1e-14],
                    help="comma-separated relative changes of the momenta, e.g. 0,1e-15,-1e-15")
    a = ap.parse_args(argv)
    values = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.scales:
            row = delta_s(a.deck, s, tmp)
            values.append(row["dH"])
            print(f"momenta x (1 + {s:+.0e}): delta S = {row['dH']:+.8e}  f_start {row['f_start']:.11f}  "
                  f"PLAQ {row['plaq_ss']:.12f} {row['plaq_st']:.12f}", flush=True)
    print(f"delta S: mean {statistics.mean(values):+.8e}, spread (max - min) {max(values) - min(values):.2e}, "
          f"standard deviation {statistics.pstdev(values):.2e} over {len(values)} trajectories")
    return 0


if __name__ == "__main__":
    sys.exit(main())
