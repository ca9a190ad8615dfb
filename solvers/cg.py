"""Conjugate gradient solvers, composed as in gpt: ``inv = cg(tol=1e-10, maxiter=1000)(A)`` is an operator with
``x = inv(b)``; ``x, stats = inv.solve(b)`` also gives the :class:`SolverStats`.

* :func:`cg`: CG on a Hermitian positive operator, MILC's stopping rule |r|^2 <= tol^2 |b|^2, checked on the true
  residual b - A x (recomputed when the iterated residual has converged; if the true one has not, CG restarts from
  it, as MILC's ``ks_congrad_parity``).
* :func:`mixed_cg`: the same with the Krylov iteration in single precision and reliable updates: the solution is
  accumulated in double precision and the true double-precision residual replaces the iterated one whenever the
  latter has dropped by ``delta`` since the last update, and at the end. It stops on the true double residual.
* :func:`multishift_cg`: (A + sigma_i) x_i = b for all shifts at once (Jegerlehner, hep-lat/9612014); every shift is
  updated at each iteration and the solver stops when the base (smallest) shift has converged, as MILC's
  ``ks_multicg_offset``. Zero initial guess.
* :func:`hybrid_multishift_cg`: MILC's ``KS_MULTICG=HYBRID``: the multishift CG (possibly on another operator, MILC's
  Naik-epsilon-0 links), then a single-mass CG refinement of every shift from its multishift solution.
* :func:`even_odd_inverse`: M^-1 from an inverse of the even-site normal operator plus odd-site reconstruction.

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
reliable updates keep the NumPy path's code.

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
from dataclasses import dataclass, field

import numpy as np

from .operator import Operator, FunctionOperator, fused_blas, inner, norm2, norm2_and_redot
from .staggered import FLOPS_AXPY, epsilon, project
from . import blas_cuda  # noqa: F401  (registers the fused solver kernels for the cupy backend)

# linear-algebra flops per site (complex 3-vectors, real coefficients)
_FL_NORM = 12          # |a|^2 or Re<a, b>
_FL_CG_ITER = 4 * FLOPS_AXPY + 2 * _FL_NORM   # p, s, x, r updates + fused reduction
_FL_SHIFT_ITER = 18 + FLOPS_AXPY              # p_i = z r + b p_i, x_i += a p_i


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
        super().__init__(op.geom, op.dtype, 0.0, op.sites)
        self.op = op
        self.hermitian = op.hermitian
        self.name = name
        self.stats: SolverStats | None = None
        self.history: deque = deque(maxlen=self.HISTORY)

    def _apply(self, b):
        return self.solve(b)[0]

    def solve(self, b, x0=None):
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

    def _solve(self, b, x0):
        A, Ai = self.op, self.inner_op
        geom, xp = A.geom, A.xp
        mixed = Ai is not A
        one = self.single_reduction
        tol, maxiter = self.tol, self.maxiter
        delta2 = self.delta ** 2 if mixed else 0.0
        st = SolverStats(self.name, tol, precision=f"{Ai.precision}/{A.precision}" if mixed else A.precision,
                         maxiter=maxiter)
        st.extra["variant"] = "Chronopoulos-Gear" if one else "Hestenes-Stiefel"
        t0 = time.perf_counter()
        flops = 0.0
        sites = A.sites

        b = xp.asarray(b).astype(A.dtype, copy=False)
        bb = norm2(geom, b)
        if bb == 0.0:   # MILC: trivial solution, zero iterations
            st.converged, st.true_residual = True, 0.0
            st.time = _sync_time(geom, t0)
            return xp.zeros_like(b), st
        if not math.isfinite(bb):
            raise SolverBreakdownError(f"{self.name}: the source has a non-finite norm ({bb})", st)
        stop = tol * tol * bb

        if x0 is None:
            x = xp.zeros_like(b)
            r = b.copy()
            rr = bb
        else:
            x = xp.asarray(x0).astype(A.dtype, copy=True)
            r = b - A(x)
            st.matvecs += 1
            flops += A.flops + (FLOPS_AXPY + _FL_NORM) * sites
            rr = norm2(geom, r)
        n_true = 1       # true residuals computed (the initial one included, as MILC counts it)
        if rr <= stop:
            st.converged, st.residual, st.true_residual = True, math.sqrt(rr / bb), math.sqrt(rr / bb)
            st.milc_iters = n_true
            st.time = _sync_time(geom, t0)
            return x, st

        rs = r.astype(Ai.dtype) if mixed else r       # iterated residual (inner precision)
        y = xp.zeros_like(rs)                          # solution accumulated since the last reliable update
        ws = ss = ps = None
        d = 0.0
        blas = fused_blas(Ai, b)                       # fused GPU kernels for the Krylov iteration, or None
        st.extra["fused"] = blas is not None

        def norm2_redot(u, v):
            return norm2_and_redot(geom, u, v) if blas is None else blas.norm2_redot(u, v)

        if one:
            ws = Ai(rs)
            st.matvecs += 1
            flops += Ai.flops
            g, d = norm2_redot(rs, ws)
        else:
            g = norm2(geom, rs) if mixed else rr
        rmax2 = g
        fresh, reliable = True, False
        g_old = alpha_old = beta = 1.0
        k = 0
        while True:
            if g <= stop or g < delta2 * rmax2 or k >= maxiter:
                # reliable update (mixed precision), or the check of the true residual
                if k > 0:
                    x += y.astype(A.dtype, copy=False) if mixed else y
                    y.fill(0)
                r = b - A(x)
                rr = norm2(geom, r)
                st.matvecs += 1
                n_true += 1
                flops += A.flops + (2 * FLOPS_AXPY + _FL_NORM) * sites
                if rr <= stop or k >= maxiter:
                    st.converged = rr <= stop
                    break
                st.restarts += 1
                rs = r.astype(Ai.dtype) if mixed else r
                if g <= stop and not mixed:
                    # the iterated residual converged but the true one did not: restart from it (MILC)
                    fresh = True
                    if one:
                        ws = Ai(rs)
                        st.matvecs += 1
                        flops += Ai.flops
                        g, d = norm2_redot(rs, ws)
                    else:
                        g = rr
                else:
                    # reliable update: keep the search direction, made orthogonal to the new residual (as QUDA)
                    reliable = True
                    g = norm2(geom, rs)
                    ps -= (inner(geom, rs, ps) / g) * rs
                    flops += (2 * _FL_NORM + 2 * FLOPS_AXPY) * sites
                rmax2 = g
            # search direction p and s = A p
            cg_step = one and not reliable
            if blas is None:
                if fresh:
                    ps = rs.copy()
                else:
                    beta = g / g_old
                    ps *= beta
                    ps += rs
                if cg_step:
                    # Chronopoulos-Gear: s by recurrence, p^dag A p from |r|^2 and Re<r, A r> of the same reduction
                    if fresh:
                        ss = ws.copy()
                        pap = d
                    else:
                        ss *= beta
                        ss += ws
                        pap = d - beta * g / alpha_old
                else:
                    # Hestenes-Stiefel (and the step after a reliable update): s = A p, p^dag A p summed
                    ss = Ai(ps)
                    st.matvecs += 1
                    flops += Ai.flops + _FL_NORM * sites
                    pap = inner(geom, ps, ss).real
            else:
                # the same with fused kernels; the Chronopoulos-Gear updates of p and s wait for alpha (cg_update)
                if ps is None:
                    ps, ss = xp.zeros_like(rs), xp.zeros_like(rs)
                if not fresh:
                    beta = g / g_old
                if cg_step:
                    pap = d if fresh else d - beta * g / alpha_old
                else:
                    blas.xpay(ps, rs, beta, fresh)
                    ss = Ai(ps)
                    st.matvecs += 1
                    flops += Ai.flops + _FL_NORM * sites
                    pap = blas.norm2_redot(ps, ss)[1]
            step_fresh = fresh
            fresh = reliable = False
            if not pap > 0 or not math.isfinite(pap):
                st.iters, st.residual = k, math.sqrt(g / bb)
                raise SolverBreakdownError(
                    f"{self.name} broke down at iteration {k}: p^dag A p = {pap:.3e} (the operator {A.name} is not "
                    "Hermitian positive definite, or the numbers overflowed)", st, x)
            alpha = g / pap
            if blas is None:
                y += alpha * ps
                rs -= alpha * ss
            elif cg_step:
                blas.cg_update(ps, ss, y, rs, ws, alpha, beta, step_fresh)
            else:
                g_new = blas.axpy2_norm2(ps, ss, y, rs, alpha, reduce=not one)
            k += 1
            g_old, alpha_old = g, alpha
            if one:
                ws = Ai(rs)
                st.matvecs += 1
                flops += Ai.flops + _FL_CG_ITER * sites
                g, d = norm2_redot(rs, ws)
            else:
                flops += (_FL_CG_ITER - _FL_NORM) * sites
                g = norm2(geom, rs) if blas is None else g_new
            if not math.isfinite(g):
                st.iters, st.residual = k, math.nan
                raise SolverBreakdownError(f"{self.name}: non-finite residual at iteration {k}", st, x)
            rmax2 = max(rmax2, g)

        st.iters = k
        st.milc_iters = k + n_true
        st.residual = math.sqrt(g / bb)
        st.true_residual = math.sqrt(rr / bb)
        st.flops = flops
        st.time = _sync_time(geom, t0)
        if not st.converged and self.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st), st, x)
        return x, st


def cg(tol: float = 1e-10, maxiter: int = 10000, raise_on_fail: bool = True, single_reduction: bool = True):
    """CG for a Hermitian positive operator: ``cg(tol, maxiter)(A)`` is A^-1 as an operator.

    Stops when |b - A x|^2 <= tol^2 |b|^2 (MILC's rule, ``resid`` = tol), checked on the true residual.
    A solve that does not converge in ``maxiter`` iterations raises :class:`SolverConvergenceError`, or, with
    ``raise_on_fail=False``, returns its last iterate with ``stats.converged = False``. Zero initial guess unless
    ``inv.solve(b, x0)`` is given one. ``single_reduction=False`` selects the textbook Hestenes-Stiefel form
    (two reductions per iteration, no extra product per solve).
    """
    return lambda op: CGInverse(op, tol, maxiter, raise_on_fail, single_reduction=single_reduction)


def mixed_cg(tol: float = 1e-10, maxiter: int = 10000, raise_on_fail: bool = True, inner_dtype=np.complex64,
             delta: float = 0.1, single_reduction: bool = False):
    """Mixed-precision CG: ``mixed_cg(tol)(A)``, A a double-precision operator with ``A.converted(complex64)``.

    The Krylov iteration runs in ``inner_dtype``; the solution is kept in double precision, and the true double
    residual replaces the iterated one each time the latter has fallen by ``delta`` since the last update
    (reliable updates, as QUDA's), and when it reaches tol. Stops on the true double-precision residual.

    The single-precision iteration uses the Hestenes-Stiefel form (two reductions per iteration) by default: the
    one-reduction recurrence for p^dag A p cancels badly in single precision on ill-conditioned systems (with
    Haar-random links at m = 0.01 it stagnates and breaks down); ``single_reduction=True`` selects it anyway.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), not {delta}")
    return lambda op: CGInverse(op, tol, maxiter, raise_on_fail, inner_dtype=inner_dtype, delta=delta,
                                single_reduction=single_reduction)


# ----------------------------------------------------------------------------------------------------------------
# Multishift CG
# ----------------------------------------------------------------------------------------------------------------

class MultishiftInverse:
    """``xs = inv(b)``: the list of solutions of (A + sigma_i) x_i = b, in the order of ``shifts``.
    ``xs, stats = inv.solve(b)``; ``inv.stats``, ``inv.history`` as for :class:`InverseOperator`."""

    def __init__(self, op, shifts, tol, maxiter, raise_on_fail, check_residual):
        _require_hermitian(op, "multishift_cg")
        self.op = op
        self.geom, self.dtype = op.geom, op.dtype
        self.shifts = tuple(float(s) for s in shifts)
        if not self.shifts:
            raise ValueError("multishift_cg needs at least one shift")
        if not tol > 0:
            raise ValueError(f"tol must be positive, not {tol}")
        self.tol, self.maxiter = float(tol), int(maxiter)
        self.raise_on_fail, self.check_residual = bool(raise_on_fail), bool(check_residual)
        self.name = "multishift CG"
        self.stats: SolverStats | None = None
        self.history: deque = deque(maxlen=InverseOperator.HISTORY)

    def __call__(self, b):
        return self.solve(b)[0]

    def operators(self) -> list[Operator]:
        """The shifted operators A + sigma_i."""
        return [self.op.shifted(s) for s in self.shifts]

    def solve(self, b):
        xs, st = self._solve(b)
        self.stats = st
        self.history.append(st)
        return xs, st

    def _solve(self, b):
        A = self.op
        geom, xp = A.geom, A.xp
        shifts = self.shifts
        n = len(shifts)
        j0 = int(np.argmin(shifts))
        s0 = shifts[j0]
        rel = [s - s0 for s in shifts]           # shifts relative to the base system A + s0
        st = SolverStats(self.name, self.tol, precision=A.precision, maxiter=self.maxiter, shifts=shifts)
        t0 = time.perf_counter()
        sites = A.sites

        b = xp.asarray(b).astype(A.dtype, copy=False)
        bb = norm2(geom, b)
        if bb == 0.0:
            st.converged, st.true_residual = True, 0.0
            st.residuals, st.true_residuals = [0.0] * n, [0.0] * n
            st.time = _sync_time(geom, t0)
            return [xp.zeros_like(b) for _ in range(n)], st
        stop = self.tol ** 2 * bb

        def base(v):
            w = A(v)
            if s0 != 0.0:
                w += s0 * v
            return w

        blas = fused_blas(A, b)       # fused GPU kernels, or None
        st.extra["fused"] = blas is not None

        def residual_sums(r):
            """w = (A + s0) r and (|r|^2, Re<r, w>)."""
            if blas is None:
                w = base(r)
                return (w,) + norm2_and_redot(geom, r, w)
            w = A(r)
            return (w,) + blas.norm2_redot(r, w, shift=s0)     # w += s0 r folded into the reduction

        r = b.copy()
        w, g, d = residual_sums(r)
        matvecs = 1
        xs = [xp.zeros_like(b) for _ in range(n)]
        ps_i = [None] * n if blas is None else [xp.zeros_like(b) for _ in range(n)]
        z = [1.0] * n            # zeta_k
        z_prev = [1.0] * n       # zeta_{k-1}
        alpha_prev, beta = 1.0, 0.0
        g_old = 1.0
        p = None
        s = None if blas is None else xp.zeros_like(b)
        k = 0
        while g > stop and k < self.maxiter:
            # (the fused path leaves out p, which nothing reads, and updates s in multishift_update)
            if k == 0:
                beta = 0.0
                if blas is None:
                    p, s = r.copy(), w.copy()
                pap = d
            else:
                beta = g / g_old
                if blas is None:
                    p *= beta
                    p += r
                    s *= beta
                    s += w
                pap = d - beta * g / alpha_prev
            if not pap > 0 or not math.isfinite(pap):
                st.iters, st.residual = k, math.sqrt(g / bb)
                raise SolverBreakdownError(f"{self.name} broke down at iteration {k}: p^dag A p = {pap:.3e}", st)
            alpha = g / pap
            # shifted systems (Jegerlehner): zeta_{k+1}, alpha_i, beta_i from the base alpha, beta
            coefs = [None] * n
            for i in range(n):
                zi, zp = z[i], z_prev[i]
                if zi == 0.0:
                    z_prev[i], z[i] = 0.0, 0.0
                    continue
                den = alpha * beta * (zp - zi) + zp * alpha_prev * (1.0 + rel[i] * alpha)
                zn = zi * zp * alpha_prev / den if den != 0.0 else 0.0
                ai = alpha * zn / zi
                bi = beta * (zi / zp) ** 2 if k > 0 else 0.0
                if blas is not None:
                    coefs[i] = (zi, ai, bi)   # p_i and x_i updated in multishift_update
                else:
                    if k == 0:
                        ps_i[i] = zi * r          # = r
                    else:
                        ps_i[i] *= bi
                        ps_i[i] += zi * r
                    xs[i] += ai * ps_i[i]
                z_prev[i], z[i] = zi, zn
            if blas is None:
                r -= alpha * s
            else:
                blas.multishift_update(s, r, w, ps_i, xs, coefs, alpha, beta, fresh=k == 0)
            k += 1
            matvecs += 1
            g_old, alpha_prev = g, alpha
            w, g, d = residual_sums(r)
            if not math.isfinite(g):
                raise SolverBreakdownError(f"{self.name}: non-finite residual at iteration {k}", st)

        st.converged = g <= stop
        st.iters, st.milc_iters, st.matvecs = k, k + 1, matvecs
        st.residual = math.sqrt(g / bb)
        st.residuals = [abs(zi) * st.residual for zi in z]
        shift_flops = A.flops + (12 if s0 else 0) * sites
        st.flops = matvecs * shift_flops + k * (_FL_CG_ITER + n * _FL_SHIFT_ITER) * sites
        st.time = _sync_time(geom, t0)
        if self.check_residual:
            trs = []
            for sig, x in zip(shifts, xs):
                rx = A(x)
                rx += sig * x
                trs.append(math.sqrt(norm2(geom, b - rx) / bb))
            st.true_residuals = trs
            st.true_residual = trs[j0]
        if not st.converged and self.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st) + f" (base shift {s0:g} of {shifts})", st, xs)
        return xs, st


def multishift_cg(shifts, tol: float = 1e-10, maxiter: int = 10000, raise_on_fail: bool = True,
                  check_residual: bool = True):
    """``multishift_cg(shifts, tol)(A)(b)`` = [(A + s)^-1 b for s in shifts], A Hermitian positive.

    MILC's rule: all shifts are updated every iteration and the solver stops when the smallest shift has
    |r|^2 <= tol^2 |b|^2 (the others are then more accurate). ``check_residual`` recomputes every true residual
    afterwards (one extra product per shift; turn it off inside HMC).
    """
    return lambda op: MultishiftInverse(op, shifts, tol, maxiter, raise_on_fail, check_residual)


class HybridMultishiftInverse:
    """MILC's ``KS_MULTICG=HYBRID`` (``generic_ks/ks_multicg.c``, ``ks_multicg_hybrid``): the multishift CG on
    ``op0`` + s_i, then every shift refined in turn by a single-mass CG on ``op`` + s_i started from the multishift
    solution, with the same tolerance and MILC's true-residual rule (:class:`CGInverse`). Made by
    :func:`hybrid_multishift_cg`; ``xs, stats = inv.solve(b)``."""

    def __init__(self, op0, op, shifts, tol, maxiter, refine_maxiter, raise_on_fail):
        _require_hermitian(op, "hybrid_multishift_cg")
        self.multishift = MultishiftInverse(op0, shifts, tol, maxiter, raise_on_fail=False, check_residual=False)
        self.op, self.shifts, self.tol = op, self.multishift.shifts, float(tol)
        self.refine_maxiter = int(refine_maxiter)
        self.raise_on_fail = bool(raise_on_fail)
        self.name = "hybrid multishift CG"
        self.stats: SolverStats | None = None

    def __call__(self, b):
        return self.solve(b)[0]

    def solve(self, b):
        xs, st = self.multishift.solve(b)
        st.solver = self.name
        refine = []
        if st.converged:
            out = []
            for s, x in zip(self.shifts, xs):
                y, rs = CGInverse(self.op.shifted(s), self.tol, self.refine_maxiter, raise_on_fail=False).solve(b, x)
                refine.append(rs)
                out.append(y)
            xs = out
            st.converged = all(r.converged for r in refine)
            st.true_residuals = [r.true_residual for r in refine]
            st.true_residual = max(st.true_residuals)
            st.time += sum(r.time for r in refine)
            st.flops += sum(r.flops for r in refine)
            st.matvecs += sum(r.matvecs for r in refine)
        st.extra["refine"] = refine
        st.extra["refine_milc_iters"] = sum(r.milc_iters for r in refine)
        self.stats = st
        if not st.converged and self.raise_on_fail:
            raise SolverConvergenceError(_fail_message(st) + " (hybrid: multishift, then single-mass refinement)",
                                         st, xs)
        return xs, st


def hybrid_multishift_cg(shifts, tol: float = 1e-10, maxiter: int = 10000, refine_maxiter: int | None = None,
                         raise_on_fail: bool = True):
    """``hybrid_multishift_cg(shifts, tol)(A0, A)(b)`` = [(A + s)^-1 b for s in shifts] by MILC's HYBRID scheme:

    1. the multishift CG (:func:`multishift_cg`, MILC's stopping rule) of (A0 + s_i) x_i = b, zero start;
    2. for each shift in order, CG on (A + s_i) y_i = b from y_i = x_i until |b - (A + s_i) y_i| <= tol |b|
       (MILC's ``ks_congrad``: the true residual is checked first, so a shift that already meets it costs one
       product and is returned unchanged).

    A0 = A reproduces MILC's 2009 builds; MILC's later builds (``ks_multicg_hybrid_field``: "first we invert as though
    all masses took the same Naik epsilon, then we refine using the correct Naik epsilon") pass the links of the first
    Naik epsilon as A0. ``refine_maxiter`` (default ``maxiter``) caps each refinement; ``stats`` is the multishift's,
    with ``extra["refine"]`` (one :class:`SolverStats` per shift), ``extra["refine_milc_iters"]`` and the refined
    true residuals in ``true_residuals``."""
    cap = maxiter if refine_maxiter is None else refine_maxiter
    return lambda op0, op: HybridMultishiftInverse(op0, op, shifts, tol, maxiter, cap, raise_on_fail)


# ----------------------------------------------------------------------------------------------------------------
# Even-odd preconditioning
# ----------------------------------------------------------------------------------------------------------------

class EvenOddInverse(InverseOperator):
    """M^-1 from the parity-p solve A_m x_p = (M^dag b)_p and x_q = (b_q - D_qp x_p)/(2m); see
    :func:`even_odd_inverse`. The tolerance applies to the parity-p system, as in MILC: ``stats.true_residual`` is
    its true residual (so converged implies true_residual <= tol, as for every solver here), ``stats.full_residual``
    is |b - M x|/|b| of the full system, and ``stats.inner`` the inner solver's statistics."""

    def __init__(self, M_eo, inner, check_residual=True):
        self.M_eo = M_eo
        self.inner_inverse = inner(M_eo.normal)
        super().__init__(M_eo.matrix, f"even-odd[{self.inner_inverse.name}]")
        self.hermitian = False
        self.check_residual = bool(check_residual)

    def _solve(self, b, x0):
        M_eo = self.M_eo
        geom, xp = M_eo.geom, M_eo.dslash.xp
        t0 = time.perf_counter()
        b = xp.asarray(b).astype(M_eo.dtype, copy=False)
        src = M_eo.prepare(b)
        guess = None if x0 is None else project(xp.asarray(x0), geom, M_eo.parity)
        xp_part, ist = self.inner_inverse.solve(src, guess)
        x = M_eo.reconstruct(xp_part, b)
        st = SolverStats(self.name, ist.tol, converged=ist.converged, iters=ist.iters, milc_iters=ist.milc_iters,
                         matvecs=ist.matvecs, restarts=ist.restarts, residual=ist.residual,
                         true_residual=ist.true_residual, precision=ist.precision, maxiter=ist.maxiter, inner=ist)
        st.flops = ist.flops + M_eo.prepare_flops + M_eo.reconstruct_flops
        st.time = _sync_time(geom, t0)
        if self.check_residual:
            bb = norm2(geom, b)
            st.full_residual = math.sqrt(norm2(geom, b - M_eo.matrix(x)) / bb) if bb > 0 else 0.0
        return x, st

    def adjoint(self):
        """(M^-1)^dag = (M^dag)^-1 = eps M^-1 eps."""
        eps = epsilon(self.geom, np.float64)
        return FunctionOperator(self.geom, lambda b: eps * self(eps * b), self, dtype=self.dtype,
                                name=f"({self.name})^dag")


def even_odd_inverse(M_eo, inner, check_residual: bool = True) -> EvenOddInverse:
    """The full M^-1 for ``M_eo`` (a :class:`solvers.staggered.StaggeredEvenOdd`), solving the parity-p normal
    system with ``inner`` (a solver such as ``cg(tol)`` or ``mixed_cg(tol)``) and reconstructing the other parity.

    With MILC's convention the tolerance applies to the parity-p system: |b - M x| = |r_p|/(2m), so the full
    relative residual can exceed tol by up to |M^dag b|/(2m |b|). ``check_residual`` reports it in
    ``stats.full_residual`` (one more product with M).
    """
    return EvenOddInverse(M_eo, inner, check_residual)
