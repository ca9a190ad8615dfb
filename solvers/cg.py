"""Conjugate gradient solvers, composed as in gpt: ``inv = cg(tol=1e-10, maxiter=1000)(A)`` is an operator with
``x = inv(b)``; ``x, stats = inv.solve(b)`` also gives the :class:`SolverStats`.

* :func:`cg`: CG on a Hermitian positive operator, MILC's stopping rule |r|^2 <= tol^2 |b|^2, checked on the true
  residual b - A x (recomputed when the iterated residual has converged; if the true one has not, CG restarts from
  it, as MILC's ``ks_congrad_parity``).
* :func:`mixed_cg`: the same with the Krylov iteration in single precision and reliable updates: the solution is
  accumulated in double precision and the true double-precision residual replaces the iterated one whenever the
  latter has dropped by ``delta`` since the last update, and at the end. It stops on the true double residual.
* :func:`solvers.multishift.multishift_cg` and :func:`solvers.multishift.hybrid_multishift_cg`: the multishift
  solvers, which share this module's statistics, errors and Chronopoulos-Gear iteration.
* :func:`solvers.even_odd.even_odd_inverse`: M^-1 from an inverse of the even-site normal operator plus odd-site
  reconstruction.

One global reduction per iteration. :func:`cg` and :func:`multishift_cg` use the Chronopoulos-Gear form of CG
(Chronopoulos & Gear, J. Comput. Appl. Math. 25 (1989) 153): the operator is applied to the residual r, and |r|^2
and Re<r, A r> are summed in the same ``geom.sum`` call, which is the only conversion to a Python number (the only
host synchronisation on a GPU) per iteration. In exact arithmetic it produces the same iterates, alpha, beta and
residuals as Hestenes-Stiefel CG (MILC's), so MILC's iteration counts and stopping points are kept; the price is
one extra vector update per iteration (s = A p by recurrence) and one extra operator application per solve.
In double precision it converged like Hestenes-Stiefel down to m = 0.001 on Haar-random 4^4 links (636 against
637 iterations). The single-precision inner iteration of :func:`mixed_cg` uses Hestenes-Stiefel (two reductions
per iteration) by default, because there the recurrence p^dag A p = Re<r, A r> - beta |r|^2 / alpha_old cancels
badly on ill-conditioned systems. ``single_reduction`` selects either form in :func:`cg` and :func:`mixed_cg`.
How the reductions are summed (fast, or exact and decomposition-independent) is set in :mod:`solvers.operator`.

GPU: when the whole lattice lives on one GPU, :func:`solvers.operator.fused_blas` gives each solve a set of fused
kernels (:mod:`solvers.blas_cuda`) that replace the vector updates and reductions of the Krylov iteration with the
same arithmetic: a Chronopoulos-Gear iteration is one update kernel (p, s, x, r), the operator, and one reduction
kernel for (|r|^2, Re<r, A r>) whose two numbers come back in one transfer; a Hestenes-Stiefel iteration (the
single-precision loop of :func:`mixed_cg`) is p = r + beta p, the operator, Re<p, A p>, and one kernel for x, r and
|r|^2; a multishift iteration is one kernel for s, every p_i, x_i and r, the operator, and the same reduction (with
the base shift folded in). Iterates and iteration counts are the NumPy path's to rounding (the vector updates are
bitwise the same; only the summation order of the reductions differs). The set-up, the true residuals and the
reliable updates keep the NumPy path's code. For an even-odd operator whose hop has a compact mode (one GPU) the
Krylov vectors are parity-compact (V/2, 3) arrays inside the solve (solvers.blas_cuda, docs/perf-notes.md): the
kernels then stream only the parity's bytes; the source and solutions stay full-lattice.

Iteration counts (all in :class:`SolverStats`):
* ``iters``: Krylov iterations (updates of the solution);
* ``matvecs``: operator applications, all precisions;
* ``milc_iters``: MILC's count. For CG, MILC counts every product with the operator: iters plus every computation
  of the true residual, the initial one included (MILC computes it with a product even for a zero guess), so
  iters + 2 for a solve without restarts. For the multishift CG, MILC counts the initial residual as one
  iteration: iters + 1.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from .operator import Operator, fused_blas, inner, norm2, norm2_and_redot
from . import blas_cuda  # noqa: F401  (registers the fused solver kernels for the GPU placements)
from .krylov_graph import cg_iterations, graph_iterations

# linear-algebra flops per complex number of a field (real coefficients); times op.sites * op.space.site_size
_FL_AXPY = 4           # a x + y
_FL_NORM = 4           # |a|^2 or Re<a, b>
_FL_CG_ITER = 4 * _FL_AXPY + 2 * _FL_NORM   # p, s, x, r updates + fused reduction
_FL_SHIFT_ITER = 6 + _FL_AXPY               # p_i = z r + b p_i, x_i += a p_i


class SolverConvergenceError(RuntimeError):
    """A solve that did not reach its tolerance. ``.stats`` has the numbers, ``.x`` the last iterate."""

    def __init__(self, message, stats=None, x=None):
        super().__init__(message)
        self.stats = stats
        self.x = x


class SolverBreakdownError(SolverConvergenceError):
    """CG met p^dag A p <= 0 or a non-finite number: the operator is not Hermitian positive definite."""


@dataclass
class SolverStats:
    solver: str
    tol: float
    converged: bool = False
    iters: int = 0
    milc_iters: int = 0
    matvecs: int = 0
    restarts: int = 0            # reliable updates / restarts (true residual recomputed before the final check)
    residual: float = 0.0        # final iterated relative residual |r|/|b|
    true_residual: float | None = None   # |b - A x|/|b| recomputed from x, in the outer precision
    full_residual: float | None = None   # even-odd inverse: |b - M x|/|b| of the full system
    time: float = 0.0
    flops: float = 0.0
    precision: str = "double"
    maxiter: int = 0
    shifts: tuple | None = None
    residuals: list | None = None        # multishift: estimated |r_i|/|b| per shift
    true_residuals: list | None = None   # multishift: recomputed |b - (A + s_i) x_i|/|b| per shift
    inner: "SolverStats | None" = None
    extra: dict = field(default_factory=dict)

    @property
    def gflops(self) -> float:
        return self.flops / self.time / 1e9 if self.time > 0 else 0.0

    def milc_line(self) -> str:
        """The line MILC prints after a solve: ``OK converged final_rsq= ... (cf ...) ... iters= N``."""
        rsq = (self.true_residual if self.true_residual is not None else self.residual) ** 2
        return (f" {'OK converged' if self.converged else 'NOT converged'} final_rsq= {rsq:.2g} "
                f"(cf {self.tol ** 2:.2g}) rel = 1 (cf 0) restarts = {self.restarts} iters= {self.milc_iters}")

    def __str__(self):
        tr = "" if self.true_residual is None else f", true residual {self.true_residual:.3e}"
        return (f"{self.solver} [{self.precision}]: {'converged' if self.converged else 'NOT converged'} in "
                f"{self.iters} iterations ({self.matvecs} matvecs, {self.restarts} restarts), residual "
                f"{self.residual:.3e}{tr} (tol {self.tol:.1e}), {self.time:.3g} s, {self.gflops:.3g} GFlop/s")


def _fail_message(stats: SolverStats) -> str:
    tr = "" if stats.true_residual is None else f", true residual |b - A x|/|b| = {stats.true_residual:.3e}"
    return (f"{stats.solver} did not converge: {stats.iters} iterations (maxiter {stats.maxiter}), "
            f"iterated residual |r|/|b| = {stats.residual:.3e}{tr}, wanted {stats.tol:.1e}. Raise maxiter, loosen "
            "tol, or check the operator (is it Hermitian positive? is the mass tiny?)")


def _sync_time(geom, t0) -> float:
    geom.backend.synchronize()
    return time.perf_counter() - t0


class InverseOperator(Operator):
    """The inverse of an operator as an operator: ``x = inv(b)``; ``x, stats = inv.solve(b, x0=None)``.

    ``inv.stats`` is the :class:`SolverStats` of the last solve and ``inv.history`` those of the last
    ``HISTORY`` solves.
    """

    HISTORY = 1000

    def __init__(self, op: Operator, name: str):
        super().__init__(op.geom, op.dtype, 0.0, op.sites, op.site_shape)
        self.op = op
        self.hermitian = op.hermitian
        self.name = name
        self.stats: SolverStats | None = None
        self.history: deque = deque(maxlen=self.HISTORY)

    def _space_parity(self):
        return self.op.space.parity

    def _apply(self, b):
        return self.solve(b)[0]

    def solve(self, b, x0=None, check: bool = True):
        """(x, stats) for the source ``b`` (a vector of ``self.space``: else a one-line error naming it), from the
        initial guess ``x0`` (None: zero); ``check=False``: ``b`` and ``x0`` are known to be vectors of the space (a
        composite's inner solve)."""
        if check:
            self.space.check(b, f"{self.name}: the source")
            if x0 is not None:
                self.space.check(x0, f"{self.name}: the initial guess", support=False)
        x, stats = self._solve(b, x0)
        self.stats = stats
        self.history.append(stats)
        return x, stats

    def _solve(self, b, x0):  # pragma: no cover - abstract
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------------------------
# CG and mixed-precision CG
# ----------------------------------------------------------------------------------------------------------------

def _require_hermitian(op, who):
    if not isinstance(op, Operator):
        raise TypeError(f"{who} takes an Operator (solvers.operator), got {type(op).__name__}; wrap a function in "
                        "FunctionOperator(geom, f, hermitian=True)")
    if not op.hermitian:
        raise ValueError(f"{who} needs a Hermitian positive operator, and {op.name} is not Hermitian: solve with "
                         "the normal operator (M.normal(), or the even-odd StaggeredEvenOdd.normal)")


class CGInverse(InverseOperator):
    """A^-1 by (mixed-precision) CG; made by :func:`cg` and :func:`mixed_cg`."""

    def __init__(self, op, tol, maxiter, raise_on_fail, inner_dtype=None, delta=0.0, single_reduction=True):
        _require_hermitian(op, "cg")
        if not tol > 0:
            raise ValueError(f"tol must be positive, not {tol}")
        self.tol, self.maxiter, self.raise_on_fail = float(tol), int(maxiter), bool(raise_on_fail)
        self.delta = float(delta)
        self.single_reduction = bool(single_reduction)
        self.inner_dtype = None if inner_dtype is None or np.dtype(inner_dtype) == op.dtype else np.dtype(inner_dtype)
        if self.inner_dtype is not None:
            op.converted(self.inner_dtype)           # fail now, not at the first solve, if it cannot be converted
        super().__init__(op, f"{'mixed-precision ' if self.inner_dtype is not None else ''}CG")

    @property
    def inner_op(self) -> Operator:
        """The operator of the Krylov iteration, converted at each solve (so that it follows link updates)."""
        return self.op if self.inner_dtype is None else self.op.converted(self.inner_dtype)

    def adjoint(self):
        return self

    def solve_from_residual(self, b, x0, r0, norms=None):
        """:meth:`solve` from ``x0`` (in the operator's precision, used in place) whose true residual b - A x0 is
        ``r0``, computed by the caller with the same arithmetic (the refinement's batched residuals,
        :class:`solvers.multishift.RefinedShiftInverse`): the same solve and statistics, one product fewer here.
        ``norms``: (|b|^2, |r0|^2) as :func:`solvers.operator.norm2` gives them, when the caller has them (the
        refinement takes every shift's in one reduction), else computed here."""
        x, stats = self._solve(b, x0, r0, norms)
        self.stats = stats
        self.history.append(stats)
        return x, stats

    def _solve(self, b, x0, r0=None, norms=None):
        bb, rr = norms if norms is not None else (None, None)
        run = _CGRun(self, b, bb)
        if run.trivial() or run.start(x0, r0, rr):
            return run.x, run.finish_trivial()
        iters = graph_iterations(run.Ak, run.blas) if run.one else 0
        run.st.extra["graph_iterations"] = iters
        while True:
            if run.true_residual_due() and run.true_residual_check():
                break
            if iters and not run.reliable:
                cg_iterations(run, iters)      # on the device until the stop test (solvers.krylov_graph)
            else:
                run.step(run.search_direction())
        return run.x, run.finish()


class _CGRun:
    """The state of one :class:`CGInverse` solve, split into the phases of the iteration.

    ``x`` is the solution (outer precision), ``y`` the part accumulated since the last reliable update, ``rs`` the
    iterated residual, ``ps``/``ss`` the search direction p and s = A p, ``ws`` = A r, ``g`` = |r|^2 and ``d`` =
    Re<r, A r> (Chronopoulos-Gear), all in the inner precision; ``rr`` is the last true |b - A x|^2. On the fused
    path y, rs, ps, ss and ws are in the fused kernels' layout (``blas.compact``: parity-compact, applied with
    ``Ak`` = ``Ai.compact()``; x, b and the true residuals stay full-lattice).
    """

    def __init__(self, inv, b, bb=None):
        self.inv = inv
        self.A, self.Ai = inv.op, inv.inner_op
        A, Ai = self.A, self.Ai
        self.geom, self.xp = A.geom, A.xp
        self.mixed = Ai is not A
        self.one = inv.single_reduction
        self.delta2 = inv.delta ** 2 if self.mixed else 0.0
        self.st = SolverStats(inv.name, inv.tol, maxiter=inv.maxiter,
                              precision=f"{Ai.precision}/{A.precision}" if self.mixed else A.precision)
        self.st.extra["variant"] = "Chronopoulos-Gear" if self.one else "Hestenes-Stiefel"
        self.t0 = time.perf_counter()
        self.flops = 0.0
        self.numbers = A.sites * A.space.site_size        # complex numbers per field, for the flop counts
        self.b = self.xp.asarray(b).astype(A.dtype, copy=False)
        self.bb = norm2(self.geom, self.b) if bb is None else float(bb)

    def cg_flops_per_iteration(self) -> float:
        """Linear-algebra flops of one Chronopoulos-Gear step (the operator's come on top)."""
        return _FL_CG_ITER * self.numbers

    def breakdown(self, pap: float):
        """Raise the breakdown error of a non-positive or non-finite p^dag A p at the current iteration."""
        self.st.iters, self.st.residual = self.k, math.sqrt(self.g / self.bb)
        raise SolverBreakdownError(
            f"{self.inv.name} broke down at iteration {self.k}: p^dag A p = {pap:.3e} (the operator {self.A.name} "
            "is not Hermitian positive definite, or the numbers overflowed)", self.st, self.x)

    def nonfinite(self):
        """Raise the error of a non-finite residual at the current iteration."""
        self.st.iters, self.st.residual = self.k, math.nan
        raise SolverBreakdownError(f"{self.inv.name}: non-finite residual at iteration {self.k}", self.st, self.x)

    def trivial(self) -> bool:
        """A zero source: MILC's trivial solution, zero iterations."""
        if self.bb == 0.0:
            self.st.converged, self.st.true_residual = True, 0.0
            self.x = self.A.space.zeros()
            return True
        if not math.isfinite(self.bb):
            raise SolverBreakdownError(f"{self.inv.name}: the source has a non-finite norm ({self.bb})", self.st)
        return False

    def start(self, x0, r0=None, rr=None) -> bool:
        """The initial residual (``r0``: given, b - A x0 with x0 in the operator's precision; ``rr``: its |r0|^2,
        given too) and the first reduction; True when the start already meets the tolerance."""
        A, Ai, st, xp = self.A, self.Ai, self.st, self.xp
        self.stop = self.inv.tol * self.inv.tol * self.bb
        if x0 is None:
            self.x = A.space.zeros()
            r = self.b.copy()
            self.rr = self.bb
        else:
            self.x = xp.asarray(x0).astype(A.dtype, copy=r0 is None)
            r = self.b - A(self.x) if r0 is None else r0
            st.matvecs += 1
            self.flops += A.flops + (_FL_AXPY + _FL_NORM) * self.numbers
            self.rr = norm2(self.geom, r) if rr is None or r0 is None else float(rr)
        self.n_true = 1       # true residuals computed (the initial one included, as MILC counts it)
        if self.rr <= self.stop:
            st.converged = True
            st.residual = st.true_residual = math.sqrt(self.rr / self.bb)
            st.milc_iters = self.n_true
            return True
        self.rs = r.astype(Ai.dtype) if self.mixed else r
        self.y = Ai.space.zeros()
        self.ws = self.ss = self.ps = None
        self.d = 0.0
        blas = self.blas = fused_blas(Ai, self.b, compact=True)     # fused GPU kernels for the Krylov iteration
        st.extra["fused"] = blas is not None
        self.compact = st.extra["compact"] = blas is not None and blas.compact
        self.Ak = Ai.compact() if self.compact else Ai              # the operator on the Krylov vectors' layout
        if self.compact:
            self.rs, self.y = blas.gather(self.rs), blas.zeros()
        if self.one:
            self.ws = self._apply_inner(self.rs)
            self.g, self.d = self._norm2_redot(self.rs, self.ws)
        else:
            self.g = norm2(self.geom, self.rs) if self.mixed else self.rr
        self.rmax2 = self.g
        self.fresh, self.reliable = True, False
        self.g_old = self.alpha_old = self.beta = 1.0
        self.k = 0
        return False

    def _apply_inner(self, v):
        self.st.matvecs += 1
        self.flops += self.Ai.flops
        return self.Ak(v)

    def _norm2_redot(self, u, v):
        return norm2_and_redot(self.geom, u, v) if self.blas is None else self.blas.norm2_redot(u, v)

    def true_residual_due(self) -> bool:
        """Converged iterated residual, a reliable update (mixed precision) due, or out of iterations."""
        return self.g <= self.stop or self.g < self.delta2 * self.rmax2 or self.k >= self.inv.maxiter

    def true_residual_check(self) -> bool:
        """Fold y into x and recompute b - A x; True when the solve ends. Otherwise restart from the true residual
        (MILC, when the iterated one converged first) or make a reliable update (QUDA: the search direction kept,
        made orthogonal to the new residual)."""
        A, st, geom = self.A, self.st, self.geom
        if self.k > 0:
            y = self.blas.scatter(self.y) if self.compact else self.y
            self.x += y.astype(A.dtype, copy=False) if self.mixed else y
            self.y.fill(0)
        r = self.b - A(self.x)
        self.rr = norm2(geom, r)
        st.matvecs += 1
        self.n_true += 1
        self.flops += A.flops + (2 * _FL_AXPY + _FL_NORM) * self.numbers
        if self.rr <= self.stop or self.k >= self.inv.maxiter:
            st.converged = self.rr <= self.stop
            return True
        st.restarts += 1
        if self.compact:
            r = self.blas.gather(r)
        self.rs = r.astype(self.Ai.dtype) if self.mixed else r
        if self.g <= self.stop and not self.mixed:
            self.fresh = True
            if self.one:
                self.ws = self._apply_inner(self.rs)
                self.g, self.d = self._norm2_redot(self.rs, self.ws)
            else:
                self.g = self.rr
        else:
            self.reliable = True
            self.g = norm2(geom, self.rs)
            self.ps -= (inner(geom, self.rs, self.ps) / self.g) * self.rs
            self.flops += (2 * _FL_NORM + 2 * _FL_AXPY) * self.numbers
        self.rmax2 = self.g
        return False

    def search_direction(self) -> float:
        """p = r + beta p and s = A p (by recurrence in the Chronopoulos-Gear step); returns p^dag A p."""
        self.cg_step = self.one and not self.reliable
        pap = self._direction_arrays() if self.blas is None else self._direction_fused()
        self.step_fresh = self.fresh
        self.fresh = self.reliable = False
        if not pap > 0 or not math.isfinite(pap):
            self.breakdown(pap)
        return pap

    def _direction_arrays(self) -> float:
        if self.fresh:
            self.ps = self.rs.copy()
        else:
            self.beta = self.g / self.g_old
            self.ps *= self.beta
            self.ps += self.rs
        if self.cg_step:
            # Chronopoulos-Gear: s by recurrence, p^dag A p from |r|^2 and Re<r, A r> of the same reduction
            if self.fresh:
                self.ss = self.ws.copy()
                return self.d
            self.ss *= self.beta
            self.ss += self.ws
            return self.d - self.beta * self.g / self.alpha_old
        # Hestenes-Stiefel (and the step after a reliable update): s = A p, p^dag A p summed
        self.ss = self._apply_inner(self.ps)
        self.flops += _FL_NORM * self.numbers
        return inner(self.geom, self.ps, self.ss).real

    def _direction_fused(self) -> float:
        # the same with fused kernels; the Chronopoulos-Gear updates of p and s wait for alpha (cg_update)
        if self.ps is None:
            self.ps, self.ss = self.blas.zeros(), self.blas.zeros()
        if not self.fresh:
            self.beta = self.g / self.g_old
        if self.cg_step:
            return self.d if self.fresh else self.d - self.beta * self.g / self.alpha_old
        self.blas.xpay(self.ps, self.rs, self.beta, self.fresh)
        self.ss = self._apply_inner(self.ps)
        self.flops += _FL_NORM * self.numbers
        return self.blas.norm2_redot(self.ps, self.ss)[1]

    def step(self, pap: float) -> None:
        """x += alpha p, r -= alpha s, and the next residual norm (with Re<r, A r> in the one-reduction form)."""
        alpha = self.g / pap
        blas, g_new = self.blas, None
        if blas is None:
            self.y += alpha * self.ps
            self.rs -= alpha * self.ss
        elif self.cg_step:
            blas.cg_update(self.ps, self.ss, self.y, self.rs, self.ws, alpha, self.beta, self.step_fresh)
        else:
            g_new = blas.axpy2_norm2(self.ps, self.ss, self.y, self.rs, alpha, reduce=not self.one)
        self.k += 1
        self.g_old, self.alpha_old = self.g, alpha
        if self.one:
            self.ws = self._apply_inner(self.rs)
            self.flops += _FL_CG_ITER * self.numbers
            self.g, self.d = self._norm2_redot(self.rs, self.ws)
        else:
            self.flops += (_FL_CG_ITER - _FL_NORM) * self.numbers
            self.g = norm2(self.geom, self.rs) if blas is None else g_new
        if not math.isfinite(self.g):
            self.nonfinite()
        self.rmax2 = max(self.rmax2, self.g)

    def finish_trivial(self) -> SolverStats:
        self.st.time = _sync_time(self.geom, self.t0)
        return self.st

    def finish(self) -> SolverStats:
        st = self.st
        st.iters = self.k
        st.milc_iters = self.k + self.n_true
        st.residual = math.sqrt(self.g / self.bb)
        st.true_residual = math.sqrt(self.rr / self.bb)
        st.flops = self.flops
        st.time = _sync_time(self.geom, self.t0)
        if not st.converged and self.inv.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st), st, self.x)
        return st


@dataclass(frozen=True)
class CG:
    """The CG inverter as an operator -> operator factory (made by :func:`cg` and :func:`mixed_cg`):
    ``CG(...)(A)`` is a :class:`CGInverse` of A. ``single_reduction`` None: the Chronopoulos-Gear form in one
    precision, Hestenes-Stiefel for a mixed-precision inner iteration (module docstring); ``inner_dtype`` None: one
    precision, else the Krylov iteration's precision with reliable updates every ``delta`` drop."""

    tol: float = 1e-10
    maxiter: int = 10000
    raise_on_fail: bool = True
    single_reduction: bool | None = None
    inner_dtype: object = None
    delta: float = 0.1

    def __post_init__(self):
        if self.inner_dtype is not None and not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), not {self.delta}")

    def __call__(self, op) -> CGInverse:
        mixed = self.inner_dtype is not None
        one = (not mixed) if self.single_reduction is None else bool(self.single_reduction)
        return CGInverse(op, self.tol, self.maxiter, self.raise_on_fail, inner_dtype=self.inner_dtype,
                         delta=self.delta if mixed else 0.0, single_reduction=one)

    def mixed_precision(self, dtype=np.complex64, delta: float | None = None) -> "CG":
        """This CG with its Krylov iteration in ``dtype`` and double reliable updates (``delta``: default 0.1)."""
        return replace(self, inner_dtype=np.dtype(dtype), delta=self.delta if delta is None else float(delta))


def mixed_precision(inner, dtype=np.complex64, **options):
    """``mixed_precision(inner)``: the inverter factory ``inner`` with its Krylov work in ``dtype`` (complex64) and
    the answer to ``inner``'s double-precision tolerance: for :func:`cg`, reliable updates (:func:`mixed_cg`); for
    :func:`solvers.multishift.multishift_cg`, the multishift in ``dtype`` and every shift refined by a mixed CG
    (:func:`solvers.multishift.mixed_multishift_cg`); for :func:`solvers.even_odd.even_odd`, its inner inverter made
    mixed. ``options`` go to that factory's ``mixed_precision`` (e.g. ``delta`` for CG)."""
    make = getattr(inner, "mixed_precision", None)
    if make is None:
        raise TypeError(f"mixed_precision takes an inverter factory of solvers (cg, multishift_cg, even_odd), not "
                        f"{type(inner).__name__}")
    return make(dtype, **options)


def cg(tol: float = 1e-10, maxiter: int = 10000, raise_on_fail: bool = True, single_reduction: bool | None = None):
    """CG for a Hermitian positive operator: ``cg(tol, maxiter)(A)`` is A^-1 as an operator.

    Stops when |b - A x|^2 <= tol^2 |b|^2 (MILC's rule, ``resid`` = tol), checked on the true residual.
    A solve that does not converge in ``maxiter`` iterations raises :class:`SolverConvergenceError`, or, with
    ``raise_on_fail=False``, returns its last iterate with ``stats.converged = False``. Zero initial guess unless
    ``inv.solve(b, x0)`` is given one. ``single_reduction=False`` selects the textbook Hestenes-Stiefel form
    (two reductions per iteration, no extra product per solve); None (default): Chronopoulos-Gear, and
    Hestenes-Stiefel once made mixed (:func:`mixed_precision`).
    """
    return CG(tol, maxiter, raise_on_fail, single_reduction)


def mixed_cg(tol: float = 1e-10, maxiter: int = 10000, raise_on_fail: bool = True, inner_dtype=np.complex64,
             delta: float = 0.1, single_reduction: bool = False):
    """Mixed-precision CG: ``mixed_cg(tol)(A)``, A a double-precision operator with ``A.converted(complex64)``;
    ``mixed_precision(cg(tol), inner_dtype, delta=delta)``.

    The Krylov iteration runs in ``inner_dtype``; the solution is kept in double precision, and the true double
    residual replaces the iterated one each time the latter has fallen by ``delta`` since the last update
    (reliable updates, as QUDA's), and when it reaches tol. Stops on the true double-precision residual.

    The single-precision iteration uses the Hestenes-Stiefel form (two reductions per iteration) by default: the
    one-reduction recurrence for p^dag A p cancels badly in single precision on ill-conditioned systems (with
    Haar-random links at m = 0.01 it stagnates and breaks down); ``single_reduction=True`` selects it anyway.
    """
    return mixed_precision(cg(tol, maxiter, raise_on_fail, single_reduction), inner_dtype, delta=delta)
