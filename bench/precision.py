"""``hmc bench precision``: does a mixed-precision solver setting change the physics? (issue 19)

    hmc --backend cupy bench precision --lattice 16 --deck runs/hisq211_16.toml --thermalize 40 6 \
        --trajectories 10 --cgprec 1 2 2 --out DIR

Two chains of the same deck from the same seed and the same start: the reference (``--reference-cgprec``, default
all double: MILC's cgprec_md_fa_gr 2 2 2) and the setting under test (``--cgprec``), each an ``hmc init`` and ``hmc
run`` of its own (decks, run files and logs in DIR). The start is the deck's (a cold start: its first trajectories are
far from equilibrium, so ``--warmups`` defaults to 5 there), a stored configuration (``--from-lattice``: a gauge file
or a run file, ``RUN.h5`` or ``RUN.h5:N``, e.g. the thermalized start of an earlier study) or one made here
(``--thermalize Q D``): Q quenched trajectories (the deck without its ``[fermions]``: the same gauge action, integrator
and steps; all warm-ups, from the deck's start), then D dynamical trajectories of the deck in the reference setting
from their end (the first D // 2 warm-ups, the rest with the Metropolis test: their acceptance shows whether the step
size accepts), each an ``hmc run`` with its own seed (the deck's + 1 and + 2); the last configuration starts both
chains (``hmc init --from-lattice``), whose ``--warmups`` then default to 0. The run under test also integrates every
trajectory forward and back (deck ``reversibility_check``, docs/conventions.md 5.4) and reports max|U_back - U|,
max|P_back + P| and the round trip's dH. The comparison, over the trajectories after the warm-ups of each chain:

* the means of the plaquette (ss + st)/6, dH, exp(-dH) and the acceptance with their naive standard errors
  sigma/sqrt(n) (autocorrelations are not removed: with so few trajectories the errors are estimates), the
  difference in combined errors |a - b| / sqrt(e_a^2 + e_b^2), and whether it is within 2, or the two agree to 1e-9
  relative where both errors vanish (a plain test; the chains share their random numbers, so they are correlated and
  the independent-error sigma overstates the error of the difference: a weak test, but a fair bound);
* trajectory by trajectory: both chains' acceptance, dH and plaquette, and the largest |plaquette difference| and
  |dH difference| (the same seed makes the two chains follow each other until a Metropolis decision differs);
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
from hmc.progress import add_progress_arg

from .rhmc import ROOT, _hmc, make_deck, run_trajectories

REVERSIBILITY = re.compile(r"REVERSIBILITY: max\|dU\| = (\S+) max\|dP\| = (\S+) dH = (\S+)")
COLD_WARMUPS = 5


def add_arguments(p) -> None:
    p.add_argument("--lattice", type=count(2), required=True, metavar="L", help="L of the L^4 lattice")
    p.add_argument("--deck", required=True, help="the production deck (e.g. runs/hisq211_16.toml)")
    p.add_argument("--trajectories", type=count(1), default=10, help="trajectories per chain (default 10)")
    add_progress_arg(p)
    p.add_argument("--warmups", type=count(0), help="warm-up trajectories (no Metropolis test) of each chain, left out of "
                   f"the comparison (default {COLD_WARMUPS} from the deck's start, 0 from --thermalize or "
                   "--from-lattice)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--thermalize", nargs=2, type=count(0), metavar=("QUENCHED", "DYNAMICAL"),
                       help="start both chains from a configuration made here: QUENCHED pure-gauge warm-ups, then "
                            "DYNAMICAL trajectories of the deck (the first half warm-ups)")
    start.add_argument("--from-lattice", metavar="FILE",
                       help="start both chains from FILE: a gauge file or a run file (RUN.h5 or RUN.h5:N)")
    p.add_argument("--steps", type=count(1), help="integrator steps of every run (default: the deck's)")
    p.add_argument("--cgprec", nargs=3, type=int, choices=(1, 2), metavar=("MD", "FA", "GR"), required=True,
                   help="the setting under test, as MILC's cgprec_md_fa_gr (1 single refined in double, 2 double)")
    p.add_argument("--reference-cgprec", nargs=3, type=int, choices=(1, 2), default=(2, 2, 2),
                   metavar=("MD", "FA", "GR"), help="the reference setting (default 2 2 2)")
    p.add_argument("--reversibility-resid", type=float, metavar="R",
                   help="also integrate --reversibility-trajectories trajectories forward and back in both settings "
                        "with the MD solves' residual R (e.g. 1e-10) instead of the deck's: the integrator's and the "
                        "mixed solver's reversibility, not the MD tolerance's")
    p.add_argument("--reversibility-trajectories", type=count(1), default=2,
                   help="trajectories of each --reversibility-resid run (default 2)")
    p.add_argument("--out", required=True, help="folder of the decks, run files, logs and the report")


def edit_deck(deck: Path, seed_offset: int = 0, quenched: bool = False, reversibility: bool = False,
              checkpoint_every: int | None = None, md_resid: float | None = None) -> None:
    """A deck written by :func:`bench.rhmc.make_deck`, changed in place: the [run] seed moved by ``seed_offset``;
    ``quenched``: without its [fermions] (and [multigrid]) section, i.e. the same gauge action and integrator with
    no fermions; ``reversibility``: the [integrator] reversibility_check on; ``checkpoint_every``: the [run] key
    (the thermalization's runs write their run file once, at the end); ``md_resid``: the MD column of every
    pseudofermion's cgresid_md_fa_gr triple."""
    text = deck.read_text()
    if md_resid is not None:
        head = "cgresid_md_fa_gr = ["
        block = re.search(r"^cgresid_md_fa_gr = \[.*?\]\]", text, re.M | re.S).group(0)
        triples = re.sub(r"\[\s*[^\[\],]+,", f"[{md_resid:g},", block[len(head):])
        text = text.replace(block, head + triples)
    if seed_offset:
        text = re.sub(r"^seed = (\d+)", lambda m: f"seed = {int(m.group(1)) + seed_offset}", text, count=1,
                      flags=re.M)
    if checkpoint_every:
        text = re.sub(r"^checkpoint_every = .*", f"checkpoint_every = {checkpoint_every}", text, count=1, flags=re.M)
    if quenched:
        text = re.sub(r"^\[(fermions|multigrid)\]\n.*?(?=^\[|\Z)", "", text, flags=re.M | re.S)
    if reversibility:
        text = re.sub(r"^\[integrator\]\n", "[integrator]\nreversibility_check = true\n", text, flags=re.M)
    deck.write_text(text)


def _run(backend: str, deck: Path, trajectories: int, log: Path, start: str | None = None,
         progress: bool = False) -> tuple[int, float]:
    """``hmc init`` (from ``start`` when given) and ``hmc run`` of ``deck`` (its progress line shown with
    ``progress``: :func:`bench.rhmc.run_trajectories`): (exit status, seconds of wall time)."""
    run, t0 = deck.with_suffix(".h5"), time.monotonic()
    init = ["init", deck, "-o", run, "--force"] + (["--from-lattice", start] if start else [])
    with open(log, "w") as f:
        rc = subprocess.run(_hmc(backend, *init), stdout=f, stderr=f, cwd=ROOT).returncode
        if rc == 0:
            rc = run_trajectories(backend, run, trajectories, f, progress)
    if rc != 0:
        print("\n".join(log.read_text(errors="replace").splitlines()[-5:]))
    return rc, time.monotonic() - t0


def _plaquette(row) -> float:
    return (float(row["plaq_ss"]) + float(row["plaq_st"])) / 6


def thermalize(args, backend: str, out: Path) -> tuple[str | None, dict]:
    """The chains' start made by ``--thermalize Q D`` (module docstring): (its run file, or None when a run failed;
    per stage its trajectories, warm-ups, plaquette after the first and the last trajectory, the dH and acceptance of
    the trajectories with the Metropolis test, wall seconds)."""
    from hmc.runfile import load

    nq, nd = args.thermalize
    if nq < 0 or nd < 0 or nq + nd == 0:
        raise SystemExit(f"hmc bench precision: error: --thermalize {nq} {nd}: give numbers >= 0 of quenched and "
                         "dynamical trajectories, not both 0")
    start, summary = None, {}
    for label, n, offset in (("quenched", nq, 1), ("dynamical", nd, 2)):
        if n == 0:
            continue
        quenched = label == "quenched"
        warmups = n if quenched else n // 2
        deck = out / f"precision_{args.lattice}_{label}.toml"
        make_deck(ROOT / args.deck, deck, args.lattice, args.steps, n,
                  None if quenched else list(args.reference_cgprec), warmups=warmups)
        edit_deck(deck, seed_offset=offset, quenched=quenched, checkpoint_every=n)
        rc, wall = _run(backend, deck, n, deck.with_suffix(".log"), start, not args.no_progress)
        print(f"-- thermalize, {label}: {n} trajectories ({warmups} warm-ups), exit {rc}, {wall:.0f} s wall "
              f"(log {deck.with_suffix('.log')})", flush=True)
        if rc != 0:
            return None, summary
        history = load(str(deck.with_suffix(".h5"))).history
        tested = [r for r in history if not int(r["warmup"])]
        summary[label] = {"trajectories": n, "warmups": warmups, "wall_s": wall,
                          "plaquette_first": _plaquette(history[0]), "plaquette_last": _plaquette(history[-1]),
                          "dH": [float(r["dH"]) for r in tested],
                          "acceptance": mean_error([float(r["accepted"]) for r in tested])[0]}
        start = str(deck.with_suffix(".h5"))
    return start, summary


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
    return {"plaquette": [_plaquette(r) for r in rows],
            "dH": [float(r["dH"]) for r in rows],
            "exp(-dH)": [float(r["exp_mdH"]) for r in rows],
            "acceptance": [float(r["accepted"]) for r in rows]}


def compare(reference: dict, test: dict, reversibility: list) -> dict:
    """The comparison of two :func:`observables` dicts (and the test run's reversibility triples): per observable
    both means with their errors, the difference in combined errors (``sigmas``; nan where both errors vanish), the
    2-sigma verdict and the largest per-trajectory difference."""
    out = {"observables": {}, "reversibility": None}
    for name in reference:
        (ma, ea), (mb, eb) = mean_error(reference[name]), mean_error(test[name])
        combined = math.hypot(ea, eb) if math.isfinite(ea) and math.isfinite(eb) else 0.0
        slack = 2 * combined + 1e-9 * max(abs(ma), abs(mb), 1.0)
        diffs = [abs(a - b) for a, b in zip(reference[name], test[name])]
        out["observables"][name] = {"reference": [ma, ea], "test": [mb, eb],
                                    "sigmas": abs(ma - mb) / combined if combined > 0 else float("nan"),
                                    "agree_within_2_sigma": bool(abs(ma - mb) <= slack),
                                    "max_abs_difference_per_trajectory": max(diffs) if diffs else float("nan")}
    out["reversibility"] = worst_reversibility(reversibility)
    return out


def worst_reversibility(triples: list) -> dict | None:
    """The largest max|dU|, max|dP| and |dH| over the round trips (max|dU|, max|dP|, dH), and their count; None
    for none."""
    if not triples:
        return None
    return {"max_dU": max(r[0] for r in triples), "max_dP": max(r[1] for r in triples),
            "max_abs_dH": max(abs(r[2]) for r in triples), "trajectories": len(triples)}


def per_trajectory(reference: list, test: list) -> list[dict]:
    """Both chains side by side, trajectory by trajectory: acceptance, dH and plaquette of each."""
    return [{"traj": int(a["traj"]), "warmup": int(a["warmup"]),
             **{f"{k}_{name}": v for name, r in (("reference", a), ("test", b))
                for k, v in (("accepted", int(r["accepted"])), ("dH", float(r["dH"])), ("plaquette", _plaquette(r)))}}
            for a, b in zip(reference, test)]


def report_lines(result: dict) -> list[str]:
    lines = []
    for label, t in result.get("thermalization", {}).items():
        lines.append(f"start, {label}: {t['trajectories']} trajectories ({t['warmups']} warm-ups), plaquette "
                     f"{t['plaquette_first']:.6f} -> {t['plaquette_last']:.6f}"
                     + (f", Metropolis dH {' '.join(f'{d:+.3f}' for d in t['dH'])}, acceptance {t['acceptance']:.2f}"
                        if t["dH"] else "") + f", {t['wall_s']:.0f} s")
    rows = result.get("per_trajectory", [])
    if rows:
        lines.append(f"{'traj':>4} {'ref acc':>7} {'ref dH':>11} {'ref plaquette':>15} {'test acc':>8} "
                     f"{'test dH':>11} {'test plaquette':>15}")
    for r in rows:
        lines.append(f"{r['traj']:>4} {'warm' if r['warmup'] else r['accepted_reference']:>7} "
                     f"{r['dH_reference']:>+11.5f} {r['plaquette_reference']:>15.10f} "
                     f"{'warm' if r['warmup'] else r['accepted_test']:>8} {r['dH_test']:>+11.5f} "
                     f"{r['plaquette_test']:>15.10f}")
    lines.append(f"{'observable':<12} {'reference':>26} {'test':>26}  {'sigmas':>6}  agree(2 sigma)  "
                 "max |diff| per trajectory")
    for name, o in result["observables"].items():
        (ma, ea), (mb, eb) = o["reference"], o["test"]
        sig = o.get("sigmas", float("nan"))
        sigtext = f"{sig:6.2f}" if math.isfinite(sig) else f"{'-':>6}"
        lines.append(f"{name:<12} {ma:>14.8f} +- {ea:<9.2e} {mb:>14.8f} +- {eb:<9.2e}  {sigtext}  "
                     f"{'yes' if o['agree_within_2_sigma'] else 'NO':<14}  "
                     f"{o['max_abs_difference_per_trajectory']:.3e}")
    rev = result["reversibility"]
    if rev:
        lines.append(f"reversibility of the test setting over {rev['trajectories']} trajectories: max|dU| "
                     f"{rev['max_dU']:.3e}, max|dP| {rev['max_dP']:.3e}, max|dH| {rev['max_abs_dH']:.3e}")
    for label, r in result.get("reversibility_tight", {}).items():
        lines.append(f"reversibility with MD residual {r['md_resid']:g}, {label} (cgprec "
                     f"{' '.join(map(str, r['cgprec']))}) over {r.get('trajectories', 0)} trajectories: max|dU| "
                     f"{r.get('max_dU', float('nan')):.3e}, max|dP| {r.get('max_dP', float('nan')):.3e}, max|dH| "
                     f"{r.get('max_abs_dH', float('nan')):.3e}")
    return lines


def reversibility_triples(log_text: str) -> list[tuple]:
    """(max|dU|, max|dP|, dH) of every REVERSIBILITY line of a run's log."""
    return [tuple(map(float, m.groups())) for m in REVERSIBILITY.finditer(log_text)]


def tight_reversibility(args, backend: str, out: Path, start: str | None) -> dict | None:
    """``--reversibility-resid R``: both settings integrate ``--reversibility-trajectories`` trajectories forward
    and back from the chains' start with every MD solve to R (its own deck and log per setting): per setting the
    worst max|dU|, max|dP| and |dH| of the round trips, R and the trajectory count; None when a run failed. With
    the deck's MD residual (1e-5 in the production decks) the round trip measures the tolerance: a solve that
    stops one iteration earlier or later on the way back gives a solution up to the tolerance away."""
    R = args.reversibility_resid
    found = {}
    for label, cgprec in (("reference", args.reference_cgprec), ("test", args.cgprec)):
        deck = setting_run(args, backend, out, f"reversibility_{label}", cgprec, args.reversibility_trajectories, 0,
                           start, reversibility=True, md_resid=R)
        if deck is None:
            return None
        log_text = deck.with_suffix(".log").read_text(errors="replace")
        found[label] = dict(worst_reversibility(reversibility_triples(log_text)) or {}, md_resid=R,
                            cgprec=list(cgprec))
    return found


def setting_run(args, backend: str, out: Path, name: str, cgprec, trajectories: int, warmups: int,
                start: str | None, **edits) -> Path | None:
    """One run of the deck in the solver setting ``cgprec``: its deck ``precision_L_NAME.toml`` (``edits`` as
    :func:`edit_deck` takes them), ``hmc init`` from ``start`` and ``hmc run`` with a log beside it; prints the
    run's line. The deck's path, or None when the run failed."""
    deck = out / f"precision_{args.lattice}_{name}.toml"
    make_deck(ROOT / args.deck, deck, args.lattice, args.steps, trajectories, list(cgprec), warmups=warmups)
    edit_deck(deck, **edits)
    log = deck.with_suffix(".log")
    rc, wall = _run(backend, deck, trajectories, log, start, not args.no_progress)
    what = f", MD residual {edits['md_resid']:g}" if edits.get("md_resid") is not None else ""
    print(f"-- {name.replace('_', ', ')} (cgprec {' '.join(map(str, cgprec))}{what}): exit {rc}, {wall:.0f} s wall "
          f"(log {log})", flush=True)
    return deck if rc == 0 else None


def bench_precision(args) -> int:
    from hmc.runfile import load

    backend = args.backend or "auto"
    L, out = args.lattice, Path(args.out).resolve()       # the runs' working folder is the repository root
    out.mkdir(parents=True, exist_ok=True)
    start, made = args.from_lattice and str(Path(args.from_lattice).absolute()), {}
    warmups = args.warmups if args.warmups is not None else 0 if start or args.thermalize else COLD_WARMUPS
    if not 0 <= warmups < args.trajectories:
        raise SystemExit(f"hmc bench precision: error: --warmups {warmups} must be below --trajectories "
                         f"{args.trajectories}: no trajectory would be compared")
    if args.thermalize:
        start, made = thermalize(args, backend, out)
        if start is None:
            return 1
    runs = {}
    for label, cgprec in (("reference", args.reference_cgprec), ("test", args.cgprec)):
        deck = setting_run(args, backend, out, label, cgprec, args.trajectories, warmups, start,
                           reversibility=label == "test")
        if deck is None:
            return 1
        st = load(str(deck.with_suffix(".h5")))
        runs[label] = (st.history, deck.with_suffix(".log").read_text(errors="replace"))
    rev = reversibility_triples(runs["test"][1])
    result = compare(observables(runs["reference"][0], warmups), observables(runs["test"][0], warmups), rev)
    if args.reversibility_resid is not None:
        tight = tight_reversibility(args, backend, out, start)
        if tight is None:
            return 1
        result["reversibility_tight"] = tight
    result.update({"lattice": L, "trajectories": args.trajectories, "warmups": warmups,
                   "steps": st.deck["integrator"]["steps"],
                   "start": start or "the deck's", "thermalization": made,
                   "per_trajectory": per_trajectory(runs["reference"][0], runs["test"][0]),
                   "cgprec": list(args.cgprec), "reference_cgprec": list(args.reference_cgprec), "backend": backend})
    (out / f"precision_{L}.json").write_text(json.dumps(result, indent=1))
    print("\n".join(report_lines(result)), flush=True)
    return 0
