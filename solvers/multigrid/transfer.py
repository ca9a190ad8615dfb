"""Near-null vectors, the prolongator P and restrictor R = P^dag, and the Galerkin coarse operator R A P.

Near-null vectors (docs/multigrid.md "The hierarchy", 3.): Nv Gaussian random vectors (drawn by global site index, so
the same for every decomposition), each relaxed by iterations of CG on the normal equations A^dag A x = 0 of the
level's operator, all Nv at once (one batched application of A and of A^dag per iteration, one reduction of the Nv
norms). The vectors are kept unnormalized per aggregate, so a later refresh (after a gauge update) continues
from them.

Transfer: each vector is split by parity on the KD level (by chirality, the two halves of the coarse unknowns,
below) and orthonormalized per aggregate and parity by two passes of classical Gram-Schmidt (CGS2), all aggregates
at once. P maps a coarse field of 2 Nv unknowns per site to the level's field (P c = sum_j V_j c_j per aggregate
and parity); its columns are orthonormal, so R P = 1 and R = P^dag.

Galerkin operator: A_c = R A P is a 9-point stencil when each hop of A reaches at most the neighbouring aggregate.
It is built by probing with all 2 Nv unit coarse vectors at once (the columns of P as level fields, E): for each
direction, the hops that leave the aggregate (masked by :func:`outside_mask`) give the neighbour block
Y_+-mu = R left(sum_h mask_h hop_h E), and the site block is Y_0 = R A E - sum of the eight neighbour blocks. With
the Naik term the 3-hops are included in the same way, which needs aggregates at least 3 sites wide.
"""
from __future__ import annotations

import math

import numpy as np

from .lattice import CoarseBlocker, CoarseGeometry, FineBlocker, bmm, global_sums, outside_mask
from .operators import CoarseOperator, Counter


def _norms2(geom, v):
    """Global |v_j|^2 of each column of a batch (..., k), one reduction."""
    xp = geom.xp
    local = (v.real * v.real + v.imag * v.imag).reshape(-1, v.shape[-1]).sum(axis=0)
    return xp.asarray(global_sums(geom, local))


# CG on A^dag A x = 0 drives x to 0: |x| falls ~1e12-fold in 300 iterations on 8^4, while the recursive residual
# r_k = r_{k-1} - alpha A^dag A p keeps rounding errors of the size of eps |r_0|, so once |r| is ~1e-16 of |r_0| the
# recursion no longer follows the true residual and the iterate drifts away from the low modes (l8888 at
# m = 0.001, four vectors, no restart: |A v|/|v| 0.24 after 50 iterations, 0.23 after 150, 0.41 after 200, 0.90
# after 300). Hence CG restarts, each column scaled back to unit norm and its residual recomputed as -A^dag A x,
# every RELAX_RESTART iterations, or earlier when a column's |r|^2 has fallen below RELAX_FLOOR of its value at the
# restart (|r| by 1e-7: the recursion's error stays below ~1e-9 relative; on 4^4 at m = 0.001, where the spectrum
# lies higher, |r| falls 1e11-fold in 50 iterations).
#
# Exact residuals do not make more iterations better, though: CG minimizes |A x| over x_0 + K, not |A x|/|x|, and
# once the lowest modes dominate |A x| it removes them too. On mg_bench's 12^4 field (m = 0.001, four vectors)
# restarted CG gives |A v|/|v| 0.080..0.087 after 50 iterations, 0.106..0.142 after 150 and 0.100..0.121 after
# 200 (without restarts 0.140..0.154 after 150). So each vector's quotient is measured at every restart (from the
# A x the restart needs anyway) and a vector whose cycle did not lower it keeps its best iterate and stops
# relaxing: more iterations never give a worse vector, and a refresh after a gauge update never spoils a good one.
RELAX_RESTART = 50
RELAX_FLOOR = 1e-14


def relax_null_vectors(op, x, iters: int, restart: int = RELAX_RESTART, floor: float = RELAX_FLOOR, report=None):
    """Up to ``iters`` iterations of CG on A^dag A x = 0 for every column of the batch x (..., k), independently,
    restarted from the unit-normalized iterate and its true residual every ``restart`` iterations or when a
    column's |r|^2 falls below ``floor`` times its value at the restart; a column whose cycle did not lower
    |A x|/|x| goes back to its best iterate and stops (see RELAX_RESTART). Returns the batch of best iterates, each
    column of unit norm. ``report(i)``, if given, is called after each CG iteration i (1, 2, ... of ``iters``)."""
    geom, xp = op.geom, op.xp
    restart = max(1, int(restart))
    best = _unit_columns(geom, x)
    if iters <= 0:
        return best
    ax = op.apply(best)
    qbest = _norms2(geom, ax)                                  # |A x|^2 of the unit columns
    act = xp.arange(best.shape[-1])                            # the columns still relaxing
    xa = best
    done = 0
    while done < iters and act.size:
        xa, _, n = _cg_normal_null(op, xa.copy(), -op.apply_adjoint(ax), min(restart, iters - done), floor,
                                   None if report is None else (lambda it, d=done: report(d + it)))
        done += n
        xa = _unit_columns(geom, xa)
        ax = op.apply(xa)
        q = _norms2(geom, ax)
        keep = xp.flatnonzero(q < qbest[act])                 # integer indices (NumPy and CuPy alike)
        act = act[keep]
        best[..., act] = xa[..., keep]
        qbest[act] = q[keep]
        xa, ax = xa[..., keep], ax[..., keep]
    return best


def _unit_columns(geom, x):
    xp = geom.xp
    nrm = xp.sqrt(_norms2(geom, x))
    return x / xp.where(nrm > 0, nrm, 1.0)


def _cg_normal_null(op, x, r, iters: int, floor: float = 0.0, report=None):
    """At most ``iters`` iterations of CG on A^dag A x = 0 from x with residual r = -A^dag A x (each column its own
    CG: alpha, beta per column), r updated recursively; stops early (after at least one iteration) when a column's
    |r|^2 falls below ``floor`` times its starting value; ``report(it)`` after each iteration. Returns (x and r, both
    updated in place, iterations)."""
    geom, xp = op.geom, op.xp
    p = r.copy()
    rr = _norms2(geom, r)
    stop = floor * rr
    for it in range(1, iters + 1):
        q = op.apply(p)
        qq = _norms2(geom, q)
        alpha = xp.where(qq > 0, rr / xp.where(qq > 0, qq, 1.0), 0.0)
        x += alpha * p
        r -= alpha * op.apply_adjoint(q)
        rr_new = _norms2(geom, r)
        if report is not None:
            report(it)
        if bool((rr_new < stop).any()):
            return x, r, it
        beta = xp.where(rr > 0, rr_new / xp.where(rr > 0, rr, 1.0), 0.0)
        p *= beta
        p += r
        rr = rr_new
    return x, r, iters


def orthonormalize(V, xp=np, passes: int = 2):
    """Orthonormalize the columns of V (..., m, k) in place for every leading index: ``passes`` rounds of
    classical Gram-Schmidt per column (CGS2). Returns V."""
    k = V.shape[-1]
    for j in range(k):
        v = V[..., j]
        for _ in range(passes):
            if j > 0:
                Q = V[..., :j]
                c = (Q.conj() * v[..., :, None]).sum(axis=-2)            # Q^dag v
                v = v - (Q * c[..., None, :]).sum(axis=-1)
        nrm = xp.sqrt((v.real * v.real + v.imag * v.imag).sum(axis=-1))
        if bool((nrm == 0).any()):
            raise FloatingPointError("a near-null vector vanishes on an aggregate: it cannot be orthonormalized "
                                     "(use more set-up iterations or fewer vectors)")
        V[..., j] = v / nrm[..., None]
    return V


class Transfer:
    """P and R = P^dag between a level (operator ``op``, fields op.shape) and the coarse lattice of blocks
    ``block``; ``vectors`` is the batch (op.shape..., Nv) of near-null vectors."""

    def __init__(self, op, block, vectors):
        geom = op.geom
        self.fine_geom = geom
        self.block = tuple(block)
        self.nv = int(vectors.shape[-1])
        if op.level == 1:
            self.blocker = FineBlocker(geom, self.block)
            self.cgeom = CoarseGeometry(geom, self.block)
        else:
            self.blocker = CoarseBlocker(geom, self.block, op.dof // 2)
            self.cgeom = CoarseGeometry(geom.fine, tuple(b * c for b, c in zip(self.block, geom.block)))
        V = self.blocker.split(vectors)                                 # (nagg, 2, m, Nv)
        self.V = orthonormalize(geom.xp.array(V), geom.xp)
        self.Vh = self.V.conj().swapaxes(-1, -2).copy()                # (nagg, 2, Nv, m)
        self.nagg = self.blocker.nagg
        self.n = 2 * self.nv

    def converted(self, dtype) -> "Transfer":
        """The same P and R with the orthonormalized vectors stored in ``dtype`` (a mixed-precision cycle's copy;
        orthonormal to that precision's rounding)."""
        dtype = np.dtype(dtype)
        if self.V.dtype == dtype:
            return self
        t = Transfer.__new__(Transfer)
        t.__dict__.update(self.__dict__)
        t.V = self.V.astype(dtype)
        t.Vh = self.Vh.astype(dtype)
        return t

    def restrict(self, f):
        batched = f.ndim == 6
        g = self.blocker.split(f if batched else f[..., None])        # (nagg, 2, m, k)
        c = bmm(self.cgeom.xp, self.Vh, g)                              # (nagg, 2, Nv, k)
        k = c.shape[-1]
        c = c.reshape(tuple(self.cgeom.shape) + (self.n, k))
        return c if batched else c[..., 0]

    def prolong(self, c):
        batched = c.ndim == 6
        cc = c if batched else c[..., None]
        k = cc.shape[-1]
        g = bmm(self.cgeom.xp, self.V, cc.reshape(self.nagg, 2, self.nv, k))   # (nagg, 2, m, k)
        f = self.blocker.merge(g)
        return f if batched else f[..., 0]

    def columns(self, cols=None):
        """P applied to the coarse unit vectors of the chosen columns (all 2 Nv by default) on every coarse site
        at once: the batch (fine shape..., len(cols))."""
        xp = self.cgeom.xp
        cols = list(range(self.n)) if cols is None else list(cols)
        e = xp.zeros((self.n, len(cols)), dtype=self.V.dtype)
        e[xp.asarray(cols), xp.arange(len(cols))] = 1.0
        c = xp.broadcast_to(e, tuple(self.cgeom.shape) + e.shape)
        return self.prolong(xp.ascontiguousarray(c))


def galerkin(op, transfer: Transfer, counter: Counter | None = None, level: int = 2, chunk: int | None = None):
    """The coarse operator R A P of ``op`` as a :class:`CoarseOperator` (9-point stencil)."""
    cgeom = transfer.cgeom
    xp = cgeom.xp
    n = transfer.n
    Y = xp.zeros((9,) + tuple(cgeom.shape) + (n, n), dtype=transfer.V.dtype)
    masks = {}
    chunk = n if chunk is None else max(1, int(chunk))
    for c0 in range(0, n, chunk):
        cols = list(range(c0, min(n, c0 + chunk)))
        E = transfer.columns(cols)                                       # (fine..., dof, kc)
        if op.counter is not None:
            op.counter.columns += len(cols)                              # every hop once: one application
        AE = op.diag(E)
        dirs = {}
        for mu, step, term in op.terms:
            t = term(E)
            AE += t
            key = (mu, 1 if step > 0 else -1)
            if (mu, step) not in masks:
                masks[(mu, step)] = outside_mask(op.geom, transfer.block, mu, step)[..., None]
            t = t * masks[(mu, step)]
            dirs[key] = t if key not in dirs else dirs[key] + t
        total = transfer.restrict(op.left(AE))                           # (coarse..., n, kc)
        for (mu, s), t in dirs.items():
            d = CoarseOperator.index(mu, s)
            Yd = transfer.restrict(op.left(t))
            Y[d][..., cols] = Yd
            total = total - Yd
        Y[0][..., cols] = total
    return CoarseOperator(cgeom, Y, counter if counter is not None else Counter(), level)


def orthonormality_error(transfer: Transfer) -> float:
    """max |V^dag V - 1| over aggregates and parities."""
    xp = transfer.cgeom.xp
    g = transfer.Vh @ transfer.V
    return float(xp.abs(g - xp.eye(transfer.nv)).max())


def relative(geom, a, b) -> float:
    """|a - b| / |b| over the whole (batched) field, global."""
    d = a - b
    num = global_sums(geom, (d.real * d.real + d.imag * d.imag).sum())
    den = global_sums(geom, (b.real * b.real + b.imag * b.imag).sum())
    return math.sqrt(float(num) / float(den))
