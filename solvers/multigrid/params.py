"""The multigrid's parameters (:class:`MultigridParams`, made by :func:`.solver.multigrid`) and their check against
the lattice (:func:`validate`)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .lattice import MultigridError, check_blocks, check_hypercubes
from .precision import PRECISIONS

COARSEST = ("auto", "lu", "gcr")


@dataclass
class MultigridParams:
    """Parameters of :func:`multigrid` (see there)."""

    tol: float = 1e-10
    maxiter: int = 200
    levels: int = 3
    blocks: tuple = ()
    nv: tuple = (48,)
    setup_iters: tuple = (50,)
    refresh_iters: int = 10
    smoother_steps: tuple = (0, 4)
    kcycle_tol: float = 0.05
    kcycle_maxiter: int = 20
    coarsest: str = "auto"
    coarsest_tol: float = 0.25
    coarsest_maxiter: int = 100
    lu_max_unknowns: int = 200_000
    nkrylov: int = 32
    kd: bool = True
    seed: int = 2024
    raise_on_fail: bool = True
    precision: str = "double"

    def per_level(self, values, l: int, what: str):
        """The value of a per-aggregation-level parameter for aggregation level l (2, 3, ...): the last entry
        is repeated."""
        values = tuple(values) if isinstance(values, (tuple, list)) else (values,)
        if not values:
            raise MultigridError(f"{what}: give at least one value")
        return values[min(l - 2, len(values) - 1)]

    def steps(self, l: int) -> int:
        s = tuple(self.smoother_steps) if isinstance(self.smoother_steps, (tuple, list)) else (self.smoother_steps,)
        return int(s[min(l, len(s) - 1)])


def _default_blocks(levels):
    return ((4, 4, 4, 4),) + ((2, 2, 2, 2),) * max(0, levels - 3)


def validate(params: MultigridParams, geom, naik: bool) -> MultigridParams:
    """Check the parameters against the lattice; one-line :class:`MultigridError` naming the failed constraint.
    Returns the parameters with ``blocks`` filled in."""
    p = params
    if not isinstance(p.levels, int) or p.levels < 3:
        raise MultigridError(f"levels = {p.levels!r}: at least 3 (fine, Kahler-Dirac, one aggregation)")
    if not (0 < p.tol < 1):
        raise MultigridError(f"tol = {p.tol!r}: the tolerance must lie in (0, 1)")
    if p.maxiter < 1:
        raise MultigridError(f"maxiter = {p.maxiter!r}: at least 1")
    if p.coarsest not in COARSEST:
        raise MultigridError(f"coarsest = {p.coarsest!r}: use one of {', '.join(COARSEST)}")
    if p.precision not in PRECISIONS:
        raise MultigridError(f"precision = {p.precision!r}: the preconditioner's precision is one of "
                             f"{', '.join(PRECISIONS)} (the outer solve is always double)")
    nagg = p.levels - 2
    blocks = tuple(tuple(b) for b in p.blocks) if p.blocks else _default_blocks(p.levels)[:nagg]
    if len(blocks) != nagg:
        raise MultigridError(f"blocks: {len(blocks)} given for {p.levels} levels, which need {nagg} (one per "
                             "aggregation level)")
    check_hypercubes(geom)
    local = tuple(geom.local_dims)
    checked = []
    for i, b in enumerate(blocks):
        b = check_blocks(local, b, naik, first=(i == 0), level=i + 2)
        checked.append(b)
        local = tuple(n // k for n, k in zip(local, b))
    for l in range(2, p.levels):
        nv = p.per_level(p.nv, l, "nv")
        if not isinstance(nv, (int, np.integer)) or nv < 1:
            raise MultigridError(f"nv = {nv!r} on level {l}: a positive number of near-null vectors")
        it = p.per_level(p.setup_iters, l, "setup_iters")
        if it < 0:
            raise MultigridError(f"setup_iters = {it!r} on level {l}: must not be negative")
    return replace(p, blocks=tuple(checked))
