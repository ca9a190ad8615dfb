"""One HMC trajectory: momentum refresh, molecular dynamics along a schedule, Metropolis test.

MILC's equations of motion (``ks_imp_rhmc/update_u.c``, docs/conventions.md 3.4): U <- exp(dt P) U, P <- P + dt Pdot.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from lattice import GaugeField, su3

from .momenta import kinetic_energy, random_momenta  # noqa: F401  (random_momenta: imported from here elsewhere)
from .rngs import draw_momenta


@dataclass
class Hamiltonian:
    gauge: float
    kinetic: float
    fermion: float = 0.0
    parts: dict = field(default_factory=dict)
    plaquette: tuple = ()          # (ss, st) of the links, for MILC's PLAQUETTE ACTION line (measured_action)
    md_calls: dict = field(default_factory=dict)     # force evaluations of each fermion monomial before it

    @property
    def total(self) -> float:
        return self.gauge + self.kinetic + self.fermion


def hamiltonian(u: GaugeField, p, monomials) -> Hamiltonian:
    parts = {m.name: m.action(u) for m in monomials}
    g = sum(v for m, v in zip(monomials, parts.values()) if m.kind == "gauge")
    f = sum(v for m, v in zip(monomials, parts.values()) if m.kind != "gauge")
    return Hamiltonian(gauge=g, kinetic=kinetic_energy(u.geom, p), fermion=f, parts=parts)


def measured_action(u: GaugeField, p, monomials) -> Hamiltonian:
    """MILC's ``d_action_rhmc`` at the start and end of a trajectory and at the integrator's ``("A", 0)`` monitors:
    the Hamiltonian, the plaquette (its PLAQUETTE ACTION line) and how many force evaluations each fermion
    monomial had made by then (to print the solves in MILC's order)."""
    from lattice import plaquette

    h = hamiltonian(u, p, monomials)
    h.plaquette = plaquette(u)
    h.md_calls = {m.name: m.stats.calls.get("MD", 0) for m in monomials if hasattr(m, "stats")}
    return h


def link_exponential(name: str):
    """``exact`` (Cayley-Hamilton) or ``taylor8`` (MILC's 8th-order series in update_u.c)."""
    if name == "exact":
        return su3.expm_su3
    if name == "taylor8":
        return su3.expm_taylor
    raise ValueError(f"unknown link exponential {name!r}: use exact or taylor8")


def molecular_dynamics(u: GaugeField, p, schedule, monomials, expm=su3.expm_su3, timers=None, monitors=None):
    """Integrate (U, P) along ``schedule`` in place (``("R", 0)`` re-unitarizes the links, ``("A", 0)`` appends
    :func:`measured_action` to ``monitors``); returns the time spent per phase (link updates, each monomial's
    force). On a GPU each phase's clock stops after the device has
    finished it (a link update or a gauge force is only enqueued when its call returns), so that its time is not
    counted in the next phase."""
    by_name = {m.name: m for m in monomials}
    backend = u.geom.backend
    clock = _PhaseClock(backend, timers)
    for op in schedule:
        if op[0] == "R":
            u.reunitarize()
            clock.stop("links")
        elif op[0] == "A":
            if monitors is not None:
                monitors.append(measured_action(u, p, monomials))
            clock.stop("monitor")
        elif op[0] == "U":
            if expm is su3.expm_su3 or expm is su3.expm_taylor:     # one fused kernel on a GPU
                u.links = su3.exp_update(u.links, p, op[1], backend, expm)
            else:
                u.links = expm(op[1] * p) @ u.links
            clock.stop("links")
        else:
            _, names, dt = op
            for name in names:
                p += dt * by_name[name].force(u)
                clock.stop(f"force_{name}")
    return clock.times


class _PhaseClock:
    """Seconds of a trajectory's work by phase: each ``stop(name)`` adds the time since the last stop (or restart,
    or the start) to ``times[name]``, after the device has finished (a GPU call returns before its work is done)."""

    def __init__(self, backend, times: dict | None = None):
        self.backend, self.times = backend, (times if times is not None else {})
        self.restart()

    def restart(self):
        self.backend.synchronize()
        self.t = time.perf_counter()

    def stop(self, name: str):
        self.backend.synchronize()
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self.t
        self.t = now


@dataclass
class TrajectoryResult:
    start: Hamiltonian
    end: Hamiltonian
    accepted: bool
    xrandom: float
    timers: dict
    monitors: list = field(default_factory=list)     # the actions measured along the trajectory ("A" operations)

    @property
    def delta_h(self) -> float:
        return self.end.total - self.start.total


def hmc_trajectory(u: GaugeField, rng, monomials, schedule, expm=su3.expm_su3, reunitarize=True,
                   metropolis=True):
    """Run one trajectory from ``u``; returns (new field, TrajectoryResult). ``u`` itself is left unchanged.

    The momenta are drawn before the monomials refresh their auxiliary fields: MILC's order (``ranmom``, then the
    pseudofermion heat bath), which matters for its per-site generators (:mod:`hmc.rngs`). ``reunitarize``: the
    links are re-unitarized at the end, unless the schedule does it itself (``("R", 0)`` operations) or is empty
    (no molecular dynamics: the links are the start's, and dH = 0 exactly)."""
    t0 = time.perf_counter()
    clock = _PhaseClock(u.geom.backend)
    p = draw_momenta(u.geom, rng)
    clock.stop("momenta")
    for m in monomials:
        m.refresh(u, rng)
    clock.stop("refresh")
    start = measured_action(u, p, monomials)
    clock.stop("actions")
    v = u.copy()
    monitors = []
    timers = molecular_dynamics(v, p, schedule, monomials, expm, monitors=monitors)
    clock.restart()
    if reunitarize and schedule and not any(op[0] == "R" for op in schedule):
        v.reunitarize()
    clock.stop("reunitarize")
    end = measured_action(v, p, monomials)
    clock.stop("actions")
    timers.update(clock.times)
    xr = rng.global_uniform("metropolis")
    dh = end.total - start.total
    accepted = (not metropolis) or (dh <= 0 or math.exp(-dh) >= xr)
    timers["total"] = time.perf_counter() - t0
    return (v if accepted else u), TrajectoryResult(start, end, accepted, xr, timers, monitors)


def reversibility_check(u: GaugeField, p, monomials, schedule, expm=su3.expm_su3):
    """Integrate forward, flip P, integrate back: returns max|U_back - U|, max|P_back + P|... as a dict,
    with dH of the round trip. The test of docs/conventions.md 5.4."""
    xp = u.xp
    h0 = hamiltonian(u, p, monomials).total
    v, q = u.copy(), p.copy()
    molecular_dynamics(v, q, schedule, monomials, expm)
    q = -q
    molecular_dynamics(v, q, schedule, monomials, expm)
    h1 = hamiltonian(v, q, monomials).total
    return {"links": float(xp.abs(v.links - u.links).max()),
            "momenta": float(xp.abs(q + p).max()),
            "dH": h1 - h0}
