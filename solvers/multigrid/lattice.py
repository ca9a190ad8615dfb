"""Lattices of the multigrid levels and the reshapes between a level's fields and its aggregates.

Field layouts (site axes first, as everywhere in the project, so that ``geom.shift`` reaches neighbours):

* fine and KD level: a colour-vector field (nt, nz, ny, nx, 3), optionally with a trailing column axis (..., 3, k)
  for a batch of k vectors (near-null vectors, probing);
* aggregation level l >= 2: (Tc, Zc, Yc, Xc, 2 Nv) [, k]: per coarse site the Nv coefficients of the even-parity
  (first half) and of the odd-parity (second half) near-null vectors; on coarser levels the halves are the
  "chiralities" inherited from the level above (QUDA's spin 2 on coarse staggered levels).

A coarse lattice is described by :class:`CoarseGeometry`: its extents, the same process grid as the fine lattice
(a coarse site belongs to the rank that holds its aggregate), neighbour shifts and halos through the lattice's stencil
(:class:`comms.stencil.Stencil`, from :class:`lattice.geometry.SiteLattice`, so every transport works) and global sums through
``geom.sum``/``grid.sum``. Coarse extents may be 1 or odd, which :class:`lattice.Geometry` does not allow.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from lattice.geometry import DIRS, SiteLattice, site_axis

from . import timing


class MultigridError(ValueError):
    """Bad multigrid parameters (one-line message that names the constraint that failed)."""


class CoarseGeometry(SiteLattice):
    """The lattice of one coarse level: global extents ``dims`` (x, y, z, t), this rank's ``local_dims``, the
    fine geometry's process grid and backend. Shape, coordinates and shifts come from
    :class:`lattice.geometry.SiteLattice`, as for the fine :class:`lattice.Geometry`; sums go to the fine one."""

    def __init__(self, fine, block):
        self.fine = fine
        self.backend, self.grid, self.config = fine.backend, fine.grid, fine.config
        self.block = tuple(int(b) for b in block)
        self.dims = tuple(n // b for n, b in zip(fine.dims, self.block))
        self.local_dims = tuple(n // b for n, b in zip(fine.local_dims, self.block))
        self.offset = tuple(o // b for o, b in zip(fine.offset, self.block))

    def sum(self, a):
        return self.fine.sum(a)

    def shift(self, f, mu: int, step: int = 1):
        """:meth:`SiteLattice.shift`; on a partitioned dimension (a halo exchange through ``comms``) its time is
        charged to the active level clock (:mod:`.timing`)."""
        if not self.grid.partitioned[mu]:
            return super().shift(f, mu, step)
        t0 = timing.now()
        out = super().shift(f, mu, step)
        timing.charge_halo(timing.now() - t0)
        return out

    def gather_all(self, a):
        """The global site array (site axes first) of the local blocks ``a`` on every rank (NumPy). Collective."""
        be = self.backend
        a = be.to_numpy(a)
        grid = self.grid
        if grid.active_comm.size == 1:
            return a
        blocks = grid.active_comm.allgather((grid.coords, a))
        nx, ny, nz, nt = self.dims
        out = np.empty((nt, nz, ny, nx) + a.shape[4:], dtype=a.dtype)
        lx, ly, lz, lt = self.local_dims
        for (cx, cy, cz, ct), blk in blocks:
            out[ct * lt:(ct + 1) * lt, cz * lz:(cz + 1) * lz, cy * ly:(cy + 1) * ly, cx * lx:(cx + 1) * lx] = blk
        return out

    def local_part(self, a):
        """This rank's block of a global site array."""
        (ox, oy, oz, ot), (lx, ly, lz, lt) = self.offset, self.local_dims
        return a[ot:ot + lt, oz:oz + lz, oy:oy + ly, ox:ox + lx]

    def __repr__(self):
        return f"<coarse lattice {'x'.join(map(str, self.dims))} (blocks {'x'.join(map(str, self.block))})>"


def global_sums(geom, local):
    """Global sums of a (small) array of per-rank partial sums, in one reduction; returns a NumPy array.

    Batched reductions of the multigrid (Gram matrices of the smoothers, per-vector norms of the set-up) go
    through the grid's allreduce in one message; their rounding depends on the rank count (the "fast" mode of
    :mod:`solvers.operator`)."""
    be = geom.backend
    t0 = timing.now()
    a = be.to_numpy(local)
    out = np.asarray(geom.grid.sum(a))
    timing.charge_reduce(timing.now() - t0)
    return out


#: on the CPU a batch of at most this many columns (right-hand sides solved together: 12 in issue 18's measurement)
#: is multiplied column by column exactly as one column is; wider batches (the set-up's Nv and 2 Nv columns) use BLAS
EXACT_COLUMNS = 16


def bmm(xp, A, B):
    """A @ B for stacks of small matrices, A (..., n, m), B (..., m, k).

    On the CPU, up to :data:`EXACT_COLUMNS` columns, the product is an einsum on B's columns laid out as rows
    (..., k, m), so that every output element is the same length-m run of products summed in the same order whatever
    k is: k columns at once give bitwise the k single-column products (one coarse application of a k-column block
    equals k applications; tests/solvers/test_multigrid_batched.py). It also keeps the solve phase outside BLAS:
    NumPy's matmul calls BLAS once per matrix of the stack, and a threaded BLAS on a CPU shared with other jobs then
    waits for its threads at every call (measured 0.2 s against 0.3 ms for one restriction on 8^4 on a loaded
    2-core machine). Wider batches keep matmul (BLAS GEMMs; about 3x faster than the einsum for 48 columns)."""
    k = B.shape[-1]
    if xp is np and k <= EXACT_COLUMNS:
        rows = B[..., 0][..., None, :] if k == 1 else np.ascontiguousarray(np.swapaxes(B, -1, -2))
        return np.ascontiguousarray(np.swapaxes(np.einsum("...ij,...kj->...ki", A, rows), -1, -2))
    if products_by_kernel(xp):
        from lattice import get_backend

        return batched_matmul(get_backend("cupy"), A, B)     # (CuPy refuses cuBLAS inside a capture)
    return A @ B


THREADS = 256
_KERNEL_PRODUCTS = [False]


def products_by_kernel(xp) -> bool:
    """Whether the device's dense products go to kernels/dense_products.cu rather than cuBLAS: inside
    :func:`kernel_products` (the one dispatch rule of :func:`bmm` and the dense coarsest inverse; a flag, not a
    query of the stream's capture state, so the eager path pays no driver call)."""
    return _KERNEL_PRODUCTS[0] and xp is not np


@contextmanager
def kernel_products():
    """Within: :func:`bmm` and the coarsest dense inverse on the device by :func:`batched_matmul`, not cuBLAS. The
    multigrid's graphs (solvers/multigrid/graph.py) run a step's warm-up and its capture inside, so that the kernels
    are compiled and every block the capture takes from the level's pool is allocated before the capture."""
    old, _KERNEL_PRODUCTS[0] = _KERNEL_PRODUCTS[0], True
    try:
        yield
    finally:
        _KERNEL_PRODUCTS[0] = old


def batched_matmul(backend, A, B):
    """A @ B for stacks of small complex matrices with the same stack shape, A (..., n, m) and B (..., m, k), by
    kernels/dense_products.cu (bmm_partial, then the chunk sums in order): what :func:`bmm` and the coarsest dense
    inverse run inside a CUDA-graph capture, where CuPy refuses cuBLAS."""
    from lattice import cuda_source

    xp = backend.xp
    if A.shape[:-2] != B.shape[:-2] or A.dtype != B.dtype or A.dtype not in (np.complex128, np.complex64):
        raise ValueError(f"batched_matmul: stacks {A.shape} @ {B.shape} ({A.dtype}, {B.dtype}) of one shape and "
                         "complex dtype only")
    n, m, k = (int(v) for v in (A.shape[-2], A.shape[-1], B.shape[-1]))
    batch = int(np.prod(A.shape[:-2]))
    A, B = xp.ascontiguousarray(A), xp.ascontiguousarray(B)
    nchunk = max(1, min(64, m // 8, (1 << 16) // max(1, batch * n * k)))     # ~64k threads for the partial sums
    part = xp.empty((nchunk, batch * n, k), dtype=A.dtype)
    out = xp.empty(A.shape[:-1] + (k,), dtype=A.dtype)
    suf = "double" if A.dtype == np.complex128 else "single"

    def launch(name, threads, args):
        fn = cuda_source.function(backend, "solvers.multigrid", "dense_products.cu", f"{name}_{suf}")
        fn(((threads + THREADS - 1) // THREADS,), (THREADS,), args)

    launch("bmm_partial", part.size, (A, B, part, np.int32(batch), np.int32(n), np.int32(m), np.int32(k),
                                      np.int32(nchunk)))
    launch("chunk_sum", out.size, (part, out, np.int64(out.size), np.int32(nchunk)))
    return out


def check_blocks(local, block, naik: bool, first: bool, level: int):
    """Validate one aggregation block (x, y, z, t extents, in sites of the level below, whose local extents are
    ``local``); one-line errors."""
    try:
        block = tuple(int(b) for b in block)
    except (TypeError, ValueError):
        raise MultigridError(f"level {level}: block {block!r} must be four integers (x y z t)") from None
    if len(block) != 4:
        raise MultigridError(f"level {level}: block {block} must have four extents (x y z t), not {len(block)}")
    for mu, (b, n) in enumerate(zip(block, local)):
        d = DIRS[mu]
        if b < 1:
            raise MultigridError(f"level {level}: block extent {b} in direction {d} must be positive")
        if first and b % 2:
            raise MultigridError(f"level {level}: block extent {b} in direction {d} is odd: aggregates must be "
                                 "whole 2^4 Kahler-Dirac hypercubes (even extents)")
        if n % b:
            raise MultigridError(f"level {level}: block extent {b} in direction {d} does not tile the local "
                                 f"extent {n} (local volume {'x'.join(map(str, local))}): choose a divisor")
        if first and naik and b < 3:
            raise MultigridError(f"level {level}: block extent {b} in direction {d} is narrower than 3: with the "
                                 "Naik term a 3-hop must reach only the neighbouring aggregate (use 4 or more)")
    return block


def check_hypercubes(geom):
    for mu, n in enumerate(geom.local_dims):
        if n % 2:
            raise MultigridError(f"local extent {n} in direction {DIRS[mu]} is odd: the Kahler-Dirac blocking needs "
                                 "whole 2^4 hypercubes on every rank (choose a process grid with even local extents)")


# ------------------------------------------------------------------------------------------------ blocking
def _block_axes(shape4, block):
    """Reshape (nt, nz, ny, nx) -> (nt/bt, bt, nz/bz, bz, ny/by, by, nx/bx, bx)."""
    bx, by, bz, bt = block
    nt, nz, ny, nx = shape4
    return (nt // bt, bt, nz // bz, bz, ny // by, by, nx // bx, bx)


def to_blocks(f, block):
    """(nt, nz, ny, nx, *rest) -> (nblocks, block_volume, *rest); blocks in (T, Z, Y, X) order, sites in a
    block x fastest."""
    shape4, rest = f.shape[:4], f.shape[4:]
    g = f.reshape(_block_axes(shape4, block) + rest)
    nr = len(rest)
    g = g.transpose((0, 2, 4, 6, 1, 3, 5, 7) + tuple(range(8, 8 + nr)))
    return g.reshape((-1, int(np.prod(block))) + rest)


def from_blocks(g, block, shape4):
    """The inverse of :func:`to_blocks`."""
    rest = g.shape[2:]
    nt, nz, ny, nx = shape4
    bx, by, bz, bt = block
    h = g.reshape((nt // bt, nz // bz, ny // by, nx // bx, bt, bz, by, bx) + rest)
    nr = len(rest)
    h = h.transpose((0, 4, 1, 5, 2, 6, 3, 7) + tuple(range(8, 8 + nr)))
    return h.reshape(tuple(shape4) + rest)


def block_parities(block):
    """Parity (0 even, 1 odd) of each site of a block whose origin is an even site, in block order."""
    bx, by, bz, bt = block
    t, z, y, x = np.meshgrid(np.arange(bt), np.arange(bz), np.arange(by), np.arange(bx), indexing="ij")
    return ((x + y + z + t) % 2).ravel()


class FineBlocker:
    """Fine colour-vector fields <-> aggregates split by site parity: (nt, nz, ny, nx, 3[, k]) <->
    (nagg, 2, block_volume/2 * 3[, k]). Block origins are even sites (blocks are even), so a site's parity inside
    its block is its global parity."""

    def __init__(self, geom, block):
        self.geom, self.block = geom, tuple(block)
        self.bvol = int(np.prod(block))
        par = block_parities(block)
        order = np.concatenate([np.flatnonzero(par == 0), np.flatnonzero(par == 1)])
        self.order = geom.xp.asarray(order)
        self.inverse = geom.xp.asarray(np.argsort(order))
        self.nagg = geom.local_volume // self.bvol
        self.m = self.bvol // 2 * 3           # unknowns per aggregate and parity

    def split(self, f):
        rest = f.shape[5:]
        g = to_blocks(f, self.block)                           # (nagg, bvol, 3, *rest)
        g = self.geom.xp.take(g, self.order, axis=1)
        return g.reshape((self.nagg, 2, self.m) + rest)

    def merge(self, g):
        rest = g.shape[3:]
        h = g.reshape((self.nagg, self.bvol, 3) + rest)
        h = self.geom.xp.take(h, self.inverse, axis=1)
        return from_blocks(h, self.block, self.geom.shape)


class CoarseBlocker:
    """Coarse fields of 2n unknowns per site (two chiralities of n) <-> aggregates split by chirality:
    (Tc, Zc, Yc, Xc, 2n[, k]) <-> (nagg, 2, block_volume * n[, k])."""

    def __init__(self, cgeom, block, n: int):
        self.geom, self.block, self.n = cgeom, tuple(block), int(n)
        self.bvol = int(np.prod(block))
        self.nagg = cgeom.local_volume // self.bvol
        self.m = self.bvol * self.n

    def split(self, f):
        rest = f.shape[5:]
        g = to_blocks(f, self.block)                           # (nagg, bvol, 2n, *rest)
        g = g.reshape((self.nagg, self.bvol, 2, self.n) + rest)
        g = self.geom.xp.moveaxis(g, 2, 1)                     # (nagg, 2, bvol, n, *rest)
        return g.reshape((self.nagg, 2, self.m) + rest)

    def merge(self, g):
        rest = g.shape[3:]
        h = g.reshape((self.nagg, 2, self.bvol, self.n) + rest)
        h = self.geom.xp.moveaxis(h, 1, 2).reshape((self.nagg, self.bvol, 2 * self.n) + rest)
        return from_blocks(h, self.block, self.geom.shape)


def outside_mask(geom, block, mu: int, step: int):
    """1 where the site x + step*mu lies in another aggregate than x (blocks ``block`` of ``geom``'s local sites),
    shape geom.shape + (1,), float."""
    xp = geom.xp
    b = block[mu]
    n = geom.shape[site_axis(mu)]
    loc = xp.arange(n) % b + step
    out = ((loc < 0) | (loc >= b)).astype(np.float64)
    shape = [1, 1, 1, 1]
    shape[site_axis(mu)] = n
    return xp.broadcast_to(out.reshape(shape), geom.shape)[..., None]
