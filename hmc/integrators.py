"""Molecular-dynamics integrators as printable schedules that nest (Sexton-Weingarten).

A schedule is a flat list of operations: ``("U", dt)`` moves the links, U <- exp(dt P) U; ``("P", names, dt)``
kicks the momenta with the forces of the monomials ``names``, P <- P + dt Pdot. A nested integrator replaces each
link move of an outer level by a full integration of the inner level over that time.

Schemes (docs/conventions.md 3.5; MILC ``ks_imp_rhmc/update_rhmc.c``), with eps = tau/steps at that level:
- ``leapfrog``: per step U eps/2, P eps, U eps/2.
- ``omelyan`` (2MN, lambda = 0.2 in Takaishi-de Forcrand's normalization, MILC's lambda = 0.8): per two steps
  U lam*2eps, P eps, U (1-2lam)*2eps, P eps, U lam*2eps; ``steps`` must be even, as in MILC.
- ``3g1f``: MILC's INT_3G1F two-time-scale scheme with alpha = beta = 0.1: per 2 eps, 2 kicks of the outer
  (fermion) monomials and 6 of the inner (gauge) ones; it takes exactly two levels (the second level's
  scheme and steps are not used: the gauge kicks sit where MILC puts them).

With ``reunitarize=True`` the schedule also has ``("R", 0.0)`` after every cycle of the outer level (one step of
leapfrog, two of omelyan and 3g1f): re-unitarize the links there, as MILC's ``update_rhmc.c`` does
(``reunitarize()`` after each pass of its step loop).

MILC's single-time-scale builds, as ``ks_imp_rhmc/update_rhmc.c`` runs them (one level; every kick is
``update_h_rhmc``: the gauge force, then the fermion force of all pseudofermions ganged, with the same step; the
level's monomials are kicked in the order given, gauge first; a re-unitarization closes every cycle whatever
``reunitarize`` says):
- ``milc_leapfrog`` (INT_LEAPFROG, the su3_leapfrog build): per step U eps/2, P eps, U eps/2, R; after every
  4th step (``step % 4 == 0``) the build measures the action (``d_action_rhmc``, its "TEMP - monitor action"):
  ``("A", 0.0)``, which changes nothing but prints MILC's PLAQUETTE ACTION / ACTION / DG lines.
- ``milc_omelyan`` (INT_OMELYAN with MILC's lambda = 0.8, the su3_omelyan_rhmc build): per two steps
  U 0.4 eps, P eps, U 1.2 eps, P eps, U 0.4 eps, R (``omelyan`` with ``reunitarize``); ``steps`` even.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

SCHEMES = ("leapfrog", "omelyan", "3g1f", "milc_leapfrog", "milc_omelyan")
MILC_SCHEMES = ("milc_leapfrog", "milc_omelyan")
OMELYAN_LAMBDA = 0.2
MILC_LEAPFROG_MONITOR_EVERY = 4          # update_rhmc.c: if(step%4==0) d_action_rhmc(...)


class IntegratorError(ValueError):
    pass


@dataclass
class Level:
    scheme: str
    steps: int
    monomials: list = field(default_factory=list)

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise IntegratorError(f"unknown integrator {self.scheme!r}: use one of {', '.join(SCHEMES)}")
        if not isinstance(self.steps, int) or self.steps < 0:
            raise IntegratorError(f"integrator steps must be an integer >= 0, got {self.steps!r}")
        if self.scheme in ("omelyan", "3g1f", "milc_omelyan") and self.steps % 2:
            raise IntegratorError(f"{self.scheme} integrates two steps per cycle: steps must be even, "
                                  f"got {self.steps}")


def _milc_3g1f_cycle(eps, outer, inner, alpha=0.1, beta=0.1):
    """MILC INT_3G1F per 2 eps: link positions (units of eps) between gauge (G, eps/3) and fermion (F, eps) kicks."""
    a3 = alpha / 3.0
    marks = [(1 / 6 - a3, "G"), (0.5 - beta, "F"), (0.5 + a3, "G"), (5 / 6 - a3, "G"), (7 / 6 + a3, "G"),
             (1.5 - a3, "G"), (1.5 + beta, "F"), (11 / 6 + a3, "G"), (2.0, None)]
    ops, pos = [], 0.0
    for target, kick in marks:
        ops.append(("U", (target - pos) * eps))
        pos = target
        if kick == "G":
            ops.append(("P", tuple(inner), eps / 3.0))
        elif kick == "F":
            ops.append(("P", tuple(outer), eps))
    return ops


REUNITARIZE = ("R", 0.0)
MONITOR = ("A", 0.0)


def _level_ops(level: Level, tau: float, inner_ops, reunitarize: bool = False):
    """Operations of one level over time tau; ``inner_ops(dt)`` expands a link move of length dt. With
    ``reunitarize``, a re-unitarization closes every cycle (one leapfrog step, two omelyan steps)."""
    eps = tau / level.steps
    names = tuple(level.monomials)
    tail = [REUNITARIZE] if reunitarize else []
    ops = []
    if level.scheme == "leapfrog":
        for _ in range(level.steps):
            ops += inner_ops(eps / 2) + [("P", names, eps)] + inner_ops(eps / 2) + tail
    elif level.scheme == "milc_leapfrog":
        for step in range(1, level.steps + 1):
            ops += inner_ops(eps / 2) + [("P", names, eps)] + inner_ops(eps / 2) + [REUNITARIZE]
            if step % MILC_LEAPFROG_MONITOR_EVERY == 0:
                ops.append(MONITOR)
    elif level.scheme in ("omelyan", "milc_omelyan"):
        tail = [REUNITARIZE] if reunitarize or level.scheme == "milc_omelyan" else []
        h, lam = 2 * eps, OMELYAN_LAMBDA
        for _ in range(level.steps // 2):
            ops += (inner_ops(lam * h) + [("P", names, h / 2)] + inner_ops((1 - 2 * lam) * h)
                    + [("P", names, h / 2)] + inner_ops(lam * h)) + tail
    return ops


def build_schedule(levels: list[Level], tau: float, reunitarize: bool = False) -> list:
    """Flatten nested levels (outermost first) into one list of operations over trajectory length tau; with
    ``reunitarize``, ``("R", 0.0)`` closes every cycle of the outer level (module docstring)."""
    if not levels:
        raise IntegratorError("an integrator needs at least one level")
    if levels[0].steps == 0:            # MILC's steps_per_trajectory 0: the action measured twice, no MD
        return []
    if levels[0].scheme == "3g1f":
        if len(levels) != 2:
            raise IntegratorError("3g1f is a two-level scheme: give the fermion monomials on the first level and "
                                  "the gauge monomials on the second")
        eps = tau / levels[0].steps
        ops = []
        for _ in range(levels[0].steps // 2):
            ops += _milc_3g1f_cycle(eps, levels[0].monomials, levels[1].monomials)
            if reunitarize:
                ops.append(REUNITARIZE)
        return _drop_empty(ops)
    if any(lv.scheme == "3g1f" for lv in levels):
        raise IntegratorError("3g1f must be the outer level")
    if any(lv.scheme in MILC_SCHEMES for lv in levels) and len(levels) != 1:
        raise IntegratorError(f"{', '.join(MILC_SCHEMES)} are MILC's single-time-scale builds: give one level with "
                              "every monomial (gauge first)")

    def expand(depth):
        if depth == len(levels):
            return lambda dt: [("U", dt)]
        inner = expand(depth + 1)
        return lambda dt: _level_ops(levels[depth], dt, inner, reunitarize and depth == 0)

    return _drop_empty(expand(0)(tau))


def _drop_empty(ops):
    """Remove kicks with no monomials and merge consecutive link moves."""
    out = []
    for op in ops:
        if op[0] == "P" and not op[1]:
            op = ("U", 0.0)
        if op[0] == "U" and out and out[-1][0] == "U":
            out[-1] = ("U", out[-1][1] + op[1])
        else:
            out.append(op)
    return [op for op in out if not (op[0] == "U" and op[1] == 0.0)]


def describe(schedule) -> str:
    """One line per operation, with step sizes: the printable form of the integrator."""
    lines = []
    for op in schedule:
        if op[0] == "U":
            lines.append(f"U  {op[1]:+.6f}")
        elif op[0] == "R":
            lines.append("R  (reunitarize)")
        elif op[0] == "A":
            lines.append("A  (measure the action)")
        else:
            lines.append(f"P  {op[2]:+.6f}  [{', '.join(op[1])}]")
    return "\n".join(lines)


def force_evaluations(schedule) -> dict:
    """How many force evaluations each monomial costs per trajectory."""
    count = {}
    for op in schedule:
        if op[0] == "P":
            for name in op[1]:
                count[name] = count.get(name, 0) + 1
    return count


def total_time(schedule, name=None) -> float:
    """Total link-move time (name None) or total kick time of monomial ``name``: both must equal tau."""
    if name is None:
        return sum(op[1] for op in schedule if op[0] == "U")
    return sum(op[2] for op in schedule if op[0] == "P" and name in op[1])
