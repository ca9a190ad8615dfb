"""Even-odd preconditioning of the staggered matrix: M^-1 from an inverse of the parity-p normal operator plus the
reconstruction of the other parity (MILC's ``ks_congrad`` on one parity, then ``dslash`` for the other)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .cg import InverseOperator, SolverStats, _sync_time, mixed_precision
from .operator import FunctionOperator, norm2
from .staggered import epsilon, project


class EvenOddInverse(InverseOperator):
    """M^-1 from the parity-p solve A_m x_p = (M^dag b)_p and x_q = (b_q - D_qp x_p)/(2m); see
    :func:`even_odd_inverse`. The tolerance applies to the parity-p system, as in MILC: ``stats.true_residual`` is
    its true residual (so converged implies true_residual <= tol, as for every solver here), ``stats.full_residual``
    is |b - M x|/|b| of the full system, and ``stats.inner`` the inner solver's statistics."""

    def __init__(self, M_eo, inner, check_residual=True):
        if not all(hasattr(M_eo, a) for a in ("normal", "prepare", "reconstruct", "matrix")):
            raise TypeError(f"even_odd takes an even-odd operator (StaggeredEvenOdd: D.even_odd(mass)), not "
                            f"{type(M_eo).__name__}")
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
        xp_part, ist = self.inner_inverse.solve(src, guess, check=False)
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
                                name=f"({self.name})^dag", site_shape=self.site_shape)


@dataclass(frozen=True)
class EvenOdd:
    """The even-odd inverter as a factory: ``EvenOdd(inner)(M_eo)`` is an :class:`EvenOddInverse` (:func:`even_odd`)."""

    inner: object
    check_residual: bool = True

    def __call__(self, M_eo) -> EvenOddInverse:
        return EvenOddInverse(M_eo, self.inner, self.check_residual)

    def mixed_precision(self, dtype=np.complex64, **options) -> "EvenOdd":
        """The same with its inner inverter made mixed (:func:`solvers.cg.mixed_precision`)."""
        return EvenOdd(mixed_precision(self.inner, dtype, **options), self.check_residual)


def even_odd(inner, check_residual: bool = True) -> EvenOdd:
    """``even_odd(inner)(M_eo)``: the full M^-1 for ``M_eo`` (a :class:`solvers.staggered.StaggeredEvenOdd`),
    solving the parity-p normal system with the inverter factory ``inner`` (``cg(tol)``, ``mixed_precision(cg(tol))``,
    ...) and reconstructing the other parity.

    With MILC's convention the tolerance applies to the parity-p system: |b - M x| = |r_p|/(2m), so the full
    relative residual can exceed tol by up to |M^dag b|/(2m |b|). ``check_residual`` reports it in
    ``stats.full_residual`` (one more product with M).
    """
    return EvenOdd(inner, check_residual)


def even_odd_inverse(M_eo, inner, check_residual: bool = True) -> EvenOddInverse:
    """``even_odd(inner, check_residual)(M_eo)`` (:func:`even_odd`)."""
    return even_odd(inner, check_residual)(M_eo)
