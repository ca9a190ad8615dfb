"""One multishift CG solve's state and its host-driven iteration (:class:`_MultishiftRun`, made by
:class:`solvers.multishift.MultishiftInverse`): Jegerlehner's recurrences of every shift beside the base system's
Chronopoulos-Gear CG, MILC's stopping rule, the reliable updates of the mixed first stage, and (``stop_converged``)
QUDA's stopping of the converged shifts. The device-resident iterations of the same run are in
:mod:`solvers.krylov_graph`."""
from __future__ import annotations

import math
import time

import numpy as np

from .cg import (SolverBreakdownError, SolverConvergenceError, SolverStats, _FL_AXPY, _FL_CG_ITER, _FL_NORM,
                 _FL_SHIFT_ITER, _fail_message, _sync_time)
from .krylov_graph import ratio_squared
from .operator import fused_blas, norm2, norm2_and_redot

#: the mixed first stage keeps a shift's x_i in single precision where its rounding costs at most this fraction of
#: the tolerance (:meth:`_MultishiftRun._solution_dtype`); the base shift's is always double. Default inf: the
#: base shift's alone. 0.1 put the six lightest of the 9 shifts of tools/profile_md_solve.py in double on the 8^4
#: operator, for 378 refinement iterations against 384 with the base shift's alone: the other shifts' residuals are
#: limited by the single-precision Krylov vectors, not by their x_i, and each double x_i adds 16 of the update's
#: ~330 bytes per number.
SINGLE_X_ROUNDING = math.inf

#: ``stop_converged``: a shift stops at this fraction of the tolerance, so that its true residual (the iterated one
#: plus the rounding of the Krylov precision) stays below the tolerance, and a mixed-precision solve's refinement
#: (which takes up every shift whose true residual exceeds it) has nothing to do for the stopped ones
SHIFT_STOP_MARGIN = 0.1


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
        # a shift stops once zeta_i^2 |r|^2 falls to this (0: never; MILC updates every shift to the end)
        self.shift_stop = SHIFT_STOP_MARGIN ** 2 * self.stop if self.inv.stop_converged else 0.0
        self.finished = {}            # shift -> (|r_i|^2, iteration) where it stopped
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
            if zi != 0.0 and zi * zi * self.g <= self.shift_stop:     # (never the base shift: there g > stop)
                self.finished[i] = (zi * zi * self.g, self.k)
                zi = 0.0
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
        st.residuals = [math.sqrt(self.finished[i][0] / self.bb) if i in self.finished else abs(zi) * st.residual
                        for i, zi in enumerate(self.z)]
        if self.shift_stop:
            st.extra["stopped_shifts"] = len(self.finished)
            st.extra["shift_updates"] = sum(kk for _, kk in self.finished.values()) + (self.n - len(self.finished)) * k
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
