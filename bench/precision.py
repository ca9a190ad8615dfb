"""``hmc bench precision``: does a mixed-precision solver setting change the physics? (issue 19)

    hmc --backend cupy bench precision --lattice 16 --deck runs/hisq211_16.toml --trajectories 20 --warmups 5 \
        --cgprec 1 2 2 --out DIR

Two runs of the same deck from the same seed and the same cold start: the reference (``--reference-cgprec``,
default all double: MILC's cgprec_md_fa_gr 2 2 2) and the setting under test (``--cgprec``), each an ``hmc init`` and
``hmc run`` of its own (logs in DIR). The run under test also integrates every trajectory forward and back
(deck ``reversibility_check``, docs/conventions.md 5.4) and reports max|U_back - U|, max|P_back + P| and the round
trip's dH. The comparison, over the trajectories after the warm-ups of each run:

* the means of the plaquette (ss + st)/6, dH, exp(-dH) and the acceptance with their naive standard errors
  sigma/sqrt(n) (autocorrelations are not removed: with so few trajectories the errors are estimates), and whether
  the two runs agree within two combined errors, or to 1e-9 relative where both errors vanish (a plain test; the
  runs are correlated, so it is a weak one);
* trajectory by trajectory: the largest |plaquette difference| and |dH difference| (the same seed makes the two
  chains follow each other until a Metropolis decision differs);
* the worst reversibility figures of the run under test.

The report is printed and written as ``precision_L.json`` in DIR.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import time
from pathlib import Path

from hmc.cli import count

from .rhmc import ROOT, _hmc, make_deck

REVERSIBILITY = re.compile(r"REVERSIBILITY: max\|dU\| = (\S+) max\|dP\| = (\S+) dH = (\S+)")


def add_arguments(p) -> None:
    p.add_argument("--lattice", type=count(2), required=True, metavar="L", help="L of the L^4 lattice")
    p.add_argument("--deck", required=True, help="the production deck (e.g. runs/hisq211_16.toml)")
    p.add_argument("--trajectories", type=count(1), default=20, help="trajectories per run (default 20)")
    p.add_argument("--warmups", type=count(0), default=5, help="warm-up trajectories (no Metropolis test) of the "
                   "trajectories, left out of the comparison (default 5)")
    p.add_argument("--steps", type=count(1), help="integrator steps (default: the deck's)")
    p.add_argument("--cgprec", nargs=3, type=int, choices=(1, 2), metavar=("MD", "FA", "GR"), required=True,
                   help="the setting under test, as MILC's cgprec_md_fa_gr (1 single refined in double, 2 double)")
    p.add_argument("--reference-cgprec", nargs=3, type=int, choices=(1, 2), default=(2, 2, 2),
                   metavar=("MD", "FA", "GR"), help="the reference setting (default 2 2 2)")
    p.add_argument("--out", required=True, help="folder of the decks, run files, logs and the report")


def _with_reversibility(deck: Path) -> None:
    text = deck.read_text()
    deck.write_text(re.sub(r"^\[integrator\]\n", "[integrator]\nreversibility_check = true\n", text, flags=re.M))


def _run(backend: str, deck: Path, trajectories: int, log: Path) -> int:
    run = deck.with_suffix(".h5")
    with open(log, "w") as f:
        rc = subprocess.run(_hmc(backend, "init", deck, "-o", run, "--force"), stdout=f, stderr=f,
                            cwd=ROOT).returncode
        if rc == 0:
            rc = subprocess.run(_hmc(backend, "run", run, "--trajectories", trajectories, "--no-progress"),
                                stdout=f, stderr=f, cwd=ROOT).returncode
    return rc


def mean_error(values) -> tuple[float, float]:
    """(mean, sigma / sqrt(n)) with the sample standard deviation; error nan for fewer than two values."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def observables(history: list, warmups: int) -> dict:
    """{name: per-trajectory values} over the trajectories after ``warmups``."""
    rows = [r for r in history if int(r["traj"]) > warmups]
    return {"plaquette": [(float(r["plaq_ss"]) + float(r["plaq_st"])) / 6 for r in rows],
            "dH": [float(r["dH"]) for r in rows],
            "exp(-dH)": [float(r["exp_mdH"]) for r in rows],
            "acceptance": [float(r["accepted"]) for r in rows]}


def compare(reference: dict, test: dict, reversibility: list) -> dict:
    """The comparison of two :func:`observables` dicts (and the test run's reversibility triples)."""
    out = {"observables": {}, "reversibility": None}
    for name in reference:
        (ma, ea), (mb, eb) = mean_error(reference[name]), mean_error(test[name])
        combined = math.hypot(ea, eb) if math.isfinite(ea) and math.isfinite(eb) else 0.0
        slack = 2 * combined + 1e-9 * max(abs(ma), abs(mb), 1.0)
        diffs = [abs(a - b) for a, b in zip(reference[name], test[name])]
        out["observables"][name] = {"reference": [ma, ea], "test": [mb, eb],
                                    "agree_within_2_sigma": bool(abs(ma - mb) <= slack),
                                    "max_abs_difference_per_trajectory": max(diffs) if diffs else float("nan")}
    if reversibility:
        out["reversibility"] = {"max_dU": max(r[0] for r in reversibility),
                                "max_dP": max(r[1] for r in reversibility),
                                "max_abs_dH": max(abs(r[2]) for r in reversibility), "trajectories": len(reversibility)}
    return out


def report_lines(result: dict) -> list[str]:
    lines = [f"{'observable':<12} {'reference':>26} {'test':>26}  agree(2 sigma)  max |diff| per trajectory"]
    for name, o in result["observables"].items():
        (ma, ea), (mb, eb) = o["reference"], o["test"]
        lines.append(f"{name:<12} {ma:>14.8f} +- {ea:<9.2e} {mb:>14.8f} +- {eb:<9.2e}  "
                     f"{'yes' if o['agree_within_2_sigma'] else 'NO':<14}  {o['max_abs_difference_per_trajectory']:.3e}")
    rev = result["reversibility"]
    if rev:
        lines.append(f"reversibility of the test setting over {rev['trajectories']} trajectories: max|dU| "
                     f"{rev['max_dU']:.3e}, max|dP| {rev['max_dP']:.3e}, max|dH| {rev['max_abs_dH']:.3e}")
    return lines


def bench_precision(args) -> int:
    from hmc.runfile import load

    backend = args.backend or "auto"
    L, out = args.lattice, Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not 0 <= args.warmups < args.trajectories:
        raise SystemExit(f"hmc bench precision: error: --warmups {args.warmups} must be below --trajectories "
                         f"{args.trajectories}: no trajectory would be compared")
    runs = {}
    for label, cgprec in (("reference", args.reference_cgprec), ("test", args.cgprec)):
        deck = out / f"precision_{L}_{label}.toml"
        make_deck(ROOT / args.deck, deck, L, args.steps, args.trajectories, list(cgprec), warmups=args.warmups)
        if label == "test":
            _with_reversibility(deck)
        log = out / f"precision_{L}_{label}.log"
        t0 = time.monotonic()
        rc = _run(backend, deck, args.trajectories, log)
        print(f"-- {label} (cgprec {' '.join(map(str, cgprec))}): exit {rc}, {time.monotonic() - t0:.0f} s wall "
              f"(log {log})", flush=True)
        if rc != 0:
            print("\n".join(log.read_text(errors="replace").splitlines()[-5:]))
            return 1
        runs[label] = (load(str(deck.with_suffix(".h5"))).history, log.read_text(errors="replace"))
    rev = [tuple(map(float, m.groups())) for m in REVERSIBILITY.finditer(runs["test"][1])]
    result = compare(observables(runs["reference"][0], args.warmups), observables(runs["test"][0], args.warmups), rev)
    result.update({"lattice": L, "trajectories": args.trajectories, "warmups": args.warmups,
                   "cgprec": list(args.cgprec), "reference_cgprec": list(args.reference_cgprec), "backend": backend})
    (out / f"precision_{L}.json").write_text(json.dumps(result, indent=1))
    print("\n".join(report_lines(result)), flush=True)
    return 0
