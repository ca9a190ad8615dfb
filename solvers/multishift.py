"""Shift inverters: ``xs, stats = inv.solve(b)`` gives x_i = (A + sigma_i)^-1 b for every shift, in one shape for
every variant (:class:`ShiftInverse`), made by operator -> inverter factories (see :mod:`solvers.cg` for the
conventions they share):

* :func:`multishift_cg`: (A + sigma_i) x_i = b for all shifts at once (Jegerlehner, hep-lat/9612014); every shift is
  updated at each iteration and the solver stops when the base (smallest) shift has converged, as MILC's
  ``ks_multicg_offset``. Zero initial guess. The base system runs the Chronopoulos-Gear iteration of
  :class:`solvers.cg.CGInverse` (one reduction per iteration).
* :func:`multi_shift`: any single-shift inverter (``cg(tol)``, ``mixed_precision(cg(tol))``) applied to each A + sigma_i
  in turn, each from its own initial guess.
* :func:`refined`: a shift inverter (the multishift CG, possibly on another operator: MILC's Naik-epsilon-0 links,
  or the same operator in single precision), then every shift refined from its solution by a single-shift inverter:
  MILC's ``KS_MULTICG=HYBRID`` (:func:`hybrid_multishift_cg`) and, with
  :func:`solvers.cg.mixed_precision`, the mixed-precision multishift (:func:`mixed_multishift_cg`), whose first
  stage under the ``multishift_reliable`` switch keeps the light shifts' x_i in double and makes reliable updates
  of the base system (:class:`MixedMultishift`, docs/conventions.md 3.2).
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from .cg import (InverseOperator, SolverBreakdownError, SolverConvergenceError, SolverStats, _FL_AXPY,
                 _FL_CG_ITER, _FL_NORM, _FL_SHIFT_ITER, _fail_message, _require_hermitian, _sync_time, cg,
                 mixed_precision)
from .krylov_graph import graph_iterations, multishift_iterations, ratio_squared
from .operator import Operator, fused_blas, norm2, norm2_and_redot


class ShiftInverse:
    """The inverses of A + sigma_i for the shifts of one inverter: ``xs = inv(b)``; ``xs, stats = inv.solve(b)``,
    the solutions in the order of ``shifts`` and one :class:`SolverStats` (``shifts``, ``residuals``,
    ``true_residuals`` per shift). ``inv.space`` is A's field space (the source must be one of its vectors);
    ``inv.stats``, ``inv.history`` as for :class:`InverseOperator`. Subclasses implement ``_solve(b, guesses)``."""

    def __init__(self, op, shifts, name: str):
        self.op = op
        self.geom, self.dtype = op.geom, op.dtype
        self.shifts = tuple(float(s) for s in shifts)
        if not self.shifts:
            raise ValueError(f"{name} needs at least one shift")
        self.name = name
        self.stats: SolverStats | None = None
        self.history: deque = deque(maxlen=InverseOperator.HISTORY)

    @property
    def space(self):
        return self.op.space

    def __call__(self, b):
        return self.solve(b)[0]

    def operators(self) -> list[Operator]:
        """The shifted operators A + sigma_i."""
        return [self.op.shifted(s) for s in self.shifts]

    def solve(self, b, guesses=None, check: bool = True):
        """(xs, stats) for the source ``b``; ``guesses``: one initial guess per shift, for the inverters that take
        them (:func:`multi_shift`); ``check=False``: ``b`` is known to be a vector of the space (a composite's
        inner solve)."""
        if check:
            self.space.check(b, f"{self.name}: the source")
        if guesses is not None and len(guesses) != len(self.shifts):
            raise ValueError(f"{self.name}: {len(guesses)} initial guesses for {len(self.shifts)} shifts")
        xs, st = self._solve(b, guesses)
        self.stats = st
        self.history.append(st)
        return xs, st

    def _solve(self, b, guesses):  # pragma: no cover - abstract
        raise NotImplementedError


class MultishiftInverse(ShiftInverse):
    """The multishift CG of (A + sigma_i) x_i = b from zero (:func:`multishift_cg`); with ``inner_dtype`` (the
    mixed-precision first stage of :meth:`MultishiftCG.mixed_precision` under the ``multishift_reliable`` switch) the
    Krylov vectors in ``inner_dtype``, the solutions x_i in A's precision and, with ``delta`` > 0, reliable updates
    of the base system (:meth:`_MultishiftRun.reliable_update`)."""

    def __init__(self, op, shifts, tol, maxiter, raise_on_fail, check_residual, inner_dtype=None, delta=0.0):
        _require_hermitian(op, "multishift_cg")
        super().__init__(op, shifts, "multishift_cg")
        if not tol > 0:
            raise ValueError(f"tol must be positive, not {tol}")
        self.tol, self.maxiter = float(tol), int(maxiter)
        self.raise_on_fail, self.check_residual = bool(raise_on_fail), bool(check_residual)
        self.inner_dtype = None if inner_dtype is None or np.dtype(inner_dtype) == op.dtype else np.dtype(inner_dtype)
        if self.inner_dtype is not None:
            op.converted(self.inner_dtype)           # fail now, not at the first solve, if it cannot be converted
        self.delta = float(delta) if self.inner_dtype is not None else 0.0
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must lie in [0, 1), not {delta}")
        self.name = "multishift CG"

    @property
    def inner_op(self) -> Operator:
        """The operator of the Krylov iteration, converted at each solve (so that it follows link updates)."""
        return self.op if self.inner_dtype is None else self.op.converted(self.inner_dtype)

    def _solve(self, b, guesses):
        if guesses is not None:
            raise ValueError("multishift CG starts from zero (one Krylov space for all shifts): refine from "
                             "guesses with multi_shift(cg(tol), shifts)")
        run = _MultishiftRun(self, b)
        if run.bb == 0.0:
            return run.trivial()
        run.start()
        iters = graph_iterations(run.Ak, run.blas) if run.g > run.stop and run.k < self.maxiter else 0
        run.st.extra["graph_iterations"] = iters
        while True:
            while run.g > run.stop and run.k < self.maxiter:
                if run.reliable_due():
                    run.reliable_update()
                if iters and not run.restart:
                    multishift_iterations(run, iters)      # on the device until converged or an update is due
                else:
                    run.iterate()          # (a restarted step, after a reliable update, on the host)
            if not run.continues():
                return run.finish()


class _MultishiftRun:
    """The state of one multishift solve: the base system's r, p, s = (A + s0) p, w = (A + s0) r, g = |r|^2 and
    d = Re<r, w>; per shift its solution x_i, direction p_i and zeta_k, zeta_{k-1} (Jegerlehner's recurrences).
    ``A`` is the Krylov iteration's operator, ``Ao`` the solve's (the same one unless the inverter has an
    ``inner_dtype``): the x_i live in ``Ao``'s precision, r, p, s, w and the p_i in ``A``'s. On the fused path the
    vectors are in the layout of the fused kernels (``blas.compact``: parity-compact, the source gathered at the
    start and the solutions scattered at the end, ``Ak`` = ``A.compact()``; else full-lattice, ``Ak`` = ``A``)."""

    def __init__(self, inv, b):
        self.inv = inv
        self.Ao = inv.op
        A = self.A = inv.inner_op
        self.mixed = A is not self.Ao
        self.geom, self.xp = A.geom, A.xp
        shifts = self.shifts = inv.shifts
        self.n = len(shifts)
        self.j0 = int(np.argmin(shifts))
        self.s0 = shifts[self.j0]
        self.rel = [s - self.s0 for s in shifts]           # shifts relative to the base system A + s0
        precision = f"{A.precision}/{self.Ao.precision}" if self.mixed else A.precision
        self.st = SolverStats(inv.name, inv.tol, precision=precision, maxiter=inv.maxiter, shifts=shifts)
        self.t0 = time.perf_counter()
        self.b_outer = self.xp.asarray(b).astype(self.Ao.dtype, copy=False)
        self.b = self.b_outer.astype(A.dtype, copy=False)
        self.bb = norm2(self.geom, self.b_outer)
        self.delta2 = inv.delta ** 2
        self.updates = 0              # reliable updates made
        self.w = None                 # w = (A + s0) r
        self.restart = False          # the next step starts the directions afresh (after a reliable update)

    def trivial(self):
        st, n = self.st, self.n
        st.converged, st.true_residual = True, 0.0
        st.residuals, st.true_residuals = [0.0] * n, [0.0] * n
        st.time = _sync_time(self.geom, self.t0)
        return [self.Ao.space.zeros() for _ in range(n)], st

    def start(self):
        b, n = self.b, self.n
        self.stop = self.inv.tol ** 2 * self.bb
        blas = self.blas = fused_blas(self.A, b, compact=True)       # fused GPU kernels, or None
        self.st.extra["fused"] = blas is not None
        self.compact = blas is not None and blas.compact
        self.st.extra["compact"] = self.compact
        self.Ak = self.A.compact() if self.compact else self.A      # the operator on the Krylov vectors' layout
        self.r = (b if blas is None else blas.gather(b)).copy()
        self.w, self.g, self.d = self._residual_sums(self.r)
        self.rmax2 = self.g
        self.matvecs = 1
        if blas is None:
            self.xs = [self.Ao.space.converted(self._solution_dtype(i)).zeros() for i in range(n)]
        else:
            self.xs = [blas.zeros(self._solution_dtype(i)) for i in range(n)]
        self.ps_i = [None] * n if blas is None else [blas.zeros() for _ in range(n)]
        self.z = [1.0] * n            # zeta_k
        self.z_prev = [1.0] * n       # zeta_{k-1}
        self.alpha_prev = 1.0
        self.g_old = 1.0
        self.p = None
        self.s = None if blas is None else blas.zeros()
        self.k = 0

    def _solution_dtype(self, i):
        """x_i's precision: the solve's (``Ao``'s) for the base shift (its reliable updates start from x_0) and for
        the shifts where rounding x_i to the Krylov precision could cost :data:`SINGLE_X_ROUNDING` of the tolerance,
        eps |(A + sigma_i) x_i| / |b| <~ eps (lam + sigma_i - s0) / sigma_i with lam = d / g = <b, (A + s0) b> /
        |b|^2 (the source's Rayleigh quotient, from the first reduction) and eps the Krylov precision's unit
        roundoff (docs/conventions.md 3.2); the others keep the Krylov precision (their update moves fewer bytes)."""
        if not self.mixed:
            return self.A.dtype
        sigma = self.shifts[i]
        eps = float(np.finfo(np.dtype(self.A.dtype).char.lower()).eps) / 2
        light = i == self.j0 or sigma <= 0.0 or eps * (self.d / self.g + self.rel[i]) / sigma > SINGLE_X_ROUNDING * self.inv.tol
        return self.Ao.dtype if light else self.A.dtype

    def _base(self, v):
        w = self.A(v)
        if self.s0 != 0.0:
            w += self.s0 * v
        return w

    def _residual_sums(self, r):
        """w = (A + s0) r and (|r|^2, Re<r, w>)."""
        if self.blas is None:
            w = self._base(r)
            return (w,) + norm2_and_redot(self.geom, r, w)
        w = self.w
        if w is not None and self._w_in_place():
            self.Ak.apply_into(r, w)          # in place: the device iterations captured w's address
        else:
            w = self.Ak(r)
        return (w,) + self.blas.norm2_redot(r, w, shift=self.s0)     # w += s0 r folded into the reduction

    def _w_in_place(self) -> bool:
        """Whether w = A r may overwrite the last w: ``apply_into`` writes every site the kernels touch (an
        even-odd operator leaves the other parity alone, which the kernels then do not touch either; over every
        site the shift folded into w there would stay)."""
        return hasattr(self.Ak, "apply_into") and (self.blas.parity is not None
                                                    or getattr(self.Ak, "parity", None) not in (0, 1))

    def reliable_due(self) -> bool:
        """|r|^2 has dropped by delta^2 since the last update (never without ``delta``)."""
        return self.g < self.delta2 * self.rmax2

    def continues(self) -> bool:
        """With reliable updates, the stop on the iterated residual checked on the true one: a last update, and
        True (iterate on from it) when the true base residual still exceeds the tolerance."""
        if self.delta2 == 0.0 or self.k >= self.inv.maxiter or self.g > self.stop:
            return False
        self.reliable_update()
        return self.g > self.stop

    def reliable_update(self):
        """A reliable update of the base system, as QUDA's multishift CG makes them (lib/inv_multi_cg_quda.cpp):
        r = b - (A_o + s0) x_0 in the solve's precision, cast to the Krylov one, the zetas kept (every shifted
        residual taken as zeta_i r). Then, where QUDA makes the directions orthogonal to the new r again, the next
        step restarts them, p = r, s = w, p_i = zeta_i r (beta = 0: Jegerlehner's recurrences hold for any
        beta, zeta_{k+1} = zeta_k / (1 + (sigma_i - s0) alpha) for this one): the one-reduction p^dag A p =
        d - beta g / alpha_old needs the conjugacy of successive directions that an update breaks: with QUDA's
        orthogonalisation instead it drifted into a breakdown in single precision on the 8^4 test operator."""
        x0, r = self.xs[self.j0], self.r
        if self.compact:
            x0 = self.blas.scatter(x0)
        true = self.b_outer - self.Ao(x0)
        if self.s0 != 0.0:
            true -= self.s0 * x0
        r[...] = self.blas.gather(true) if self.compact else true
        self.w, self.g, self.d = self._residual_sums(r)
        self.restart = True
        self.rmax2 = self.g
        self.updates += 1
        self.matvecs += 1
        self.st.extra["outer_matvecs"] = self.st.extra.get("outer_matvecs", 0) + 1

    def iterate(self):
        """One iteration of the base CG and of every shifted system."""
        blas, g, k = self.blas, self.g, self.k
        fresh, self.restart = k == 0 or self.restart, False
        # (the fused path leaves out p, which nothing reads, and updates s in multishift_update)
        if fresh:
            beta = 0.0
            if blas is None:
                self.p, self.s = self.r.copy(), self.w.copy()
            pap = self.d
        else:
            beta = g / self.g_old
            if blas is None:
                self.p *= beta
                self.p += self.r
                self.s *= beta
                self.s += self.w
            pap = self.d - beta * g / self.alpha_prev
        if not pap > 0 or not math.isfinite(pap):
            self.breakdown(k, g, pap)
        alpha = g / pap
        coefs = self._shift_updates(alpha, beta, fresh)
        if blas is None:
            self.r -= alpha * self.s
        else:
            blas.multishift_update(self.s, self.r, self.w, self.ps_i, self.xs, coefs, alpha, beta, fresh=fresh)
        self.k += 1
        self.matvecs += 1
        self.g_old, self.alpha_prev = g, alpha
        self.w, self.g, self.d = self._residual_sums(self.r)
        if not math.isfinite(self.g):
            self.nonfinite()
        self.rmax2 = max(self.rmax2, self.g)

    def breakdown(self, k, g, pap):
        """Raise the breakdown error of a non-positive or non-finite p^dag A p at iteration k (residual g)."""
        self.st.iters, self.st.residual = k, math.sqrt(g / self.bb)
        raise SolverBreakdownError(f"{self.inv.name} broke down at iteration {k}: p^dag A p = {pap:.3e}", self.st)

    def nonfinite(self):
        raise SolverBreakdownError(f"{self.inv.name}: non-finite residual at iteration {self.k}", self.st)

    def _shift_updates(self, alpha, beta, fresh=None):
        """Jegerlehner's zeta_{k+1}, alpha_i, beta_i from the base alpha and beta (``fresh``: p_i = zeta_i r; None:
        at k = 0). On the NumPy path p_i and x_i are updated here; the fused path gets the (zeta_i, alpha_i, beta_i)
        per shift for its update kernel."""
        z, z_prev, r = self.z, self.z_prev, self.r
        fresh = self.k == 0 if fresh is None else fresh
        coefs = [None] * self.n
        for i in range(self.n):
            zi, zp = z[i], z_prev[i]
            if zi == 0.0:
                z_prev[i], z[i] = 0.0, 0.0
                continue
            den = alpha * beta * (zp - zi) + zp * self.alpha_prev * (1.0 + self.rel[i] * alpha)
            zn = zi * zp * self.alpha_prev / den if den != 0.0 else 0.0
            ai = alpha * zn / zi
            bi = 0.0 if fresh else beta * ratio_squared(zi, zp, self.blas is not None)
            if self.blas is not None:
                coefs[i] = (zi, ai, bi)
            else:
                if fresh:
                    self.ps_i[i] = zi * r          # = r at k = 0
                else:
                    self.ps_i[i] *= bi
                    self.ps_i[i] += zi * r
                p, x = self.ps_i[i], self.xs[i]
                x += ai * (p.astype(x.dtype) if x.dtype != p.dtype else p)      # x_i in double: p_i widened
            z_prev[i], z[i] = zi, zn
        return coefs

    def finish(self):
        st, A, k = self.st, self.A, self.k
        if self.compact:
            self.xs = [self.blas.scatter(x) for x in self.xs]
        numbers = A.sites * A.space.site_size           # complex numbers per field, for the flop counts
        st.converged = self.g <= self.stop
        st.iters, st.milc_iters, st.matvecs = k, k + 1, self.matvecs
        st.residual = math.sqrt(self.g / self.bb)
        st.residuals = [abs(zi) * st.residual for zi in self.z]
        shift_flops = A.flops + (_FL_AXPY if self.s0 else 0) * numbers
        st.flops = (self.matvecs * shift_flops + k * (_FL_CG_ITER + self.n * _FL_SHIFT_ITER) * numbers
                    + self.updates * (self.Ao.flops + (_FL_AXPY + _FL_NORM) * numbers))
        st.extra["reliable_updates"] = self.updates
        st.time = _sync_time(self.geom, self.t0)
        if self.inv.check_residual:
            trs = []
            for sig, x in zip(self.shifts, self.xs):
                x = x.astype(self.Ao.dtype, copy=False)      # (a heavy shift's x_i may be in the Krylov precision)
                rx = self.Ao(x)
                rx += sig * x
                trs.append(math.sqrt(norm2(self.geom, self.b_outer - rx) / self.bb))
            st.true_residuals = trs
            st.true_residual = trs[self.j0]
        if not st.converged and self.inv.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st) + f" (base shift {self.s0:g} of {self.shifts})", st,
                                         self.xs)
        return self.xs, st


@dataclass(frozen=True)
class MultishiftCG:
    """The multishift CG as an operator -> :class:`MultishiftInverse` factory (made by :func:`multishift_cg`)."""

    shifts: tuple
    tol: float = 1e-10
    maxiter: int = 10000
    raise_on_fail: bool = True
    check_residual: bool = True
    inner_dtype: object = None       # the Krylov vectors' precision (None: the operator's); x_i in the operator's
    delta: float = 0.0               # with inner_dtype: a reliable update at each drop of |r| by delta (0: none)

    def __call__(self, op) -> MultishiftInverse:
        return MultishiftInverse(op, self.shifts, self.tol, self.maxiter, self.raise_on_fail, self.check_residual,
                                 self.inner_dtype, self.delta)

    def mixed_precision(self, dtype=np.complex64, floor: float | None = None, refine_maxiter: int | None = None,
                        accumulate: bool | None = None):
        """The multishift in ``dtype`` to max(tol, ``floor``) (default :data:`SINGLE_PRECISION_FLOOR`), then every
        shift refined to tol by a mixed-precision CG (``refine_maxiter``, default maxiter, iterations each).
        ``accumulate`` (None: the run configuration's ``multishift_reliable``): the first stage keeps its x_i in
        the operator's precision and makes reliable updates of the base system (:data:`RELIABLE_DELTA`), else it
        runs wholly on the operator converted to ``dtype`` (:class:`MixedMultishift`)."""
        floor = SINGLE_PRECISION_FLOOR if floor is None else float(floor)
        cap = self.maxiter if refine_maxiter is None else int(refine_maxiter)
        first = replace(self, tol=max(float(self.tol), floor), raise_on_fail=False, check_residual=False)
        then = mixed_precision(cg(self.tol, cap, raise_on_fail=False), dtype)
        return MixedMultishift(first, then, np.dtype(dtype), self.raise_on_fail, accumulate)


def multishift_cg(shifts, tol: float = 1e-10, maxiter: int = 10000, raise_on_fail: bool = True,
                  check_residual: bool = True) -> MultishiftCG:
    """``multishift_cg(shifts, tol)(A)(b)`` = [(A + s)^-1 b for s in shifts], A Hermitian positive.

    MILC's rule: all shifts are updated every iteration and the solver stops when the smallest shift has
    |r|^2 <= tol^2 |b|^2 (the others are then more accurate). ``check_residual`` recomputes every true residual
    afterwards (one extra product per shift; turn it off inside HMC).
    """
    return MultishiftCG(tuple(shifts), tol, maxiter, raise_on_fail, check_residual)


def _summed(solves, *counts) -> dict:
    """{count: its sum over the :class:`SolverStats` ``solves``} (the shift-by-shift and refined stats)."""
    return {c: sum(getattr(r, c) for r in solves) for c in counts}


class ShiftByShift(ShiftInverse):
    """(A + sigma_i) x_i = b solved one shift at a time by a single-shift inverter, each from its initial guess
    (:func:`multi_shift`). ``stats``: the sums of the solves' counts, time and flops, the per-shift residuals, and
    the solves' own statistics in ``extra["solves"]``."""

    def __init__(self, op, shifts, inverter, raise_on_fail):
        super().__init__(op, shifts, "multi_shift")
        self.inverter, self.raise_on_fail = inverter, bool(raise_on_fail)

    def _solve(self, b, guesses):
        xs, solves = [], []
        for s, x0 in zip(self.shifts, guesses if guesses is not None else [None] * len(self.shifts)):
            x, st = self.inverter(self.op.shifted(s)).solve(b, x0, check=False)
            xs.append(x)
            solves.append(st)
        trs = [r.true_residual for r in solves]
        st = SolverStats(f"multi_shift[{solves[0].solver}]", max(r.tol for r in solves),
                         converged=all(r.converged for r in solves), residual=max(r.residual for r in solves),
                         true_residual=None if None in trs else max(trs), precision=solves[0].precision,
                         maxiter=max(r.maxiter for r in solves), shifts=self.shifts,
                         residuals=[r.residual for r in solves], true_residuals=trs,
                         **_summed(solves, "iters", "milc_iters", "matvecs", "restarts", "time", "flops"))
        st.extra["solves"] = solves
        if not st.converged and self.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st) + " (multi_shift: one solve per shift)", st, xs)
        return xs, st


@dataclass(frozen=True)
class MultiShift:
    """The factory of :func:`multi_shift`."""

    inverter: object
    shifts: tuple
    raise_on_fail: bool = True

    def __call__(self, op) -> ShiftByShift:
        return ShiftByShift(op, self.shifts, self.inverter, self.raise_on_fail)


def multi_shift(inverter, shifts, raise_on_fail: bool = True) -> MultiShift:
    """``multi_shift(cg(tol), shifts)(A)(b)`` = [(A + s)^-1 b for s in shifts], one solve per shift with the
    single-shift inverter factory ``inverter``; ``inv.solve(b, guesses)`` starts shift i from ``guesses[i]``."""
    return MultiShift(inverter, tuple(float(s) for s in shifts), raise_on_fail)


class RefinedShiftInverse(ShiftInverse):
    """A shift inverter on ``sloppy(op)`` (or ``op``), then every shift refined in turn by a single-shift inverter on
    ``op`` + s_i started from the first solution (:func:`refined`). MILC's ``KS_MULTICG=HYBRID``
    (``generic_ks/ks_multicg.c``, ``ks_multicg_hybrid``): the multishift CG, then a CG with the same tolerance and
    MILC's true-residual rule (:class:`solvers.cg.CGInverse`). ``stats`` is the first stage's, with the refined
    true residuals, the refinements' time, flops and products added, ``extra["refine"]`` (one
    :class:`SolverStats` per shift) and ``extra["refine_milc_iters"]``; the refinement runs only when the first
    stage converged."""

    def __init__(self, op, first, then, sloppy, raise_on_fail, name):
        _require_hermitian(op, name)
        self.multishift = first(op if sloppy is None else sloppy(op))
        super().__init__(op, self.multishift.shifts, name)
        self.refine = ShiftByShift(op, self.shifts, then, raise_on_fail=False)
        self.raise_on_fail = bool(raise_on_fail)

    def _solve(self, b, guesses):
        if guesses is not None:
            raise ValueError(f"{self.name} starts its first stage from zero: it takes no initial guesses")
        xs, st = self.multishift.solve(b, check=False)
        st.solver = self.name
        refine = []
        if st.converged:
            xs, rst = self.refine.solve(b, xs, check=False)
            refine = rst.extra["solves"]
            st.converged = all(r.converged for r in refine)
            st.true_residuals = [r.true_residual for r in refine]
            st.true_residual = max(st.true_residuals)
            for key, total in _summed(refine, "time", "flops", "matvecs").items():
                setattr(st, key, getattr(st, key) + total)
        st.extra["refine"] = refine
        st.extra["refine_milc_iters"] = _summed(refine, "milc_iters")["milc_iters"]
        if not st.converged and self.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st) + f" ({self.name}: a shift inverter, then one refinement "
                                         "per shift)", st, xs)
        return xs, st


@dataclass(frozen=True)
class Refined:
    """The factory of :func:`refined`."""

    first: object
    then: object
    sloppy: object = None
    raise_on_fail: bool = True
    name: str = "refined multishift CG"

    def __call__(self, op) -> RefinedShiftInverse:
        return RefinedShiftInverse(op, self.first, self.then, self.sloppy, self.raise_on_fail, self.name)


#: the mixed first stage keeps a shift's x_i in single precision where its rounding costs at most this fraction of
#: the tolerance (:meth:`_MultishiftRun._solution_dtype`); the base shift's is always double. Default inf: the
#: base shift's alone. 0.1 put the six lightest of the 9 shifts of tools/profile_md_solve.py in double on the 8^4
#: operator, for 378 refinement iterations against 384 with the base shift's alone: the other shifts' residuals are
#: limited by the single-precision Krylov vectors, not by their x_i, and each double x_i adds 16 of the update's
#: ~330 bytes per number.
SINGLE_X_ROUNDING = math.inf

#: the reliable-update threshold of the mixed-precision multishift's first stage: each update restarts the directions,
#: and on the 6^4 test operator 0.01 cost 4 % more multishift iterations for 58 % fewer refinement ones, 0.1 17 % for
#: 65 % (tools/profile_md_solve.py)
RELIABLE_DELTA = 0.01


@dataclass(frozen=True)
class MixedMultishift:
    """The factory of :meth:`MultishiftCG.mixed_precision`: :func:`refined` with the first stage ``first`` either
    on the operator converted to ``dtype`` (all of it in single precision: the x_i rounded to it, whose rounding,
    amplified by 1/sigma_i, the refinement then has to remove), or, with ``accumulate`` (None: the operator's run
    configuration, ``multishift_reliable`` / HMC_MULTISHIFT_RELIABLE), on the operator itself with its Krylov
    vectors in ``dtype``, the x_i in the operator's precision and reliable updates of the base system."""

    first: MultishiftCG
    then: object
    dtype: object
    raise_on_fail: bool = True
    accumulate: bool | None = None

    def __call__(self, op) -> RefinedShiftInverse:
        on = op.geom.config.multishift_reliable if self.accumulate is None else self.accumulate
        if on:
            first, sloppy = replace(self.first, inner_dtype=self.dtype, delta=RELIABLE_DELTA), None
        else:
            first, sloppy = self.first, _Converted(self.dtype)
        return refined(first, self.then, sloppy=sloppy, raise_on_fail=self.raise_on_fail,
                       name="mixed-precision multishift CG")(op)


@dataclass(frozen=True)
class _Converted:
    """op -> op.converted(dtype): the sloppy operator of a mixed-precision first stage."""

    dtype: object

    def __call__(self, op):
        return op.converted(self.dtype)


def refined(first, then, sloppy=None, raise_on_fail: bool = True, name: str = "refined multishift CG") -> Refined:
    """``refined(multishift_cg(shifts, tol), cg(tol))(A)``: the shift inverter factory ``first`` on ``sloppy(A)``
    (default A itself; e.g. the links of another Naik epsilon, or A in single precision), then every shift refined on
    A + s_i by the single-shift inverter factory ``then`` from the first stage's solution (:class:`RefinedShiftInverse`)."""
    return Refined(first, then, sloppy, raise_on_fail, name)


def hybrid_multishift_cg(shifts, tol: float = 1e-10, maxiter: int = 10000, refine_maxiter: int | None = None,
                         raise_on_fail: bool = True):
    """``hybrid_multishift_cg(shifts, tol)(A0, A)(b)`` = [(A + s)^-1 b for s in shifts] by MILC's HYBRID scheme, i.e.
    ``refined(multishift_cg(shifts, tol), cg(tol), sloppy=A -> A0)(A)``:

    1. the multishift CG (:func:`multishift_cg`, MILC's stopping rule) of (A0 + s_i) x_i = b, zero start;
    2. for each shift in order, CG on (A + s_i) y_i = b from y_i = x_i until |b - (A + s_i) y_i| <= tol |b|
       (MILC's ``ks_congrad``: the true residual is checked first, so a shift that already meets it costs one
       product and is returned unchanged).

    A0 = A reproduces MILC's 2009 builds; MILC's later builds (``ks_multicg_hybrid_field``: "first we invert as though
    all masses took the same Naik epsilon, then we refine using the correct Naik epsilon") pass the links of the first
    Naik epsilon as A0. ``refine_maxiter`` (default ``maxiter``) caps each refinement; ``stats`` as for
    :class:`RefinedShiftInverse`."""
    cap = maxiter if refine_maxiter is None else refine_maxiter
    first = multishift_cg(shifts, tol, maxiter, raise_on_fail=False, check_residual=False)
    then = cg(tol, cap, raise_on_fail=False)
    return lambda op0, op: refined(first, then, sloppy=lambda _: op0, raise_on_fail=raise_on_fail,
                                   name="hybrid multishift CG")(op)


#: the single-precision multishift's tolerance floor: below it the iterated residual of a complex64 CG no longer
#: follows the true one (rounding of the recurrences), so the double-precision refinement takes over from here
SINGLE_PRECISION_FLOOR = 1e-6


def mixed_multishift_cg(shifts, tol: float = 1e-10, maxiter: int = 10000, refine_maxiter: int | None = None,
                        raise_on_fail: bool = True, inner_dtype=np.complex64, inner_floor=SINGLE_PRECISION_FLOOR):
    """``mixed_multishift_cg(shifts, tol)(A)(b)`` = [(A + s)^-1 b for s in shifts] to the same double-precision true
    residual as :func:`multishift_cg`, with the Krylov work in ``inner_dtype`` (MILC's ``cgprec`` 1, QUDA's sloppy
    multishift followed by a refinement of every shift); ``mixed_precision(multishift_cg(shifts, tol))``:

    1. the multishift CG of (A + s_i) x_i = b with A converted to ``inner_dtype``, to max(tol, inner_floor) on the
       base shift's iterated residual (MILC's rule);
    2. for each shift, the double-precision true residual |b - (A + s_i) x_i| checked (one product) and, where it
       exceeds tol |b|, a mixed-precision CG (:func:`solvers.cg.mixed_cg`'s iteration: ``inner_dtype`` Krylov steps,
       double reliable updates) from x_i until it does.

    The answer meets the tolerance of a double-precision solve, so the MD stays reversible to that tolerance; it is
    not bitwise the double-precision answer. ``stats`` as for :func:`hybrid_multishift_cg`."""
    return mixed_precision(multishift_cg(shifts, tol, maxiter, raise_on_fail), inner_dtype, floor=inner_floor,
                           refine_maxiter=refine_maxiter)
