"""``hmc init`` and ``hmc run``: create a run file from a deck, and run or resume the trajectories it describes."""
from __future__ import annotations

import math
import os

import numpy as np

from lattice import CounterRNG, GaugeField, link_trace, plaquette, polyakov_loop

from . import deck as deckmod
from . import runfile
from .assemble import make_geometry, make_monomials, make_schedule
from .progress import Progress
from .trajectory import hmc_trajectory, link_exponential, random_momenta, reversibility_check


def _starting_links(d: dict, geom, from_lattice: str | None, ignore_checksum: bool):
    start = from_lattice or d["run"]["start"]
    if start == "cold":
        return GaugeField.unit(geom), "cold start"
    if start == "hot":
        return GaugeField.random(geom, CounterRNG(d["run"]["seed"])), "hot start"
    from lattice.io import read_gauge

    u, info = read_gauge(start, geom=geom, ignore_checksum=ignore_checksum, reunitarize=True)
    return u, f"{info.get('format', 'lattice')} file {os.path.abspath(start)}"


def init_run(deck_path: str | None, out: str, from_lattice: str | None = None, force: bool = False,
             ignore_checksum: bool = False, backend: str | None = None, log=print) -> runfile.RunState:
    """Validate the deck (or the embedded quick deck), build the starting configuration, write the run file."""
    if deck_path is None:
        text = deckmod.default_deck_text()
        d = deckmod.loads(text)
    else:
        d, text = deckmod.load(deck_path)
    if os.path.exists(out) and not force:
        raise runfile.RunFileError(f"{out} exists already: continue it with 'hmc run {out}', or pass --force to "
                                   "overwrite it")
    geom = make_geometry(d, backend)
    u, source = _starting_links(d, geom, from_lattice, ignore_checksum)
    ss, st = plaquette(u)                    # collective: every rank has checked for an existing file by now
    state = runfile.RunState(d, text, geom.gather(u.site_major()), 0,   # the whole lattice on rank 0
                             CounterRNG(d["run"]["seed"]).state(), [], [], source)
    if geom.grid.is_root:
        runfile.save(out, state)
        log(f"wrote {out}: {d['run']['name']}, lattice {'x'.join(map(str, d['lattice']['dims']))}, {source}, "
            f"PLAQ: {ss:.10f} {st:.10f}")
    return state


def _history_row(traj, res, u, geom, warmup: bool) -> dict:
    ss, st = plaquette(u)
    pl = polyakov_loop(u)
    dh = res.delta_h
    row = {"traj": traj, "warmup": int(warmup), "accepted": int(res.accepted), "dH": dh,
           "exp_mdH": math.exp(-dh) if dh > -700 else float("inf"), "xrandom": res.xrandom,
           "g_start": res.start.gauge, "h_start": res.start.kinetic, "f_start": res.start.fermion,
           "g_end": res.end.gauge, "h_end": res.end.kinetic, "f_end": res.end.fermion,
           "plaq_ss": ss, "plaq_st": st, "ploop_re": pl.real, "ploop_im": pl.imag,
           "link_trace": link_trace(u)}
    for k, v in sorted(res.timers.items()):
        row[f"time_{k}"] = float(v)
    return row


def summary_line(row: dict) -> str:
    """MILC's words on one line: ACCEPT/REJECT delta S, PLAQ (ss st), P_LOOP."""
    word = "WARMUP" if row["warmup"] else "ACCEPT" if row["accepted"] else "REJECT"
    return (f"traj {row['traj']:5d}  {word}: delta S = {row['dH']:+.6e}  PLAQ: {row['plaq_ss']:.10f} "
            f"{row['plaq_st']:.10f}  P_LOOP: {row['ploop_re']:+.6e} {row['ploop_im']:+.6e}  "
            f"time {row['time_total']:.2f} s")


def run(path: str, trajectories: int | None = None, backend: str | None = None, show_progress: bool = True,
        log=print) -> runfile.RunState:
    """Run (or resume) the trajectories the run file describes; checkpoint atomically as the deck says."""
    state = runfile.load(path)
    d = state.deck
    geom = make_geometry(d, backend)
    root = geom.grid.is_root
    monomials = make_monomials(d)
    schedule = make_schedule(d, monomials)
    expm = link_exponential(d["integrator"]["link_exponential"])
    rng = CounterRNG(state.rng["seed"], state.rng["counters"])
    u = GaugeField.from_site_major(geom, geom.local_part(state.links))     # every rank read the file: keep its sites
    remaining = d["run"]["trajectories"] - state.trajectory if trajectories is None else trajectories
    if remaining <= 0:
        if root:
            log(f"{path}: all {state.trajectory} trajectories of the deck are done; run more with "
                f"'hmc run {path} --trajectories N'")
        return state
    state.comms = geom.grid.transport_table()             # collective; the resolved links of every rank on rank 0
    if root and state.comms:
        from comms.halo import format_table

        log(format_table(state.comms, geom.grid.describe()))
    if root:
        log(f"{d['run']['name']}: resuming after trajectory {state.trajectory}, running {remaining} more "
            f"({geom.backend.name}, {'; '.join(m.describe() for m in monomials)})")
        log(f"integrator {d['integrator']['scheme']} steps {d['integrator']['steps']} tau {d['integrator']['tau']}: "
            f"{len(schedule)} operations")
    bar = Progress(remaining, "trajectories", enabled=root and show_progress)
    every = d["run"]["checkpoint_every"]
    for i in range(remaining):
        if d["integrator"]["reversibility_check"]:
            probe_rng = CounterRNG(rng.seed, dict(rng.counters))
            rev = reversibility_check(u, random_momenta(geom, probe_rng), monomials, schedule, expm)
            if root:
                log(f"REVERSIBILITY: max|dU| = {rev['links']:.3e} max|dP| = {rev['momenta']:.3e} "
                    f"dH = {rev['dH']:+.3e}")
        warmup = state.trajectory < d["run"]["warmups"]
        u, res = hmc_trajectory(u, rng, monomials, schedule, expm, d["integrator"]["reunitarize"],
                                metropolis=not warmup)
        state.trajectory += 1
        row = _history_row(state.trajectory, res, u, geom, warmup)
        state.history.append(row)
        if root:
            log(summary_line(row))
        bar.update(i + 1, f"dH {row['dH']:+.2e}")
        if (i + 1) % every == 0 or i + 1 == remaining:
            state.links = geom.gather(u.site_major())      # collective: the whole lattice on rank 0
            state.rng = rng.state()
            if root:
                runfile.save(path, state)
    if root:
        tested = [r["accepted"] for r in state.history[-remaining:] if not r["warmup"]]
        acc = f"acceptance {np.mean(tested):.3f}" if tested else "all warmups"
        log(f"RUNNING COMPLETED: {remaining} trajectories, {acc}, file {path}")
    geom.grid.close()                        # free the halo buffers; fails if a mapping or window leaked
    return state
