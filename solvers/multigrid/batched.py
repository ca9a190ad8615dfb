"""Batched right-hand sides in the solve phase: k columns through ONE outer flexible GCR and K-cycle, each column
with its own Krylov coefficients, every operator applied once per iteration to all k columns (the coarse stencils,
transfers and X^-1 take k columns: docs/multigrid.md 'Batched right-hand sides').

:func:`solve_columns` is :meth:`MultigridInverse.solve` for B (..., 3, k): the same set-up (one for all columns),
the same cycle (:mod:`.solver`'s K-cycle written for column blocks), and per column the iteration of
:func:`.krylov.fgcr`: alpha_j = <q_j, r_j>/|q_j|^2, classical Gram-Schmidt coefficients per column, one reduction
for all columns' dots. A column that has met its tolerance is frozen (its coefficients are zero) while the others
go on; the true residual of every column is recomputed at each restart and at the end, and a frozen column whose
true residual is above the tolerance is thawed. On the CPU the batched products are the single-column ones
(:func:`.lattice.bmm`), so each column follows its single solve to rounding
(tests/solvers/test_multigrid_batched_solve.py: same outer counts within 1).
"""
from __future__ import annotations

import math
import time

import numpy as np

from .krylov import _RECOMPUTE
from .lattice import global_sums


def col_sums(geom, pairs):
    """[sum_sites conj(a) b per column for (a, b) in pairs] as a (len(pairs), k) NumPy array, one reduction."""
    xp = geom.xp
    loc = xp.stack([(a.conj() * b).reshape(-1, a.shape[-1]).sum(axis=0) for a, b in pairs])
    return np.asarray(global_sums(geom, loc), dtype=complex).reshape(len(pairs), -1)


def _scaled(xp, coef, v):
    """v (..., k) with column j multiplied by coef[j]."""
    return v * xp.asarray(coef.astype(v.dtype if v.dtype.kind == "c" else complex))


def gcr_smooth_columns(op, F, X, steps):
    """:func:`.krylov.gcr_smooth` per column: the basis r, A r, ..., A^(s-1) r of each column, one reduction for
    every column's Gram matrix, a least-squares solve per column."""
    geom = op.geom
    if steps <= 0:
        return X
    R = F - op.apply(X)
    P, Q = [R], []
    for i in range(steps):
        Q.append(op.apply(P[-1]))
        if i < steps - 1:
            P.append(Q[-1])
    s = len(Q)
    pairs = [(Q[i], Q[j]) for i in range(s) for j in range(s)] + [(Q[i], R) for i in range(s)]
    sums = col_sums(geom, pairs)
    G, c = sums[:s * s].reshape(s, s, -1), sums[s * s:]
    alpha = np.zeros((s, F.shape[-1]), dtype=complex)           # (basis vector, column), on the host
    for j in range(F.shape[-1]):
        Gj = G[:, :, j]
        scale = np.sqrt(np.abs(np.diag(Gj)).clip(min=1e-300))
        alpha[:, j] = np.linalg.lstsq(Gj / np.outer(scale, scale), c[:, j] / scale, rcond=1e-13)[0] / scale
    out = X.copy()
    for a, p in zip(alpha, P):                  # one update of all k columns per basis vector (not one per column)
        out += _scaled(geom.xp, a, p)
    return out


def fgcr_columns(apply, precondition, geom, B, tol, maxiter, nkrylov, true_residual=False):
    """Flexible GCR on the k columns of B at once (module docstring). Returns (X, iterations per column)."""
    xp = geom.xp
    k = B.shape[-1]
    bb = col_sums(geom, [(B, B)])[0].real
    stop = tol * tol * bb
    X, R, rr = xp.zeros_like(B), B.copy(), bb.copy()
    iters = np.zeros(k, dtype=int)
    active = rr > stop
    Z, Q, QQ, rr_start, n = [], [], [], rr.copy(), 0
    while True:
        if not active.any() or n >= maxiter or len(Q) >= nkrylov:
            if true_residual and n > 0:
                R = B - apply(X)
                rr = col_sums(geom, [(R, R)])[0].real
            active = rr > stop
            if not active.any() or n >= maxiter:
                break
            Z, Q, QQ, rr_start = [], [], [], rr.copy()
        z = precondition(R)
        q = apply(z)
        if Q:
            c = col_sums(geom, [(qj, q) for qj in Q]) / np.asarray(QQ)
            for cj, qj, zj in zip(c, Q, Z):
                q = q - _scaled(xp, cj, qj)
                z = z - _scaled(xp, cj, zj)
        s = col_sums(geom, [(q, q), (q, R)])
        qq = s[0].real
        ok = active & (qq > 0) & np.isfinite(qq)
        safe = np.where(ok, qq, 1.0)
        alpha = np.where(ok, s[1] / safe, 0.0)
        X = X + _scaled(xp, alpha, z)
        R = R - _scaled(xp, alpha, q)
        rr = np.where(ok, np.maximum(rr - np.abs(s[1]) ** 2 / safe, 0.0), rr)
        if (ok & (rr < _RECOMPUTE * rr_start)).any():
            rr = np.where(ok, col_sums(geom, [(R, R)])[0].real, rr)
        Z.append(z)
        Q.append(q)
        QQ.append(safe)
        iters += ok
        n += 1
        active = ok & (rr > stop)
    return X, iters


class _Cycle:
    """The K-cycle of a :class:`.solver.MultigridInverse`'s hierarchy on column blocks (its ``_cycle`` and
    ``_precondition``, column-wise)."""

    def __init__(self, inv):
        self.inv, self.h, self.p = inv, inv.hierarchy, inv.params

    def coarsest(self, F):
        cyc = self.h.cycle
        op = cyc.ops[-1]
        lu = cyc.lu
        if lu is None:
            p = self.p
            return fgcr_columns(op.apply, lambda r: r, op.geom, F, p.coarsest_tol, p.coarsest_maxiter,
                                p.coarsest_maxiter)[0]
        geom, xp = op.geom, op.xp
        k = F.shape[-1]
        if getattr(lu, "on_device", False) and geom.grid.active_comm.size == 1:
            return lu.apply_columns(F.reshape(-1, k)).reshape(F.shape)
        rhs = geom.gather_all(F)
        y = lu.solve(np.asarray(rhs).reshape(-1, k)).reshape(rhs.shape)
        return xp.ascontiguousarray(xp.asarray(geom.local_part(y), dtype=op.dtype))

    def cycle(self, l, F):
        cyc, p = self.h.cycle, self.p
        L = len(cyc.ops) - 1
        if l == L:
            return self.coarsest(F)
        Fc = cyc.transfers[l - 1].restrict(F)
        if l + 1 == L:
            Y = self.coarsest(Fc)
        else:
            opc = cyc.ops[l + 1]
            Y = fgcr_columns(opc.apply, lambda r: self.cycle(l + 1, r), opc.geom, Fc, p.kcycle_tol,
                             p.kcycle_maxiter, p.kcycle_maxiter)[0]
        X = cyc.transfers[l - 1].prolong(Y)
        return gcr_smooth_columns(cyc.ops[l], F, X, p.steps(l))

    def precondition(self, R):
        cyc = self.h.cycle
        Rc = cyc.to_cycle(R)
        F = Rc if cyc.kd is None else cyc.kd.apply_inv(Rc)
        E = self.cycle(1, F)
        steps = self.p.steps(0)
        if steps > 0:
            E = gcr_smooth_columns(_FineColumns(cyc.ops[1].stencil), Rc, E, steps)
        return cyc.to_outer(E, R.dtype)


class _FineColumns:
    """M on column blocks (the batched fine stencil), as an operator for :func:`gcr_smooth_columns`."""

    def __init__(self, stencil):
        self.stencil, self.geom, self.xp = stencil, stencil.geom, stencil.xp
        self.columns = 0

    def apply(self, v):
        self.columns += v.shape[-1]
        return self.stencil.apply(v)


def solve_columns(inv, B):
    """M X = B for the k columns of B (..., 3, k) with one set-up and one batched outer flexible GCR; returns
    (X, info): info holds ``iters`` (outer iterations per column), ``true_residual`` (per column), ``solve_time``,
    ``fine_columns`` (columns of M applied by the outer solve), ``level_columns`` (columns applied per level of
    the hierarchy: level 0 the outer solve's, then the K-cycle's), ``flops`` (of those applications), and the set-up this call triggered
    (``setup``, ``setup_time``, ``setup_fine_applies``: as :class:`.solver.MultigridStats`)."""
    inv.setup()
    pending, inv._pending = inv._pending, []
    p, h = inv.params, inv.hierarchy
    for c in h.counters:
        c.reset()
    geom = inv.op.geom
    B = geom.xp.asarray(B).astype(inv.op.dtype, copy=False)
    fine = _FineColumns(h.ops[1].stencil.with_mass(inv.mass))
    t0 = time.perf_counter()
    X, iters = fgcr_columns(fine.apply, _Cycle(inv).precondition, geom, B, p.tol, p.maxiter, p.nkrylov,
                            true_residual=True)
    geom.backend.synchronize()
    solve_time = time.perf_counter() - t0
    level_columns = [fine.columns] + [c.columns + c.applies for c in h.counters[1:]]
    flops = fine.columns * inv.op.flops + sum(n * op.flops_per_apply for n, op in zip(level_columns[1:], h.ops[1:]))
    R = B - fine.apply(X)
    rr, bb = col_sums(geom, [(R, R), (B, B)]).real
    true = [math.sqrt(a / b) if b > 0 else 0.0 for a, b in zip(rr, bb)]
    return X, {"iters": [int(i) for i in iters], "true_residual": true, "solve_time": solve_time,
               "fine_columns": fine.columns, "level_columns": level_columns, "flops": float(flops),
               "setup": ",".join(w for w, _, _ in pending) or "reused", "setup_time": sum(t for _, t, _ in pending),
               "setup_fine_applies": sum(c for _, _, c in pending)}
