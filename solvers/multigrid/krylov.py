"""Krylov pieces of the multigrid: the GCR smoother and flexible GCR (outer solver and K-cycle).

* :func:`gcr_smooth`: ``steps`` iterations of GCR in its communication-avoiding form (QUDA's CA-GCR smoother):
  the Krylov basis r, A r, ..., A^(s-1) r is built first (s operator applications), then the residual is
  minimized over it with one batched reduction (the Gram matrix of the A p_i and their products with r) and a
  small least-squares solve. One global reduction per smoothing, whatever ``steps``.
* :func:`fgcr`: flexible GCR (right preconditioning that may change between iterations, as a K-cycle does) with
  restarts every ``nkrylov`` directions. The new direction's image is orthogonalized against the kept ones by
  classical Gram-Schmidt in one reduction; |q|^2 and <q, r> come from a second one, and |r|^2 follows from them
  (|r - alpha q|^2 = |r|^2 - |<q, r>|^2/|q|^2). With ``true_residual`` the residual is recomputed from x at each
  restart and before stopping.
"""
from __future__ import annotations

import math

import numpy as np

from .lattice import global_sums


def _vdot_local(xp, a, b):
    """sum conj(a) b on this rank. An element-wise product and a sum rather than BLAS zdotc: on a CPU shared with
    other jobs a threaded BLAS reduction of a lattice field waits for its threads (measured 3 ms against 0.03 ms on
    8^4 fields on a loaded 2-core machine)."""
    return (a.conj() * b).sum()


def dots(geom, Q, v):
    """[<q, v> for q in Q] with one global reduction (NumPy complex array)."""
    xp = geom.xp
    if not Q:
        return np.zeros(0, dtype=complex)
    loc = xp.stack([xp.asarray(_vdot_local(xp, q, v)) for q in Q])
    return np.asarray(global_sums(geom, loc), dtype=complex).reshape(len(Q))


def norm2(geom, v) -> float:
    return float(dots(geom, [v], v)[0].real)


def gcr_smooth(op, f, x=None, steps: int = 2):
    """x + sum_i alpha_i A^i r minimizing |f - A x'| (r = f - A x; x = 0 when not given). Returns x'."""
    geom, xp = op.geom, op.xp
    if steps <= 0:
        return xp.zeros_like(f) if x is None else x
    r = f if x is None else f - op.apply(x)
    P, Q = [r], []
    for i in range(steps):
        q = op.apply(P[-1])
        Q.append(q)
        if i < steps - 1:
            P.append(q)
    s = len(Q)
    loc = []
    for i in range(s):
        for j in range(i, s):
            loc.append(_vdot_local(xp, Q[i], Q[j]))
    for i in range(s):
        loc.append(_vdot_local(xp, Q[i], r))
    sums = np.asarray(global_sums(geom, xp.stack([xp.asarray(v) for v in loc])), dtype=complex)
    G = np.zeros((s, s), dtype=complex)
    k = 0
    for i in range(s):
        for j in range(i, s):
            G[i, j] = sums[k]
            G[j, i] = np.conj(sums[k])
            k += 1
    c = sums[k:]
    scale = np.sqrt(np.abs(np.diag(G)).clip(min=1e-300))
    Gs = G / np.outer(scale, scale)
    alpha = np.linalg.lstsq(Gs, c / scale, rcond=1e-13)[0] / scale
    out = xp.zeros_like(f) if x is None else x.copy()
    for a, p in zip(alpha, P):
        out += complex(a) * p
    return out


# The recurrence |r - alpha q|^2 = |r|^2 - |<q, r>|^2/|q|^2 subtracts numbers of the size of |r|^2 at the cycle's
# start: its rounding error is ~1e-16 of that, so the estimate stalls near 1e-8 relative residual (measured: 1.85e-8
# on 8^4 while the iterated r reached 2e-16; the solve then ran to the next restart). Below this fraction of the
# cycle's starting |r|^2 it is measured instead (one reduction).
_RECOMPUTE = 1e-10


class FGCRResult:
    __slots__ = ("iters", "residual", "restarts", "converged")

    def __init__(self):
        self.iters, self.residual, self.restarts, self.converged = 0, 1.0, 0, False


def fgcr(apply, precondition, geom, b, tol: float, maxiter: int, nkrylov: int = 16, x=None,
         true_residual: bool = False, on_iteration=None):
    """Flexible GCR for A x = b (``apply``: v -> A v, ``precondition``: r -> approximately A^-1 r).

    Stops when |r| <= tol |b| (iterated residual) or after ``maxiter`` preconditioned directions. With
    ``true_residual`` the residual is recomputed as b - A x at every restart and before stopping; the solve goes on
    while it is above the tolerance. Returns (x, FGCRResult)."""
    xp = geom.xp
    res = FGCRResult()
    bb = norm2(geom, b)
    if bb == 0.0:
        res.residual, res.converged = 0.0, True
        return xp.zeros_like(b), res
    stop = tol * tol * bb
    if x is None:
        x = xp.zeros_like(b)
        r = b.copy()
        rr = bb
    else:
        x = x.copy()
        r = b - apply(x)
        rr = norm2(geom, r)
    Z, Q, QQ = [], [], []
    rr_start = rr
    while True:
        if rr <= stop or res.iters >= maxiter or len(Q) >= nkrylov:
            if true_residual and res.iters > 0:
                r = b - apply(x)
                rr = norm2(geom, r)
            if rr <= stop or res.iters >= maxiter:
                break
            if Q:
                res.restarts += 1
            Z, Q, QQ = [], [], []
            rr_start = rr
        z = precondition(r)
        if z is r:
            z = r.copy()
        q = apply(z)
        if Q:
            c = dots(geom, Q, q) / np.asarray(QQ)
            for cj, qj, zj in zip(c, Q, Z):
                q -= complex(cj) * qj
                z -= complex(cj) * zj
        s = np.asarray(global_sums(geom, xp.stack([xp.asarray(_vdot_local(xp, q, q)),
                                                     xp.asarray(_vdot_local(xp, q, r))])), dtype=complex)
        qq = float(s[0].real)                          # |q|^2 and <q, r> in one reduction
        if not qq > 0 or not math.isfinite(qq):
            break
        alpha = s[1] / qq
        x += complex(alpha) * z
        r -= complex(alpha) * q
        rr = max(rr - abs(s[1]) ** 2 / qq, 0.0)       # |r - alpha q|^2 (q orthogonal to the earlier directions)
        if rr < _RECOMPUTE * rr_start:
            rr = norm2(geom, r)                        # below the recurrence's rounding floor: measure |r|^2
        Z.append(z)
        Q.append(q)
        QQ.append(qq)
        res.iters += 1
        if on_iteration is not None:
            on_iteration(res.iters, math.sqrt(rr / bb))
    res.residual = math.sqrt(rr / bb)
    res.converged = rr <= stop
    return x, res
