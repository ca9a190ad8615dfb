"""``hmc bench rhmc``: HISQ 2+1+1 RHMC trajectories of a production deck on one lattice, with the per-phase times
the run file's history stores, trajectory by trajectory (issue 5), each phase's floor and the fraction of it
reached (issue 19; the floors' formulas: :mod:`bench.rhmc_floors`).

    hmc --backend cupy bench rhmc --lattice 32 --deck runs/hisq211_16.toml --trajectories 2 --steps 36 --out DIR

For the lattice L^4: a deck written from ``--deck`` (dims L^4, ``--steps`` integrator steps or the deck's, the
project's rational functions by absolute path, ``trajectories`` and ``warmups`` = ``--trajectories``), the time of
one application of A = -D_eo D_oe and the copy bandwidth from ``hmc bench dslash`` (double precision, 20 repeats),
then ``hmc init`` (cold
start) and ``hmc run``, each a process of its own with its log in DIR (``init_L_backend.log``, ``run_L_backend.log``,
``dslash_L_backend.err``). The report per trajectory: solvers (heat bath GR, actions FA, force MD), link smearing
(fat/long link builds), fermion force without its solves (outer products + HISQ chain rule), gauge force, link
updates and the rest (actions, momenta, Metropolis), then the work outside the molecular dynamics by phase (momenta,
heat baths, actions, re-unitarization, monitors: the history's time_* columns); the multishift iteration counts, dH
and the plaquette. The share
of the solver time spent in the Dslash is estimated as (multishift iterations = applications of A) x (time of one
A) / solver time. Then per trajectory the table of the phases' times, floors (the fewest bytes at the measured copy
bandwidth) and floor / time; ``floors_L_backend.json`` in DIR holds the same rows. The first trajectory starts cold
and, on the GPU, compiles the kernels: read the last one.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from hmc.cli import count
from hmc.progress import add_progress_arg

ROOT = Path(__file__).resolve().parents[1]
RATIONALS = ROOT / "runs" / "rationals" / "rationals.hisq211_b580"


def add_arguments(p) -> None:
    p.add_argument("--lattice", type=count(2), required=True, metavar="L", help="L of the L^4 lattice")
    p.add_argument("--deck", required=True, help="the production deck to start from (e.g. runs/hisq211_16.toml)")
    p.add_argument("--trajectories", type=count(1), default=2, help="trajectories to run (default 2)")
    add_progress_arg(p)
    p.add_argument("--steps", type=count(1), help="integrator steps (default: --steps-for, else the deck's)")
    p.add_argument("--steps-for", nargs="*", default=[], metavar="L=STEPS",
                   help="integrator steps per lattice size, used when --steps is not given (e.g. 32=36: eps ~ "
                        "V^(-1/8) keeps the acceptance near 0.8)")
    p.add_argument("--cgprec", nargs=3, type=int, choices=(1, 2), metavar=("MD", "FA", "GR"),
                   help="the solver precisions of every pseudofermion, as MILC's cgprec_md_fa_gr (1 single refined in "
                        "double, 2 double; default: the deck's)")
    p.add_argument("--out", required=True, help="folder of the deck, run file, logs and the report")


def make_deck(src: Path, dst: Path, L: int, steps: int | None, trajectories: int, cgprec=None,
              warmups: int | None = None) -> None:
    """``src`` with the lattice, steps, rationals path, trajectories and warm-ups (default all: no Metropolis test)
    replaced, line by line; with ``cgprec`` (MD, FA, GR) the same [fermions] cgprec_md_fa_gr triple for every
    pseudofermion."""
    warmups = trajectories if warmups is None else warmups
    subs = [(r"^dims = .*", f"dims = [{L}, {L}, {L}, {L}]"), (r"^rationals = .*", f'rationals = "{RATIONALS}"'),
            (r"^trajectories = .*", f"trajectories = {trajectories}"), (r"^warmups = .*", f"warmups = {warmups}")]
    if steps is not None:
        subs.append((r"^steps = .*", f"steps = {steps}"))
    text = src.read_text()
    for pat, new in subs:
        text = re.sub(pat, new, text, flags=re.M)
    if cgprec:
        n = len(re.findall(r"\[[^\[\]]*\]", re.search(r"^cgresid_md_fa_gr = \[(.*?)\]\]", text, re.M | re.S).group(0)))
        triple = f"[{', '.join(map(str, cgprec))}]"
        text = re.sub(r"^\[fermions\]\n", f"[fermions]\ncgprec_md_fa_gr = [{', '.join([triple] * n)}]\n", text,
                      flags=re.M)
    dst.write_text(text)


def _hmc(backend: str, *argv) -> list:
    return [sys.executable, "-m", "hmc", "--backend", backend, *map(str, argv)]


def run_trajectories(backend: str, run, trajectories: int, log, progress: bool) -> int:
    """``hmc run RUN --trajectories N``, its output appended to the open file ``log``; with ``progress`` (not
    --no-progress) and a terminal on stderr, the run's own per-trajectory progress line is drawn there (rank 0,
    docs/formats.md) and only stdout goes to the log. The exit status."""
    show = progress and sys.stderr.isatty()
    argv = _hmc(backend, "run", run, "--trajectories", trajectories, *([] if show else ["--no-progress"]))
    return subprocess.run(argv, stdout=log, stderr=None if show else log, cwd=ROOT).returncode


def dslash_figures(backend: str, L: int, err: Path) -> tuple[float | None, float | None]:
    """(seconds per application of A, copy bandwidth in bytes/s) from ``hmc bench dslash --json``; None for what it
    did not give (its failure leaves out the Dslash share and the floors)."""
    with open(err, "w") as ef:
        r = subprocess.run(_hmc(backend, "bench", "dslash", "--lattice", L, L, L, L, "--precision", "double",
                                "--repeat", 20, "--json"), stdout=subprocess.PIPE, stderr=ef, text=True, cwd=ROOT)
    try:
        res = json.loads(r.stdout)
    except ValueError:
        return None, None
    figures = []
    for key, scale in (("cg_operator_s", 1.0), ("copy_GBps", 1e9)):
        try:
            figures.append(float(res[key]) * scale)
        except (KeyError, TypeError, ValueError):
            figures.append(None)
    return tuple(figures)


def report(path: Path, backend: str, t_op: float | None, bandwidth: float | None = None,
           floors_json: Path | None = None) -> str:
    """The per-phase lines of every trajectory in the run file's history; with the copy ``bandwidth`` (bytes/s) the
    table of floors after each (written as JSON to ``floors_json`` too)."""
    from hmc.runfile import load

    from . import rhmc_floors

    st = load(str(path))
    dims = "x".join(map(str, st.deck["lattice"]["dims"]))
    it = st.deck["integrator"]
    lines = [f"== {dims} on {backend}: {it['scheme']} steps {it['steps']} tau {it['tau']}, 5 pseudofermions"]
    half = st.config.dslash_half_links if st.config is not None else "off"     # the configuration the run kept
    m = rhmc_floors.model(st.deck, st.files, half) if bandwidth else None
    table = []
    for r in st.history:
        lines += _trajectory_lines(r, t_op)
        if m is None:
            lines.append("        floors left out: hmc bench dslash gave no copy bandwidth (its log: dslash_*.err)")
            continue
        lines += rhmc_floors.table_lines(m, r, bandwidth)
        table.append({"traj": int(r["traj"]), "copy_GBps": bandwidth / 1e9,
                      "phases": [{"phase": x.phase, "time_s": x.time_s, "floor_s": x.floor_s,
                                  "fraction": x.fraction, "floor_counts": x.note, "model_s": x.model_s}
                                 for x in rhmc_floors.rows(m, r, bandwidth)]})
    if floors_json is not None and table:
        floors_json.write_text(json.dumps({"lattice": st.deck["lattice"]["dims"], "backend": backend,
                                           "trajectories": table}, indent=1))
    return "\n".join(lines)


def _trajectory_lines(r, t_op) -> list:
    def g(k):
        return float(r.get(k, 0.0))

    solve = {ph: g(f"time_fermion_solver_{ph}") for ph in ("GR", "FA", "MD")}
    solver = sum(solve.values())
    smear, gforce, upd, total = g("time_fermion_links"), g("time_force_gauge"), g("time_links"), g("time_total")
    fforce = g("time_fermion_outer") + g("time_fermion_force_chain")
    rest = total - solver - smear - fforce - gforce - upd
    iters = int(r["cg_gr"] + r["cg_fa"] + r["cg_md"])
    head = (f"traj {r['traj']}: total {total:9.2f} s | solvers {solver:8.2f} s ({100 * solver / total:4.1f}%: "
            f"GR {solve['GR']:.2f} FA {solve['FA']:.2f} MD {solve['MD']:.2f}) | link smearing {smear:7.2f} s "
            f"({100 * smear / total:4.1f}%, {int(r['fermion_link_builds'])} builds) | fermion force w/o solves "
            f"{fforce:7.2f} s ({100 * fforce / total:4.1f}%) | gauge force {gforce:7.2f} s "
            f"({100 * gforce / total:4.1f}%) | link updates {upd:6.2f} s | rest {rest:6.2f} s")
    line = (f"        multishift iterations GR {r['cg_gr']} FA {r['cg_fa']} MD {r['cg_md']} (= applications of A), "
            f"dH {r['dH']:+.4f}, plaquette {(r['plaq_ss'] + r['plaq_st']) / 6:.6f}")
    if t_op:
        frac = iters * t_op / solver if solver > 0 else float("nan")
        line += f"; Dslash share of solver time ~ {100 * frac:.0f}% ({iters} x {1e3 * t_op:.3f} ms)"
    lines = [head, line]
    slots, made = int(r.get("shift_slots_md", -1)), int(r.get("shift_updates_md", -1))
    if slots > 0 and 0 <= made < slots:                 # (-1: not recorded; equal: every shift updated to the end)
        lines.append(f"        MD shift updates: {made} of {slots} ({100 * made / slots:.1f} %: the converged shifts "
                     "stopped)")
    if int(r.get("graph_captures", 0)) > 0 or int(r.get("graph_replays", 0)) > 0:     # (-1: not recorded)
        lines.append(f"        solver CUDA graphs: {int(r['graph_captures'])} captured "
                     f"({g('time_fermion_graph_capture'):.3f} s of host time, inside the solver times), "
                     f"{int(r['graph_replays'])} launches")
    if "time_momenta" in r:                 # run files written before these timers lack them
        lines.append(f"        outside the molecular dynamics: momenta {g('time_momenta'):.3f} s, heat baths "
                     f"{g('time_refresh'):.3f} s (GR solves {solve['GR']:.3f}), actions {g('time_actions'):.3f} s "
                     f"(FA solves {solve['FA']:.3f}), re-unitarization {g('time_reunitarize'):.3f} s, monitors "
                     f"{g('time_monitor'):.3f} s (each with its link smearing)")
    return lines


def steps_for(args) -> int | None:
    """``--steps``, else the ``--steps-for`` entry of this lattice size, else None (the deck's)."""
    if args.steps is not None:
        return args.steps
    for item in args.steps_for:
        size, eq, steps = item.partition("=")
        if not (eq and size.isdigit() and steps.isdigit()):
            raise SystemExit(f"hmc bench rhmc: error: --steps-for {item!r}: write L=STEPS, e.g. 32=36")
        if int(size) == args.lattice:
            return int(steps)
    return None


def bench_rhmc(args) -> int:
    backend = args.backend or "auto"
    L, out = args.lattice, Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deck, run = out / f"hisq211_{L}_{backend}.toml", out / f"hisq211_{L}_{backend}.h5"
    make_deck(ROOT / args.deck, deck, L, steps_for(args), args.trajectories, getattr(args, "cgprec", None))
    t_op, bandwidth = dslash_figures(backend, L, out / f"dslash_{L}_{backend}.err")
    t0 = time.monotonic()
    log = out / f"run_{L}_{backend}.log"
    with open(out / f"init_{L}_{backend}.log", "w") as f:
        rc = subprocess.run(_hmc(backend, "init", deck, "-o", run, "--force"), stdout=f, stderr=f, cwd=ROOT).returncode
    if rc == 0:
        with open(log, "w") as f:
            rc = run_trajectories(backend, run, args.trajectories, f, not args.no_progress)
    print(f"-- {L}^4 {backend}: hmc init + run of {args.trajectories} trajectories: exit {rc}, "
          f"{time.monotonic() - t0:.0f} s wall (log {log})", flush=True)
    if rc != 0:
        print("\n".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else "")
        return 1
    print(report(run, backend, t_op, bandwidth, out / f"floors_{L}_{backend}.json"), flush=True)
    return 0
