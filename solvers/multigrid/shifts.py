"""Multigrid for the smallest shifts of a rational-function solve, multishift CG for the rest (docs/multigrid.md 7).

The RHMC solves (A + p_l)^-1 b with A = -D_eo D_oe on the even sites (the massless even-odd normal operator,
MILC's 4m^2 - D_eo D_oe at m = 0) and the poles p_l of a rational approximation. A pole p acts as a mass
m_p = sqrt(p)/2: A + p = 4 m_p^2 - D_eo D_oe. Its even-site solve is the even part of one full-lattice solve
M(m_p) x = (b_e / (2 m_p), 0) (docs/multigrid.md "Why the plain approach fails"), which multigrid does in a number of
outer iterations that does not grow as m_p falls, where CG's grows as 1/m_p. So the ``n`` smallest poles go to
multigrid and the rest to one multishift CG (which then stops on its smallest remaining pole, far better
conditioned).

Accuracy: the full-lattice residual r of M x = b' gives the even-site residual 2 m_p r_e - D_eo r_o, amplified by
up to (2 m_p + 8)/(2 m_p) relative to |b'|: the multigrid tolerance is scaled down by that factor, the Schur residual
|b - (A + p) x_e| is recomputed and, if still above ``tol``, corrected by further multigrid solves of the residual
(iterative refinement, at most ``refinements``).

Set-up reuse (docs/multigrid.md 7, "Multigrid in an RHMC run"): one :class:`MultigridInverse` per
operator family (``key``) is kept; the poles are its ``with_mass`` hierarchies on one set of near-null vectors,
built once, on the first solve. A new gauge field (D.set_links, or a new D built from new links with the same
geometry) rebuilds X^-1 and the coarse operators on the kept vectors (a thin update), and refreshes the vectors by
``refresh_iters`` CG iterations from where they are when ``refresh_every`` trajectories (:meth:`new_trajectory`,
called by each RHMC heat bath) have begun since the last build or refresh (1: at most one refresh per trajectory;
0: never; None, the default here: on every new gauge field; :class:`.solver.Subspace`; the deck's
``[multigrid] refresh_every`` defaults to 1). Keep the object across trajectories.
"""
from __future__ import annotations

import math
import time

import numpy as np

from ..cg import SolverStats
from ..multishift import ShiftInverse, multishift_cg
from ..staggered import project
from .solver import MultigridInverse, multigrid


class MultigridShifts:
    """``solve(D, A, poles, b, tol, maxiter)``: [(A + p)^-1 b for p in poles] with the ``nshifts`` smallest poles by
    multigrid; ``mg`` are the :func:`multigrid` keyword arguments (levels, blocks, nv, setup_iters, ...).
    :meth:`inverter` is the same as a shift inverter factory (operator -> :class:`solvers.ShiftInverse`), the shape
    of every other RHMC solve."""

    def __init__(self, nshifts: int, refinements: int = 3, refresh_every: int | None = None, **mg):
        if int(nshifts) < 0:
            raise ValueError(f"nshifts = {nshifts}: a number >= 0 of smallest shifts for multigrid")
        if refresh_every is not None and (not isinstance(refresh_every, int) or refresh_every < 0):
            raise ValueError(f"refresh_every = {refresh_every!r}: a number >= 0 of trajectories between refreshes of "
                             "the near-null vectors (0: never refresh, only rebuild the coarse operators), or None "
                             "(refresh on every new gauge field)")
        self.nshifts = int(nshifts)
        self.refinements = int(refinements)
        self.refresh_every = refresh_every
        self.mg = dict(mg)
        self._base: dict = {}            # key of the operator family -> MultigridInverse (its subspace is kept)
        self._by_mass: dict = {}         # (key, mass) -> MultigridInverse sharing that subspace

    def _inverse(self, D, mass: float, key) -> MultigridInverse:
        base = self._base.get(key)
        if base is None or base.op.geom is not D.geom:
            base = multigrid(**self.mg, refresh_every=self.refresh_every)(D.matrix(mass))
            self._base[key] = base
            self._by_mass = {k: v for k, v in self._by_mass.items() if k[0] != key}
            self._by_mass[(key, mass)] = base
            return base
        if base.op.dslash is not D:
            # new links: a fresh inverse for D on the kept near-null vectors (refreshed on its first solve)
            base = MultigridInverse(D.matrix(mass), base.params, base.subspace)
            self._base[key] = base
            self._by_mass = {k: v for k, v in self._by_mass.items() if k[0] != key}
            self._by_mass[(key, mass)] = base
            return base
        inv = self._by_mass.get((key, mass))
        if inv is None:
            inv = base.with_mass(mass)
            self._by_mass[(key, mass)] = inv
        return inv

    def new_trajectory(self) -> None:
        """A trajectory begins (the heat bath): counts towards ``refresh_every`` for every kept subspace."""
        for base in self._base.values():
            base.subspace.new_epoch()

    def subspace_counts(self) -> dict:
        """{"built", "refreshed", "updated", "rebuilt": how often, summed over the kept subspaces}."""
        out = {"built": 0, "refreshed": 0, "updated": 0, "rebuilt": 0}
        for base in self._base.values():
            for k, v in base.subspace.counts.items():
                out[k] += v
        return out

    def inverter(self, D, poles, tol: float, maxiter: int, key=None) -> "MultigridShiftFactory":
        """The shift inverter factory of :meth:`solve` for the Dirac operator ``D``: ``inverter(D, poles, tol,
        maxiter)(A).solve(b)`` = ``solve(D, A, poles, b, tol, maxiter)``, A = -D_eo D_oe the even-site normal
        operator of D (as :func:`solvers.multishift.multishift_cg` (A)); the set-up kept here is shared."""
        return MultigridShiftFactory(self, D, tuple(float(p) for p in poles), float(tol), int(maxiter), key)

    def solve_one(self, D, A, pole: float, b, tol: float, key=None):
        """(A + pole)^-1 b on the even sites by multigrid; returns (x_e, stats dict)."""
        geom = D.geom
        mp = math.sqrt(pole) / 2.0
        inv = self._inverse(D, mp, key)
        inv.params.tol = max(tol * 2 * mp / (2 * mp + 8.0), 1e-13)
        inv.params.maxiter = max(inv.params.maxiter, 500)
        bb = float(geom.sum((b.conj() * b).real))
        x = None
        r = b
        info = {"pole": pole, "mass": mp, "outer_iters": 0, "fine_applies": 0, "setup_fine_applies": 0,
                "setup_time": 0.0, "solves": 0, "setup": []}
        for _ in range(1 + self.refinements):
            y, st = inv.solve(r / (2 * mp))
            y = project(y, geom, 0)
            x = y if x is None else x + y
            info["outer_iters"] += st.iters
            info["fine_applies"] += st.fine_applies
            info["setup_fine_applies"] += st.setup_fine_applies
            info["setup_time"] += st.setup_time
            info["solves"] += 1
            info["setup"].append(st.setup)
            r = b - (A(x) + pole * x)
            rr = float(geom.sum((r.conj() * r).real))
            info["residual"] = math.sqrt(rr / bb) if bb > 0 else 0.0
            if rr <= tol * tol * bb:
                break
        return x, info

    def solve(self, D, A, poles, b, tol: float, maxiter: int, key=None, check_residual: bool = False):
        """[(A + p)^-1 b for p in poles]: multigrid for the ``nshifts`` smallest, multishift CG for the others.
        Returns (solutions in the order of ``poles``, stats): the multishift CG's :class:`SolverStats` (or one for
        the multigrid solves alone) with ``extra["multigrid"]``, one dict per multigrid pole."""
        poles = [float(p) for p in poles]
        order = np.argsort(poles, kind="stable")
        small = set(int(i) for i in order[:self.nshifts])
        rest = [i for i in range(len(poles)) if i not in small]
        xs = [None] * len(poles)
        t0 = time.perf_counter()
        if rest:
            inv = multishift_cg([poles[i] for i in rest], tol, maxiter, raise_on_fail=False,
                                check_residual=check_residual)(A)
            ys, st = inv.solve(b)
            for i, y in zip(rest, ys):
                xs[i] = y
        else:
            st = SolverStats("multigrid shifts", tol, converged=True, shifts=tuple(poles), maxiter=maxiter)
        infos = []
        for i in sorted(small, key=lambda i: poles[i]):
            xs[i], info = self.solve_one(D, A, poles[i], b, tol, key)
            infos.append(info)
            st.converged = st.converged and info["residual"] <= tol
        st.extra["multigrid"] = infos
        st.time = time.perf_counter() - t0
        return xs, st


class MultigridShiftInverse(ShiftInverse):
    """:meth:`MultigridShifts.solve` as a :class:`solvers.ShiftInverse` of the even-site normal operator ``op``
    (made by :class:`MultigridShiftFactory`): ``xs, stats = inv.solve(b)``, zero start (no initial guesses)."""

    def __init__(self, op, factory: "MultigridShiftFactory"):
        super().__init__(op, factory.poles, "multigrid shifts")
        self.factory = factory

    def _solve(self, b, guesses):
        if guesses is not None:
            raise ValueError(f"{self.name} starts from zero: it takes no initial guesses")
        f = self.factory
        return f.shifts.solve(f.D, self.op, f.poles, b, f.tol, f.maxiter, key=f.key)


class MultigridShiftFactory:
    """The factory of :meth:`MultigridShifts.inverter`: op -> :class:`MultigridShiftInverse`."""

    def __init__(self, shifts: MultigridShifts, D, poles, tol: float, maxiter: int, key=None):
        self.shifts, self.D, self.poles, self.tol, self.maxiter, self.key = shifts, D, poles, tol, maxiter, key

    def __call__(self, op) -> MultigridShiftInverse:
        return MultigridShiftInverse(op, self)
