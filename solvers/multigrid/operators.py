"""The operators of the multigrid levels.

* :class:`FineStencil`: M = 2m + D (MILC's, docs/conventions.md 1.6) applied to a batch of k vectors at once
  (fields (nt, nz, ny, nx, 3, k)), and hop by hop for the Galerkin construction. It reads the link blocks of the
  :class:`solvers.StaggeredDslash` (per output parity, backward links precomputed) and scatters them once to
  full-lattice arrays, one (3, 3) matrix per hop and site, so a hop is a shift and a batched 3x3 product.
* :class:`KDBlocks`: the Kahler-Dirac block operator X = 2m + D_in, D_in the fat one-link hops that stay inside
  a 2^4 hypercube (four per site), as 48x48 blocks (16 sites x 3 colours, sites x fastest inside the hypercube),
  built from the links and inverted in one batched call; X^-1 is applied as one batched matrix-vector product.
* :class:`LevelOperator` (level 1): A = X^-1 M (or M itself without the KD step), single vectors through the
  StaggeredMatrix (its GPU kernel when one is registered), batches through :class:`FineStencil`.
* :class:`CoarseOperator` (levels >= 2): the 9-point stencil of dense (2Nv)x(2Nv) blocks,
  (A_c c)(a) = Y_0(a) c(a) + sum_mu [Y_+mu(a) c(a + mu) + Y_-mu(a) c(a - mu)].

Every operator offers ``apply(v)`` and ``apply_adjoint(v)`` for single vectors and batches (trailing column axis),
``diag(v)``, ``terms`` (the off-diagonal hops as (mu, step, function)) and ``left(v)`` (a block-diagonal factor
applied after the stencil: X^-1 on the KD level, the identity elsewhere), which is what the Galerkin construction
(:mod:`solvers.multigrid.transfer`) needs.
"""
from __future__ import annotations

import time

import numpy as np

from . import cuda as _cuda
from . import timing
from .lattice import bmm, from_blocks, to_blocks

HYPERCUBE = (2, 2, 2, 2)


class Counter:
    """Applications and seconds spent, per operator (for the per-level statistics)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.applies = 0         # single-vector applications
        self.columns = 0         # vectors applied in batches
        self.time = 0.0


def _col(v, batched):
    return v if batched else v[..., None]


class FineStencil:
    """M = 2m + s D (s = -1 for M^dag) on batches of fine fields; ``terms`` are the 16 (8 without Naik) hops."""

    def __init__(self, M, links=None):
        D = M.dslash
        self.geom, self.xp = D.geom, D.xp
        self.mass = float(M.mass)
        self.sign = D._sign * (-1.0 if M.dagger else 1.0)
        self.hops = list(D.hops)
        self.naik = D.naik
        self.links = self.full_links(D) if links is None else links

    @staticmethod
    def full_links(D):
        """(nhop, nt, nz, ny, nx, 3, 3): the matrix multiplying psi(x + step mu) for each hop, every site."""
        xp, geom = D.xp, D.geom
        nh = len(D.hops)
        full = xp.zeros((nh, geom.local_volume, 3, 3), dtype=D.dtype)
        for p in (0, 1):
            full[:, D._sites[p]] = D._links[p]
        return full.reshape((nh,) + tuple(geom.shape) + (3, 3))

    def converted(self, dtype) -> "FineStencil":
        """The same hops, mass and sign with the links in ``dtype`` (the single-precision cycle's copy)."""
        if self.links.dtype == dtype:
            return self
        s = FineStencil.__new__(FineStencil)
        s.__dict__.update(self.__dict__)
        s.links = self.links.astype(dtype)
        return s

    def with_mass(self, mass):
        s = FineStencil.__new__(FineStencil)
        s.__dict__.update(self.__dict__)
        s.mass = float(mass)
        return s

    def hop(self, h, v):
        """The term of hop h: s * U_h(x) v(x + step mu), v a batch (..., 3, k)."""
        mu, step = self.hops[h]
        out = self.links[h] @ self.geom.shift(v, mu, step)
        if self.sign != 1.0:
            out *= self.sign
        return out

    @property
    def terms(self):
        return [(mu, step, (lambda v, h=h: self.hop(h, v))) for h, (mu, step) in enumerate(self.hops)]

    def diag(self, v):
        return (2 * self.mass) * v

    def apply(self, v, adjoint=False):
        """(2m +- s D) v on a batch (..., 3, k)."""
        geom = self.geom
        out = (2 * self.mass) * v
        sgn = -self.sign if adjoint else self.sign
        for h, (mu, step) in enumerate(self.hops):
            t = self.links[h] @ geom.shift(v, mu, step)
            if sgn == 1.0:
                out += t
            else:
                out -= t
        return out


class KDBlocks:
    """X = 2m + s D_in on the 2^4 hypercubes: ``X`` and ``Xinv`` are (n_hypercubes, 48, 48)."""

    def __init__(self, stencil: FineStencil):
        xp, geom = stencil.xp, stencil.geom
        self.geom, self.xp = geom, xp
        self.mass = stencil.mass
        hops = stencil.hops
        nhc = geom.local_volume // 16
        X = xp.zeros((nhc, 16, 3, 16, 3), dtype=stencil.links.dtype)
        blocked = {}
        for mu in range(4):
            for step in (1, -1):
                blocked[(mu, step)] = to_blocks(stencil.links[hops.index((mu, step))], HYPERCUBE)  # (nhc, 16, 3, 3)
        for s in range(16):
            for mu in range(4):
                up = (s >> mu) & 1 == 0                   # the hop inside the hypercube is +mu from the low corner
                t = s ^ (1 << mu)
                X[:, s, :, t, :] = stencil.sign * blocked[(mu, 1 if up else -1)][:, s]
            X[:, s, :, s, :] += 2 * stencil.mass * xp.eye(3)
        self.X = X.reshape(nhc, 48, 48)
        self.Xinv = xp.linalg.inv(self.X)
        self.Xinv_dag = xp.ascontiguousarray(self.Xinv.conj().swapaxes(-1, -2))
        self.nhc = nhc

    def _blockwise(self, mats, v):
        if _cuda.applies(self.geom, mats, v):              # one kernel (solvers.multigrid.cuda); site-local: any grid
            return _cuda.block_apply(self.geom.backend, mats, v, _cuda.tables(self.geom, self.xp, "hypercubes"))
        batched = v.ndim == 6
        g = to_blocks(_col(v, batched), HYPERCUBE)                    # (nhc, 16, 3, k)
        k = g.shape[-1]
        g = bmm(self.xp, mats, g.reshape(self.nhc, 48, k))
        out = from_blocks(g.reshape(self.nhc, 16, 3, k), HYPERCUBE, self.geom.shape)
        return out if batched else out[..., 0]

    def converted(self, dtype) -> "KDBlocks":
        """X, X^-1 and X^-dag in ``dtype``: rounded from the double-precision inverse (not inverted in single)."""
        if self.X.dtype == dtype:
            return self
        k = KDBlocks.__new__(KDBlocks)
        k.__dict__.update(self.__dict__)
        k.X, k.Xinv, k.Xinv_dag = self.X.astype(dtype), self.Xinv.astype(dtype), self.Xinv_dag.astype(dtype)
        return k

    def apply_X(self, v):
        return self._blockwise(self.X, v)

    def apply_inv(self, v):
        return self._blockwise(self.Xinv, v)

    def apply_inv_adjoint(self, v):
        return self._blockwise(self.Xinv_dag, v)


class LevelOperator:
    """Level 1: A = X^-1 M (``kd`` given) or M (``kd=None``, the negative control) on the fine lattice."""

    level = 1

    def __init__(self, M, stencil: FineStencil, kd: KDBlocks | None, counter: Counter):
        self.M, self.Mdag = M, M.adjoint()
        self.stencil, self.kd = stencil, kd
        self.geom, self.xp = M.geom, M.xp
        self.counter = counter
        self.dof = 3
        self.dtype = M.dtype
        self.flops_per_apply = M.flops + (0 if kd is None else 8 * 48 * 48 * kd.nhc)
        if self.geom.backend.is_gpu:
            timing.use_device(self.geom.backend.synchronize, self.geom.config.mg_timing_sync)   # timing.now

    @property
    def shape(self):
        return tuple(self.geom.shape) + (3,)

    def apply(self, v):
        t0 = time.perf_counter()
        if v.ndim == 6:
            out = self.stencil.apply(v)
            self.counter.columns += v.shape[-1]
        else:
            out = self.M(v)
            self.counter.applies += 1
        if self.kd is not None:
            out = self.kd.apply_inv(out)
        self.counter.time += time.perf_counter() - t0
        return out

    def apply_adjoint(self, v):
        t0 = time.perf_counter()
        if self.kd is not None:
            v = self.kd.apply_inv_adjoint(v)
        if v.ndim == 6:
            out = self.stencil.apply(v, adjoint=True)
            self.counter.columns += v.shape[-1]
        else:
            out = self.Mdag(v)
            self.counter.applies += 1
        self.counter.time += time.perf_counter() - t0
        return out

    # the pieces of the Galerkin construction
    def diag(self, v):
        return self.stencil.diag(v)

    @property
    def terms(self):
        return self.stencil.terms

    def left(self, v):
        return v if self.kd is None else self.kd.apply_inv(v)

    def random(self, rng, k, stream):
        """k Gaussian vectors (..., 3, k), drawn by global site index (independent of the decomposition)."""
        g = rng.gaussian(stream, self.geom.site_ids(), 6 * k)
        g = g.reshape(tuple(self.geom.shape) + (3, k, 2))
        return (g[..., 0] + 1j * g[..., 1]).astype(self.dtype)


class CoarseOperator:
    """A_c = R A P as a 9-point stencil: ``Y`` is (9, Tc, Zc, Yc, Xc, n, n) with Y[0] the site block, Y[1 + 2mu]
    the block that multiplies c(a + mu) and Y[2 + 2mu] the one that multiplies c(a - mu)."""

    def __init__(self, cgeom, Y, counter: Counter, level: int):
        self.geom, self.xp = cgeom, cgeom.xp
        self.Y = Y
        self.n = Y.shape[-1]
        self.dof = self.n
        self.dtype = Y.dtype
        self.counter = counter
        self.level = level
        self._adj = None
        self.flops_per_apply = 9 * 8 * self.n * self.n * cgeom.volume
        if cgeom.backend.is_gpu:
            timing.use_device(cgeom.backend.synchronize, cgeom.config.mg_timing_sync)

    @property
    def stencil_nbytes(self) -> int:
        """The stencil's storage (9 blocks of n x n a site)."""
        return int(self.Y.nbytes)

    @property
    def bytes_per_apply(self) -> int:
        """Bytes one application must move at the least: the stencil read once, the vector read and the result
        written (a level's traffic floor: ``hmc bench mg``'s per-level table)."""
        return self.stencil_nbytes + 2 * self.n * self.geom.volume * np.dtype(self.dtype).itemsize

    def converted(self, dtype) -> "CoarseOperator":
        """The stencil Y in ``dtype`` (same lattice, counter and level)."""
        if self.Y.dtype == dtype:
            return self
        return CoarseOperator(self.geom, self.Y.astype(dtype), self.counter, self.level)

    @property
    def shape(self):
        return tuple(self.geom.shape) + (self.n,)

    @staticmethod
    def index(mu, step):
        return 1 + 2 * mu + (0 if step > 0 else 1)

    def _stencil(self, Y, v):
        geom = self.geom
        if _cuda.applies(geom, Y, v):                                 # one kernel (solvers.multigrid.cuda)
            nb, halo = _cuda.tables(geom, self.xp, "stencil")
            if halo is None:
                return _cuda.stencil(geom.backend, Y, v, nb)
            ext = _cuda.extended(geom, halo, v)                       # one halo exchange, then the same kernel
            return _cuda.stencil(geom.backend, Y, v, nb, ext)
        batched = v.ndim == 6
        w = _col(v, batched)
        xp = self.xp
        out = bmm(xp, Y[0], w)
        for mu in range(4):
            out += bmm(xp, Y[1 + 2 * mu], geom.shift(w, mu, 1))
            out += bmm(xp, Y[2 + 2 * mu], geom.shift(w, mu, -1))
        return out if batched else out[..., 0]

    def apply(self, v):
        t0 = time.perf_counter()
        out = self._stencil(self.Y, v)
        self._count(v, t0)
        return out

    def apply_adjoint(self, v):
        t0 = time.perf_counter()
        out = self._stencil(self.adjoint_stencil(), v)
        self._count(v, t0)
        return out

    def _count(self, v, t0):
        if v.ndim == 6:
            self.counter.columns += v.shape[-1]
        else:
            self.counter.applies += 1
        self.counter.time += time.perf_counter() - t0

    def adjoint_stencil(self):
        """The stencil of A_c^dag: Y'_0 = Y_0^dag, Y'_+mu(a) = Y_-mu(a + mu)^dag, Y'_-mu(a) = Y_+mu(a - mu)^dag."""
        if self._adj is None:
            xp, geom, Y = self.xp, self.geom, self.Y

            def dag(a):
                return a.conj().swapaxes(-1, -2)

            A = xp.empty_like(Y)
            A[0] = dag(Y[0])
            for mu in range(4):
                A[1 + 2 * mu] = dag(geom.shift(Y[2 + 2 * mu], mu, 1))
                A[2 + 2 * mu] = dag(geom.shift(Y[1 + 2 * mu], mu, -1))
            self._adj = A
        return self._adj

    def diag(self, v):
        return self.Y[0] @ v

    @property
    def terms(self):
        out = []
        for mu in range(4):
            for step in (1, -1):
                Yd = self.Y[self.index(mu, step)]
                out.append((mu, step, (lambda v, Yd=Yd, mu=mu, step=step: Yd @ self.geom.shift(v, mu, step))))
        return out

    def left(self, v):
        return v

    def random(self, rng, k, stream):
        g = rng.gaussian(stream, self.geom.site_ids(), 2 * self.n * k)
        g = g.reshape(tuple(self.geom.shape) + (self.n, k, 2))
        return (g[..., 0] + 1j * g[..., 1]).astype(self.dtype)

    # the exact coarsest solve ---------------------------------------------------------------------------------
    def sparse_matrix(self):
        """The operator on the whole coarse lattice as a scipy.sparse CSR matrix on the host, the same on every
        rank (the stencil blocks are gathered from all ranks: collective); unknowns ordered as the global field
        (site in (t, z, y, x) order, then the n components)."""
        import scipy.sparse as sp

        geom = self.geom
        xp = self.xp
        Y = geom.gather_all(xp.moveaxis(self.Y, 0, 4))               # (T, Z, Y, X, 9, n, n), global
        Y = np.moveaxis(Y, 4, 0)
        n = self.n
        shape = Y.shape[1:5]
        nsite = int(np.prod(shape))
        ids = np.arange(nsite).reshape(shape)
        rows, cols, vals = [], [], []
        r_idx = (ids.reshape(-1, 1, 1) * n + np.arange(n).reshape(1, n, 1))
        for d in range(9):
            if d == 0:
                nb = ids
            else:
                mu, step = (d - 1) // 2, (1 if (d - 1) % 2 == 0 else -1)
                nb = np.roll(ids, -step, axis=3 - mu)
            c_idx = nb.reshape(-1, 1, 1) * n + np.arange(n).reshape(1, 1, n)
            rows.append(np.broadcast_to(r_idx, (nsite, n, n)).ravel())
            cols.append(np.broadcast_to(c_idx, (nsite, n, n)).ravel())
            vals.append(Y[d].reshape(nsite, n, n).ravel())
        N = nsite * n
        return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(N, N))
