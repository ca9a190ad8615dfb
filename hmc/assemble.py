"""From a validated deck to the objects a run needs: geometry, actions, monomials, integrator schedule."""
from __future__ import annotations

from force.gauge_action import SymanzikAction, WilsonAction
from lattice import Geometry, get_backend
from comms import ProcessGrid

from .integrators import Level, build_schedule
from .monomials import GaugeMonomial


def make_geometry(deck: dict, backend_name: str | None = None) -> Geometry:
    backend = get_backend(backend_name or deck["run"]["backend"])
    return Geometry(tuple(deck["lattice"]["dims"]), backend, ProcessGrid(tuple(deck["lattice"]["grid"])))


def make_gauge_action(g: dict):
    if g["action"] == "wilson":
        return WilsonAction(g["beta"])
    return SymanzikAction(g["beta"], g["u0"], g["nf"], g["quark_loops"])


def make_monomials(deck: dict) -> list:
    return [GaugeMonomial(make_gauge_action(deck["gauge"]))]


def make_schedule(deck: dict, monomials: list) -> list:
    """Gauge monomials on the innermost level; fermion monomials (when present) on the outer one."""
    integ = deck["integrator"]
    gauge = [m.name for m in monomials if m.kind == "gauge"]
    fermion = [m.name for m in monomials if m.kind != "gauge"]
    if integ["scheme"] == "3g1f":
        levels = [Level("3g1f", integ["steps"], fermion), Level("leapfrog", 1, gauge)]
    elif integ["inner_scheme"] and fermion:
        levels = [Level(integ["scheme"], integ["steps"], fermion),
                  Level(integ["inner_scheme"], integ["inner_steps"], gauge)]
    else:
        levels = [Level(integ["scheme"], integ["steps"], fermion + gauge)]
    return build_schedule(levels, integ["tau"])
