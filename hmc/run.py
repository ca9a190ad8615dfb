"""``hmc init`` and ``hmc run``: create a run file from a deck, and run or resume the trajectories it describes."""
from __future__ import annotations

import math
import os

import numpy as np

from lattice import CounterRNG, GaugeField, link_trace, plaquette, polyakov_loop

from . import deck as deckmod
from . import guard, runfile
from .assemble import load_rationals, make_geometry, make_monomials, make_schedule, rationals_path, run_config
from .integrators import IntegratorError
from .kept_configs import keeps
from .progress import Progress
from .rngs import copy_rng, draw_momenta, make_rng, rng_from_state
from .trajectory import hmc_trajectory, link_exponential, reversibility_check


def _starting_links(d: dict, geom, from_lattice: str | None, ignore_checksum: bool, force_reunitarize: bool = False):
    start = from_lattice or d["run"]["start"]
    if start == "cold":
        return GaugeField.unit(geom), "cold start"
    if start == "hot":
        return GaugeField.random(geom, CounterRNG(d["run"]["seed"])), "hot start"
    from .lattice_source import read_lattice

    u, info = read_lattice(start, geom=geom, ignore_checksum=ignore_checksum, reunitarize=True, check_links=True,
                           force_reunitarize=force_reunitarize)
    if info.get("format") == runfile.FORMAT:     # RUN.h5 or RUN.h5:N (hmc.lattice_source)
        return u, f"trajectory {info['trajectory']} of run file {os.path.abspath(info['path'])}"
    return u, f"{info.get('format', 'lattice')} file {os.path.abspath(start)}"


def _run_files(d: dict, deck_path: str | None, rationals: str | None) -> dict:
    """Texts the run file keeps besides the deck: the RHMC rational functions (checked against the deck)."""
    if d.get("fermions") is None:
        if rationals:
            raise deckmod.DeckError("--rationals was given but the deck has no [fermions] section")
        return {}
    base = os.path.dirname(os.path.abspath(deck_path)) if deck_path else os.getcwd()
    path = rationals_path(d, base, rationals)
    load_rationals(d, path=path)
    with open(path, encoding="utf-8") as fh:
        return {"rationals": fh.read()}


def init_run(deck_path: str | None, out: str, from_lattice: str | None = None, force: bool = False,
             ignore_checksum: bool = False, backend: str | None = None, log=print,
             rationals: str | None = None, settings: dict | None = None,
             force_reunitarize: bool = False, deck_text: str | None = None, files: dict | None = None
             ) -> runfile.RunState:
    """Validate the deck (or the embedded quick deck), build the starting configuration, write the run file.
    A lattice file with NaN/inf or links far from U(3) is refused unless ``force_reunitarize``
    (:mod:`lattice.io.physical`).

    With ``[fermions]`` the rational functions (the deck's ``rationals``, relative to the deck's folder, or
    ``rationals``, relative to the working directory) are checked against the deck and copied into the run file.
    ``settings``: the command line's explicit run settings (:func:`hmc.assemble.run_config`; ``backend`` is one);
    the run configuration they give is stored in the run file. ``deck_text``: the deck's TOML text instead of
    reading ``deck_path`` (which then only names its folder); ``files``: more texts for the run file to keep (e.g. the
    MILC deck ``hmc milc`` translated)."""
    if deck_text is not None:
        text, d = deck_text, deckmod.loads(deck_text)
    elif deck_path is None:
        text = deckmod.default_deck_text()
        d = deckmod.loads(text)
    else:
        d, text = deckmod.load(deck_path)
    guard.check_not_folder(out, "-o ")
    if os.path.exists(out) and not force:
        raise runfile.RunFileError(f"{out} exists already: continue it with 'hmc run {out}', or pass --force to "
                                   "overwrite it")
    files = {**_run_files(d, deck_path, rationals), **(files or {})}
    config = run_config(text, _with_backend(settings, backend))
    with guard.locked(out, "hmc init"):      # a live 'hmc run' of this file refuses the overwrite
        geom = make_geometry(d, config=config)
        u, source = _starting_links(d, geom, from_lattice, ignore_checksum, force_reunitarize)
        ss, st = plaquette(u)                # collective: every rank has checked for an existing file by now
        rng = make_rng(d["run"]["rng"], d["run"]["seed"], geom.dims)
        state = runfile.RunState(d, text, geom.gather(u.site_major()), 0,   # the whole lattice on rank 0
                                 rng.state(), [], [], source, files, config, (ss, st))
        if geom.grid.is_root:
            guard.check_room(out, guard.checkpoint_bytes(state))
            guard.save_checkpoint(out, state)
            log(f"wrote {out}: {d['run']['name']}, lattice {'x'.join(map(str, d['lattice']['dims']))}, {source}, "
                f"PLAQ: {ss:.10f} {st:.10f}")
    return state


def _history_row(traj, res, u, geom, warmup: bool, fermions=()) -> dict:
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
    for m in fermions:                        # one RHMC monomial: iterations, solves, link builds, times per phase
        row.update(m.stats.totals())
    return row


def milc_lines(res, fermions, row: dict, beta: float | None = None, volume: int | None = None, previous=None,
               metropolis: bool = True) -> list[str]:
    """MILC's printout of one RHMC trajectory (docs/conventions.md 3.6), in MILC's order: GRSOURCE and heat-bath CG lines;
    then for every action measurement (``d_action_rhmc``: the start, the integrator's monitors, the end) the
    ``PLAQUETTE ACTION`` line (with ``beta`` and the lattice ``volume``: -beta V (ss + st)), the action's CG lines,
    ``ACTION: g,h,f = ...`` and ``DG = ...``
    (differences from the measurement before, ``previous`` = (g, h, f, total) for the first: MILC keeps them across
    trajectories, zero at its start), with the CG lines of the force evaluations between them; then
    ``ACCEPT``/``REJECT: delta S`` (``CHECK`` without the Metropolis test, MILC's RHMD builds). ``PLAQ:`` and
    ``P_LOOP:`` follow in :func:`gauge_measurement_lines`."""
    old = list(previous) if previous is not None else [0.0, 0.0, 0.0, 0.0]
    out = []
    for m in fermions:
        out += m.milc_lines("GR")
    md_done = {m.name: 0 for m in fermions}
    for call, h in enumerate([res.start] + list(res.monitors) + [res.end]):
        for m in fermions:
            for c in range(md_done[m.name], h.md_calls.get(m.name, md_done[m.name])):
                out += m.milc_lines("MD", c)
            md_done[m.name] = h.md_calls.get(m.name, md_done[m.name])
        if beta is not None and h.plaquette:
            out.append(f"PLAQUETTE ACTION: {-beta * volume * (h.plaquette[0] + h.plaquette[1]):e}")
        for m in fermions:
            out += m.milc_lines("FA", call)
        new = [h.gauge, h.kinetic, h.fermion, h.total]
        out.append(f"ACTION: g,h,f = {new[0]:.14e}  {new[1]:.14e}  {new[2]:.14e}  {new[3]:.14e}")
        d = [a - b for a, b in zip(new, old)]
        out.append(f"DG = {d[0]:e}, DH = {d[1]:e}, DF = {d[2]:e}, D = {d[3]:e}")
        old = new
    word = "WARMUP" if row["warmup"] else "CHECK" if not metropolis else "ACCEPT" if row["accepted"] else "REJECT"
    out.append(f"{word}: delta S = {row['dH']:e}")
    return out


def gauge_measurement_lines(row: dict, u=None, gauge_action=None, precision: int = 2) -> list[str]:
    """MILC's ``PLAQ:`` and ``P_LOOP:`` lines; with ``u`` and ``gauge_action`` also its gauge-loop measurement
    (``G_LOOP:`` lines and ``GACTION:``, :func:`hmc.milc_loops.g_loop_lines`) as ks_imp_rhmc's ``g_measure``, in the
    formats of MILC's double (``precision`` 2) or single-precision build (1: PLAQ ``%f``, G_LOOP ``%e``)."""
    fmt = ".16f" if precision == 2 else "f"
    out = [f"PLAQ:\t{row['plaq_ss']:{fmt}}\t{row['plaq_st']:{fmt}}",
           f"P_LOOP:\t{row['ploop_re']:e}\t{row['ploop_im']:e}"]
    if u is not None:
        from .milc_loops import g_loop_lines

        out += g_loop_lines(u, gauge_action, precision)
    return out


def summary_line(row: dict) -> str:
    """MILC's words on one line: ACCEPT/REJECT delta S, PLAQ (ss st), P_LOOP."""
    word = "WARMUP" if row["warmup"] else "ACCEPT" if row["accepted"] else "REJECT"
    return (f"traj {row['traj']:5d}  {word}: delta S = {row['dH']:+.6e}  PLAQ: {row['plaq_ss']:.10f} "
            f"{row['plaq_st']:.10f}  P_LOOP: {row['ploop_re']:+.6e} {row['ploop_im']:+.6e}  "
            f"time {row['time_total']:.2f} s")


def _with_backend(settings: dict | None, backend: str | None) -> dict:
    out = dict(settings or {})
    if backend:
        out["backend"] = backend
    return out


def run(path: str, trajectories: int | None = None, backend: str | None = None, show_progress: bool = True,
        log=print, settings: dict | None = None) -> runfile.RunState:
    """Run (or resume) the trajectories the run file describes; checkpoint atomically as the deck says. The run
    configuration comes from ``settings`` (the command line's), the stored deck and the environment, as at
    ``hmc init``; the run file records the one of the run that wrote it. The run holds the file's lock
    (:mod:`hmc.guard`: a second writer is refused); SIGTERM and Ctrl-C abandon the trajectory under way and leave
    the last complete one in the file."""
    if trajectories is not None and trajectories < 1:
        raise deckmod.DeckError(f"--trajectories {trajectories}: give a positive number of trajectories to run now "
                                f"(or leave it out to run up to the deck's total)")
    guard.check_not_folder(path, "")
    with guard.locked(path, "hmc run", warn=log), guard.terminate_as_exception():
        return _run_locked(path, trajectories, backend, show_progress, log, settings)


def _run_locked(path, trajectories, backend, show_progress, log, settings) -> runfile.RunState:
    state = runfile.load(path)
    d = state.deck
    state.config = run_config(state.deck_text, _with_backend(settings, backend))
    geom = make_geometry(d, config=state.config)
    root = geom.grid.is_root
    remaining = d["run"]["trajectories"] - state.trajectory if trajectories is None else trajectories
    if root and remaining > 0:                # before the work: room for the checkpoint it ends with
        guard.check_room(path, guard.checkpoint_bytes(state, remaining))
    monomials = make_monomials(d, state.files)
    fermions = [m for m in monomials if m.kind == "fermion"]
    schedule = make_schedule(d, monomials)
    expm = link_exponential(d["integrator"]["link_exponential"])
    rng = rng_from_state(d["run"]["rng"], state.rng, geom.dims)
    u = GaugeField.from_site_major(geom, geom.local_part(state.links))     # every rank read the file: keep its sites
    if remaining <= 0:
        if root:
            log(f"{path}: all {state.trajectory} trajectories of the deck are done; run more with "
                f"'hmc run {path} --trajectories N'")
        return state
    if not state.plaquette:                               # a version-1 file: /gauge had no plaquette
        state.plaquette = plaquette(u)
    state.comms = geom.grid.transport_table()             # collective; the resolved links of every rank on rank 0
    if root and state.comms:
        from comms.halo import format_table

        log(format_table(state.comms, geom.grid.describe()))
    if root and state.format_version < runfile.FORMAT_VERSION:
        log(f"{path}: run-file format version {state.format_version} (an older hmc's layout), rewritten as version "
            f"{runfile.FORMAT_VERSION} at the next checkpoint")
    if root:
        what = (f"resuming after trajectory {state.trajectory}, running {remaining} more" if state.trajectory else
                f"starting ({state.source}), running {remaining} trajectories")
        log(f"{d['run']['name']}: {what} ({geom.backend.name}, {'; '.join(m.describe() for m in monomials)})")
        log(f"integrator {d['integrator']['scheme']} steps {d['integrator']['steps']} tau {d['integrator']['tau']}: "
            f"{len(schedule)} operations")
    bar = Progress(remaining, "trajectories", enabled=root and show_progress)
    pending = {}                             # "snapshot": the last complete trajectory not yet in the file
    try:
        _trajectories(path, state, u, rng, geom, monomials, fermions, schedule, expm, remaining, bar, log, pending)
    except BaseException as e:
        # a trajectory that cannot be integrated (e.g. a solver that did not converge), SIGTERM or Ctrl-C (also when
        # its exception came out of a C callback as another error: guard.signal_exception): the trajectory under
        # way is abandoned; the last complete one is written if it is not in the file yet
        stop = e if isinstance(e, (IntegratorError, KeyboardInterrupt, guard.Terminated)) else guard.signal_exception()
        if stop is None:
            raise
        with guard.signals_deferred():
            if "snapshot" in pending:
                _checkpoint(path, state, pending, root)
            guard.discard_own_temporary(path)
        if root and isinstance(e, IntegratorError):
            log(f"STOPPED in trajectory {state.trajectory + 1}: {e}; {path} keeps trajectory {state.trajectory}")
        if stop is not e:
            raise stop from e
        raise
    if root:
        tested = [r["accepted"] for r in state.history[-remaining:] if not r["warmup"]]
        acc = f"acceptance {np.mean(tested):.3f}" if tested else "all warmups"
        if not d["run"]["metropolis"]:
            acc = "no Metropolis test (RHMD)"
        log(f"RUNNING COMPLETED: {remaining} trajectories, {acc}, file {path}")
    geom.grid.close()                        # free the halo buffers; fails if a mapping or window leaked
    return state


def _last_action(history) -> tuple:
    """g, h, f and their sum at the last action evaluation before the next trajectory (the end of the last one),
    MILC's ``old_g, old_h, old_f, old_a`` of its DG line; zeros at the start of a run, as MILC's."""
    if not history:
        return (0.0, 0.0, 0.0, 0.0)
    r = history[-1]
    return (r["g_end"], r["h_end"], r["f_end"], r["g_end"] + r["h_end"] + r["f_end"])


def _measured(d: dict, trajectory: int) -> bool:
    """Whether trajectory number ``trajectory`` (from 1) is measured: every one, or with ``[milc]`` MILC's rule:
    after the warms, every traj_between_meas-th."""
    milc = d.get("milc")
    if not milc:
        return True
    k = trajectory - milc["warms"]
    return k >= 1 and k % milc["traj_between_meas"] == 0


def _trajectory_lines(d, res, monomials, fermions, row, u, previous, measured) -> list[str]:
    """MILC's lines of one trajectory and its gauge measurement (collective: the gauge loops sum over ranks)."""
    milc = d.get("milc") is not None
    out = milc_lines(res, fermions, row, d["gauge"]["beta"], u.geom.volume, previous,
                     d["run"]["metropolis"]) if fermions else []
    if measured and (fermions or milc):               # MILC's g_measure: PLAQ, P_LOOP, G_LOOP, GACTION
        gauge = next(m for m in monomials if m.kind == "gauge")
        out += gauge_measurement_lines(row, u, gauge.gauge_action, d.get("milc", {}).get("precision", 2))
    out += [m.stats.multigrid_line() for m in fermions if m.stats.multigrid]     # [multigrid] light_shifts
    return out


def _checkpoint(path, state, pending, root) -> None:
    """Write the pending snapshot (a complete trajectory: its count, history, links, generator state, plaquette)
    into ``state`` and, on rank 0, the run file; it stays pending until the save has returned."""
    snap = pending["snapshot"]
    state.trajectory, state.history = snap["trajectory"], list(snap["history"])
    state.links, state.rng, state.plaquette = snap["links"], snap["rng"], snap["plaquette"]
    if root:
        guard.save_checkpoint(path, state)
    if pending.get("snapshot") is snap:
        del pending["snapshot"]


def _trajectories(path, state, u, rng, geom, monomials, fermions, schedule, expm, remaining, bar, log, pending):
    """The trajectory loop of :func:`run`. After each trajectory ``pending["snapshot"]`` holds it whole, stored in
    one step, so a signal between any two statements finds either the trajectory before or this one complete; it
    is written every ``checkpoint_every`` trajectories and at the end. A stop signal is also acted on before every
    trajectory and after the last (:func:`hmc.guard.stop_if_signalled`)."""
    d = state.deck
    root = geom.grid.is_root
    every = d["run"]["checkpoint_every"]
    pbp = None
    if d.get("fermions", {}).get("pbp_masses"):              # PBP after each trajectory (hmc.measure)
        from .measure import PBPMeasurement

        pbp = PBPMeasurement(d)
    milc = d.get("milc")
    history = list(state.history)
    start = state.trajectory                  # state.trajectory itself moves at the checkpoints
    for i in range(remaining):
        guard.stop_if_signalled()             # a SIGTERM/SIGINT whose exception Python swallowed (a GC callback)
        if d["integrator"]["reversibility_check"]:
            probe_rng = copy_rng(rng)
            p = draw_momenta(geom, probe_rng)
            for m in monomials:
                m.refresh(u, probe_rng)
            rev = reversibility_check(u, p, monomials, schedule, expm)
            if root:
                log(f"REVERSIBILITY: max|dU| = {rev['links']:.3e} max|dP| = {rev['momenta']:.3e} "
                    f"dH = {rev['dH']:+.3e}")
        traj = start + i + 1
        if milc and root and traj - 1 == milc["warms"]:
            log("WARMUPS COMPLETED")
        warmup = traj <= d["run"]["warmups"]
        u, res = hmc_trajectory(u, rng, monomials, schedule, expm, d["integrator"]["reunitarize"],
                                metropolis=d["run"]["metropolis"] and not warmup)
        previous = _last_action(history)
        row = _history_row(traj, res, u, geom, warmup, fermions)
        measured = _measured(d, traj)
        pbp_out = (pbp.measure(u, rng) if measured else (pbp.empty_row(), [])) if pbp is not None else ({}, [])
        row.update(pbp_out[0])
        if keeps(d, traj):                                 # collective: every rank passes its links
            guard.save_kept(path, u, traj, d["run"]["name"], state.trajectory)
        lines = _trajectory_lines(d, res, monomials, fermions, row, u, previous, measured) + pbp_out[1]
        history = history + [row]
        pending["snapshot"] = {"trajectory": traj, "history": history, "links": geom.gather(u.site_major()),
                               "rng": rng.state(), "plaquette": (row["plaq_ss"], row["plaq_st"])}
        if root:
            for line in lines:
                log(line)
            if not milc:
                log(summary_line(row))
        bar.update(i + 1, f"dH {row['dH']:+.2e}")
        if (i + 1) % every == 0 or i + 1 == remaining:
            _checkpoint(path, state, pending, root)
    guard.stop_if_signalled()
