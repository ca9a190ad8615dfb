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

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from .cg import (InverseOperator, SolverConvergenceError, SolverStats, _fail_message, _require_hermitian, cg,
                 mixed_precision)
from .krylov_graph import graph_iterations, multishift_iterations
from .multishift_run import _MultishiftRun
from .operator import Operator, add_shift, norm2_many


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

    def __init__(self, op, shifts, tol, maxiter, raise_on_fail, check_residual, inner_dtype=None, delta=0.0,
                 stop_converged=False):
        _require_hermitian(op, "multishift_cg")
        super().__init__(op, shifts, "multishift_cg")
        if not tol > 0:
            raise ValueError(f"tol must be positive, not {tol}")
        self.tol, self.maxiter = float(tol), int(maxiter)
        self.raise_on_fail, self.check_residual = bool(raise_on_fail), bool(check_residual)
        self.inner_dtype = None if inner_dtype is None or np.dtype(inner_dtype) == op.dtype else np.dtype(inner_dtype)
        if self.inner_dtype is not None:
            op.converted(self.inner_dtype)           # fail now, not at the first solve, if it cannot be converted
        self.stop_converged = bool(stop_converged)
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
    stop_converged: bool = False     # shifts stop at multishift_run.SHIFT_STOP_MARGIN x tol (QUDA)

    def __call__(self, op) -> MultishiftInverse:
        return MultishiftInverse(op, self.shifts, self.tol, self.maxiter, self.raise_on_fail, self.check_residual,
                                 self.inner_dtype, self.delta, self.stop_converged)

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
                  check_residual: bool = True, stop_converged: bool = False) -> MultishiftCG:
    """``multishift_cg(shifts, tol)(A)(b)`` = [(A + s)^-1 b for s in shifts], A Hermitian positive.

    MILC's rule: all shifts are updated every iteration and the solver stops when the smallest shift has
    |r|^2 <= tol^2 |b|^2 (the others are then more accurate). ``check_residual`` recomputes every true residual
    afterwards (one extra product per shift; turn it off inside HMC). ``stop_converged`` (QUDA's rule, the deck's
    ``[fermions] stop_converged_shifts``): shift i is no longer updated once its residual zeta_i |r| is
    :data:`solvers.multishift_run.SHIFT_STOP_MARGIN` x tol |b| (heavy shifts get there long before the base one), so an iteration moves
    the vectors of the shifts still running only; each stopped x_i keeps that residual.
    """
    return MultishiftCG(tuple(shifts), tol, maxiter, raise_on_fail, check_residual, stop_converged=stop_converged)




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

    def solve_from_residuals(self, b, guesses, residuals):
        """:meth:`solve` from ``guesses`` (in the operator's precision, used in place) whose true residuals
        b - (A + s_i) x_i are ``residuals`` (:func:`true_residuals`): the same solves, each from its residual where
        the single-shift inverter takes one (``solve_from_residual``), one product fewer per shift, and |b|^2 and
        every |r_i|^2 from one reduction (:func:`solvers.operator.norm2_many`: one host synchronisation on a GPU
        instead of two a shift; the same numbers)."""
        xs, st = self._solve(b, guesses, residuals)
        self.stats = st
        self.history.append(st)
        return xs, st

    def _solve(self, b, guesses, residuals=None):
        xs, solves = [], []
        n = len(self.shifts)
        norms = None
        if residuals is not None:
            xp = self.op.xp
            bb, *rrs = norm2_many(self.geom, [xp.asarray(b).astype(self.op.dtype, copy=False)] + list(residuals))
            norms = [(bb, rr) for rr in rrs]
        for i, (s, x0) in enumerate(zip(self.shifts, guesses if guesses is not None else [None] * n)):
            inv = self.inverter(self.op.shifted(s))
            if residuals is not None and hasattr(inv, "solve_from_residual"):
                x, st = inv.solve_from_residual(b, x0, residuals[i], norms[i])
            else:
                x, st = inv.solve(b, x0, check=False)
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


def true_residuals(op, b, xs, shifts) -> tuple[list, list]:
    """(x_i in ``op``'s precision, r_i = b - (op + s_i) x_i): the refinement's starting residuals, the products of all
    shifts made together (:meth:`solvers.operator.Operator.apply_many`: with ``batched_hops`` on one GPU, each hop's
    links read once for up to 4 fields) and shifted as :class:`solvers.operator.ShiftedOperator` shifts
    (:func:`solvers.operator.add_shift`), so each shift's CG starts where it would from x_i alone."""
    xp = op.xp
    bd = xp.asarray(b).astype(op.dtype, copy=False)
    xds = [xp.asarray(x).astype(op.dtype, copy=True) for x in xs]
    return xds, [bd - add_shift(out, x, s) for out, x, s in zip(op.apply_many(xds), xds, shifts)]


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
            xs, rs = true_residuals(self.op, b, xs, self.shifts)
            xs, rst = self.refine.solve_from_residuals(b, xs, rs)
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
