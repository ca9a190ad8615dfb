"""``hmc check``: the regression suite users run after a change.

Each reference is a deck ``hmc/checks/NAME.toml`` (a small lattice, a hot start from a fixed seed; a smooth random
field for RHMC decks, whose rational functions are read relative to the deck's folder) and its stored values
``hmc/checks/NAME.json``: package data, so an installed ``hmc`` finds them from any folder (``HMC_CHECKS_DIR``
names another folder of references). For every reference the check recomputes, at fixed seeds: the plaquette; for
each monomial its action after the refresh, the norm of its force and its directional derivative along a fixed
random direction Omega, which must also equal the central difference of the action (of the MD action for RHMC
fermions, whose exact derivative the force is: the force test of docs/conventions.md 5.2); and one short trajectory (dH
and the final plaquette). Every quantity is compared with the stored value under a stated relative tolerance; the
table is printed and any failure makes the exit code non-zero. ``--update`` rewrites the stored values, printing
old and new side by side: never silently. Finding no reference to run is a failure (:class:`CheckError`), not a
pass.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from comms.config import RunConfig
from lattice import CounterRNG, GaugeField, plaquette, su3

from . import deck as deckmod
from .assemble import make_geometry, make_monomials, make_schedule, run_config
from .momenta import random_momenta
from .trajectory import hmc_trajectory

#: relative tolerances by kind of quantity: plaquette and gauge numbers are exact arithmetic, fermion numbers carry
#: the solver tolerance of the reference deck.
TOLERANCES = {"plaquette": 1e-12, "gauge": 1e-10, "fermion": 1e-7, "trajectory": 1e-7, "fd": 1e-6}
FD_STEP = 1e-5


@dataclass
class Row:
    reference: str
    quantity: str
    value: float
    stored: float | None
    tol: float

    @property
    def rel(self) -> float | None:
        if self.stored is None:
            return None
        return abs(self.value - self.stored) / max(abs(self.stored), 1e-300)

    @property
    def ok(self) -> bool:
        return self.rel is not None and self.rel <= self.tol


class CheckError(RuntimeError):
    """The check cannot run: no reference found (a broken installation or an empty HMC_CHECKS_DIR)."""


def checks_dir(config: RunConfig | None = None) -> Path:
    """The references: the configuration's ``checks_dir`` (HMC_CHECKS_DIR), else the package's own ``hmc/checks/``."""
    where = (config if config is not None else RunConfig.from_environment()).checks_dir
    return Path(where) if where else Path(__file__).resolve().parent / "checks"


def available() -> list[str]:
    return sorted(p.stem for p in checks_dir().glob("*.toml"))


def _require_references() -> list[str]:
    names = available()
    if not names:
        where = (f"HMC_CHECKS_DIR={checks_dir()}" if RunConfig.from_environment().checks_dir
                 else f"{checks_dir()} (the package's references)")
        raise CheckError(f"no reference decks (NAME.toml) in {where}: nothing to check; reinstall hisq-hmc or point "
                         "HMC_CHECKS_DIR at a folder of references")
    return names


def _directional(monomials, u, omega):
    """sum_{x,mu} Tr(Pdot Omega) per monomial: the predicted dS/dtau along U -> exp(tau Omega) U."""
    out = {}
    for m in monomials:
        f = m.force(u)
        out[m.name] = (u.geom.sum((f * omega.swapaxes(-1, -2)).sum(axis=(-1, -2)).real),
                       math.sqrt(u.geom.sum((f.conj() * f).real)))
    return out


def _moved(u, omega, tau):
    return GaugeField(u.geom, su3.expm_su3(tau * omega) @ u.links)


def _start_field(geom, seed: int, fermions: bool) -> GaugeField:
    """The reference configuration: a hot start from ``seed``; with RHMC fermions a smooth random field
    exp(0.3 Omega) 1 (Omega a fixed Gaussian momentum field), because on Haar-random links the smallest eigenvalue
    of V^dag V falls below the HISQ force filter (docs/conventions.md 1.5) and the force is no longer the derivative of
    the action (the finite-difference ratio of a hot 4^4 start is ~2)."""
    if not fermions:
        return GaugeField.random(geom, CounterRNG(seed))
    omega = random_momenta(geom, CounterRNG(seed), "check_start")
    return GaugeField(geom, su3.expm_su3(0.3 * omega) @ GaugeField.unit(geom).links)


def compute(name: str, backend: str | None = None, settings: dict | None = None) -> list[tuple[str, float, float]]:
    """(quantity, value, tolerance) for one reference deck (``settings``: the command line's run settings)."""
    d, text = deckmod.load(checks_dir() / f"{name}.toml")
    settings = dict(settings or {})
    if backend:
        settings["backend"] = backend
    geom = make_geometry(d, config=run_config(text, settings))
    seed = d["run"]["seed"]
    monomials = make_monomials(d, base_dir=str(checks_dir()))
    u = _start_field(geom, seed, any(m.kind == "fermion" for m in monomials))
    out = []
    ss, st = plaquette(u)
    out += [("plaq_ss", ss, TOLERANCES["plaquette"]), ("plaq_st", st, TOLERANCES["plaquette"])]
    rng = CounterRNG(seed + 1)
    for m in monomials:
        m.refresh(u, rng)
    omega = random_momenta(geom, CounterRNG(seed + 2), "check_direction")
    derivs = _directional(monomials, u, omega)
    for m in monomials:
        kind = "gauge" if m.kind == "gauge" else "fermion"
        s0 = m.action(u)
        fd_action = getattr(m, "md_action", m.action)      # the action whose exact derivative the force is
        sp = fd_action(_moved(u, omega, FD_STEP))
        sm = fd_action(_moved(u, omega, -FD_STEP))
        fd = (sp - sm) / (2 * FD_STEP)
        pred, norm = derivs[m.name]
        out += [(f"{m.name}: action", s0, TOLERANCES[kind]),
                (f"{m.name}: |force|", norm, TOLERANCES[kind]),
                (f"{m.name}: dS/dtau", pred, TOLERANCES[kind]),
                (f"{m.name}: dS/dtau / finite difference", pred / fd, TOLERANCES["fd"])]
    schedule = make_schedule(d, monomials)
    v, res = hmc_trajectory(u, CounterRNG(seed + 3), monomials, schedule, metropolis=False)
    ss, st = plaquette(v)
    out += [("trajectory: dH", res.delta_h, TOLERANCES["trajectory"]),
            ("trajectory: plaquette", (ss + st) / 6, TOLERANCES["trajectory"])]
    return out


def run_checks(names=None, update: bool = False, backend: str | None = None, log=print,
               settings: dict | None = None, show_progress: bool = True) -> int:
    """Run the named references (all by default); returns the number of failures. Progress (one step per
    reference) goes to stderr unless ``show_progress`` is off (hmc.progress)."""
    from .progress import command_progress

    known = _require_references()
    names = names or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise deckmod.DeckError(f"no reference named {', '.join(unknown)} in {checks_dir()}: known references are "
                                f"{', '.join(known)}")
    rows = []
    with command_progress(len(names), "hmc check", show_progress) as bar:
        _compute_all(names, update, backend, log, settings, rows, bar)
    return _report(rows, names, update, log)


def _compute_all(names, update, backend, log, settings, rows, bar) -> None:
    """Compute every reference's values into ``rows`` (and with ``update`` store them)."""
    for i, name in enumerate(names):
        bar.update(i, f"{name}")
        t0 = time.perf_counter()
        ref_path = checks_dir() / f"{name}.json"
        stored = json.loads(ref_path.read_text()) if ref_path.exists() else {}
        values = compute(name, backend, settings)
        for q, v, tol in values:
            # the force/finite-difference ratio is checked against its exact value, 1
            rows.append(Row(name, q, v, 1.0 if q.endswith("finite difference") else stored.get(q), tol))
        if update:
            new = {q: v for q, v, _ in values if not q.endswith("finite difference")}
            ref_path.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
            log(f"{name}: wrote {len(new)} reference values to {ref_path}")
        log(f"{name}: computed in {time.perf_counter() - t0:.1f} s")
        bar.update(i + 1, f"{name} done")


def _report(rows, names, update, log) -> int:
    """The table of values against the stored ones; returns the number of failures."""
    log(f"{'reference':22s} {'quantity':44s} {'value':>22s} {'stored':>22s} {'rel diff':>9s} {'tol':>7s}  result")
    failures = 0
    for r in rows:
        stored = "missing" if r.stored is None else f"{r.stored:.15e}"
        rel = "" if r.rel is None else f"{r.rel:.1e}"
        word = "updated" if update else ("ok" if r.ok else "FAIL")
        failures += (not update) and not r.ok
        log(f"{r.reference:22s} {r.quantity:44s} {r.value:22.15e} {stored:>22s} {rel:>9s} {r.tol:7.0e}  {word}")
    log(f"hmc check: {len(rows)} values, {failures} failed" + (" (references updated)" if update else ""))
    if not rows:
        raise CheckError(f"the references {', '.join(names)} gave no values: nothing was checked")
    return failures


def listing() -> list[str]:
    """``hmc check --list``: one line per reference, its name and its deck's run name."""
    names = _require_references()
    out = []
    for name in names:
        d, _ = deckmod.load(checks_dir() / f"{name}.toml")
        out.append(f"{name:22s} {d['run']['name']}")
    return out
