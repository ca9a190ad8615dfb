"""Helpers of the distributed multigrid suite (``hmc bench suite mg_gpu_dist``), run as steps:

    python -m bench.mg_dist field PATH L THERM BACKEND      # a made field, written as a MILC file
    python -m bench.mg_dist summarize SOLVE.json LABEL --split split.txt --solves solves.json

``field``: a cold start and THERM pure-gauge molecular-dynamics trajectories of Wilson beta 6.0 on L^4 (Omelyan, 12
steps, tau 1, no accept/reject: warm-ups), the plaquette of each printed. ``summarize``: the outer line and the
per-level lines (compute / halo exchange / reductions) of one ``hmc solve --solver mg --json`` result, appended to
the split file and printed; the result, with its label, appended to the JSON list in the solves file.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def make_field(path: str, L: int, therm: int, backend: str) -> None:
    from hmc.assemble import make_gauge_action
    from hmc.integrators import Level, build_schedule
    from hmc.monomials import GaugeMonomial
    from hmc.trajectory import hmc_trajectory
    from lattice import CounterRNG, GaugeField, Geometry, get_backend
    from lattice.gauge import plaquette
    from lattice.io import write_gauge

    geom = Geometry((L,) * 4, get_backend(backend))
    u, rng = GaugeField.unit(geom), CounterRNG(616)
    mon = [GaugeMonomial(make_gauge_action({"action": "wilson", "beta": 6.0}))]
    sched = build_schedule([Level("omelyan", 12, ["gauge"])], 1.0)
    for i in range(therm):
        t0 = time.perf_counter()
        u, res = hmc_trajectory(u, rng, mon, sched, metropolis=False)
        ps, pt = plaquette(u)
        print(f"trajectory {i + 1}: plaquette {(ps + pt) / 6:.5f}, dH {float(res.delta_h):.3g}, "
              f"{time.perf_counter() - t0:.2f} s", flush=True)
    write_gauge(path, u, "milc")
    print(f"wrote {path}")


def summarize(solve_json: str, label: str, split: str, solves: str) -> None:
    r = json.loads(Path(solve_json).read_text())
    mg = r.get("mg", {})
    lines = [f"{label}: {mg.get('outer_iters')} outer iterations, true residual {r.get('true_residual'):.2e}, "
             f"set-up {mg.get('setup_time_s', 0):.2f} s, solve {mg.get('solve_time_s', 0):.3f} s"]
    lines += ["  " + line for line in mg.get("level_lines", [])]
    text = "\n".join(lines)
    print(text)
    with open(split, "a") as f:
        f.write(text + "\n")
    p = Path(solves)
    rows = json.loads(p.read_text()) if p.exists() and p.read_text().strip() else []
    rows.append({**r, "label": label})
    p.write_text(json.dumps(rows, indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.mg_dist")
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("field")
    f.add_argument("path")
    f.add_argument("L", type=int)
    f.add_argument("therm", type=int)
    f.add_argument("backend")
    s = sub.add_parser("summarize")
    s.add_argument("solve_json")
    s.add_argument("label")
    s.add_argument("--split", required=True)
    s.add_argument("--solves", required=True)
    a = ap.parse_args(argv)
    if a.what == "field":
        make_field(a.path, a.L, a.therm, a.backend)
    else:
        summarize(a.solve_json, a.label, a.split, a.solves)
    return 0


if __name__ == "__main__":
    sys.exit(main())
