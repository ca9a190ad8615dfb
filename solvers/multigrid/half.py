"""Half-precision coarse stencils (``precision = "half"``): the coarse links Y stored as 16-bit integers with a
scale, as QUDA stores coarse links in half precision; vectors, sums and everything else of the cycle in single.

Encoding (:func:`encode`): per direction d and coarse site x, one float32 scale for the whole n x n block,
``s = max_ij max(|Re Y_ij|, |Im Y_ij|) / 32767``, and int16 components ``q = rint(Y / s)`` (|q| <= 32767); decoding,
in float32, ``Y = s * q`` (:func:`decode`). QUDA's fixed-point coarse links carry one scale for the whole field (the
field's max); one per block costs 4 bytes per 4 n^2 bytes of integers (0.01 % at n = 96) and keeps the blocks of
small norm (far from the field's largest) at full 16-bit resolution. Each component's error is at most s/2, i.e.
1.5e-5 of its block's largest entry: the K-cycle is only a preconditioner of the double outer flexible GCR, which
tolerates it (tests/solvers/test_multigrid_half.py: outer iterations within a few of double).

Storage ``Yq`` (9, *sites, n, n, 2) int16 holds each block TRANSPOSED (``Yq[d, x, j, i] = Y_d(x)[i, j]``): the
kernel (kernels/coarse_half.cu, one thread per output row and column) then reads, at each j, consecutive (re, im)
pairs across the threads of consecutive rows. 4 bytes per complex entry against 8 in single and 16 in double: the
level-2 stencil, the solve's largest traffic (docs/multigrid.md 'Precision'), halves again.

:class:`HalfCoarseOperator` applies it: one kernel on the GPU (:func:`stencil`, through the same neighbour tables,
halo exchange and extended arrays as :mod:`.cuda`), else the array path on the decoded stencil (float32, built
once on first use: :attr:`HalfCoarseOperator.Y`); :func:`stencil_reference` is the kernel's NumPy twin (the same
decoding, then the contraction). The adjoint (the set-up's, never the cycle's) and the coarsest direct solve use
the decoded stencil.

Warp per row (``rows``, ``multigrid(..., half_rows=True)``): on a small coarse lattice (fewer than :data:`ROWS_MAX`
rows, sites x n: level 3 of 32^4, 4^4 x 96 = 24576) one thread per row leaves most of the device idle (each
thread's 9 n products run in sequence; the H200 holds 132 x 2048 threads), so that level got slower in half than in
single, whose kernel has a warp per output row (2.34 against 1.59 s per solve, runs/multigrid/README.md). There the
blocks are stored row by row (``Yq[d, x, i, j] = Y_d(x)[i, j]``, not transposed) and the kernel
``mg_stencil_half_rows`` gives each output a warp whose 32 lanes split the sum over j, reading consecutive (re, im)
pairs of the row, then a shuffle reduction, as :mod:`.cuda`'s ``mg_stencil_row``; a warp serves :data:`TILE`
columns of its row (the batched solve's k columns), so it reads the row once per tile. Off by default (the old path);
the twin (:func:`stencil_reference` with ``rows``) decodes either layout.
"""
from __future__ import annotations

import time

import numpy as np

from lattice import cuda_source

from . import cuda as _cuda
from .operators import CoarseOperator

QMAX = 32767
BLOCK = 128
WARP = 32
TILE = 4        # columns per group of the warp-per-row kernel (HALF_TILE of kernels/coarse_half.cu)
#: local rows (sites x n) below which ``rows`` stores a level row by row for the warp-per-row kernel: fewer threads
#: than the device holds (the H200: 132 SMs x 2048) with one thread per row
ROWS_MAX = 1 << 17


def encode(xp, Y, rows: bool = False):
    """(Yq, scale) of a stencil Y (9, *sites, n, n): int16 (9, *sites, n, n, 2), each block transposed (``rows``:
    as it is, row by row), and float32 (9, *sites), computed in float32 (module docstring)."""
    Y = Y.astype(np.complex64)
    parts = xp.stack([Y.real, Y.imag], axis=-1)                     # (9, *sites, n, n, 2) float32
    peak = xp.abs(parts).max(axis=(-3, -2, -1))
    scale = (peak / np.float32(QMAX)).astype(np.float32)
    safe = xp.where(scale > 0, scale, np.float32(1.0))
    q = xp.rint(parts / safe[..., None, None, None])
    q = xp.clip(q, -QMAX, QMAX).astype(np.int16)
    return xp.ascontiguousarray(q if rows else xp.swapaxes(q, -3, -2)), scale


def decode(xp, Yq, scale, rows: bool = False):
    """The complex64 stencil (9, *sites, n, n) of (Yq, scale): Y_ij = scale * (q_re + i q_im), in float32
    (``rows``: Yq stored row by row)."""
    s = scale[..., None, None]
    re = s * Yq[..., 0].astype(np.float32)
    im = s * Yq[..., 1].astype(np.float32)
    Y = (re + 1j * im).astype(np.complex64)
    return xp.ascontiguousarray(Y if rows else xp.swapaxes(Y, -1, -2))


def applies(geom, v) -> bool:
    """Whether the half kernel serves ``v``: the multigrid kernels switched on (:func:`.cuda.applies`) and v
    complex64 (the half cycle's vectors)."""
    return _cuda.applies(geom, v) and np.dtype(v.dtype) == np.complex64


def stencil_reference(Yq, scale, v, nb, ext=None, rows: bool = False):
    """The kernels' twin (NumPy or CuPy): :func:`decode`, then :func:`.cuda.stencil_reference`."""
    xp = np if isinstance(Yq, np.ndarray) else __import__("cupy")
    return _cuda.stencil_reference(decode(xp, Yq, scale, rows), v, nb, ext)


def stencil(backend, Yq, scale, v, nb, ext=None, rows: bool = False, lanes: int = WARP):
    """The 9-point stencil with half links by one kernel of ``backend`` (arguments as :func:`.cuda.stencil`):
    ``mg_stencil_half`` (one thread per output), or with ``rows`` (Yq stored row by row) ``mg_stencil_half_rows``
    with ``lanes`` threads per output row and :data:`TILE` columns (a warp; 1 for the host build of the CPU tests);
    NumPy fields
    (:func:`.cuda.set_emulation`): :func:`stencil_reference`."""
    if isinstance(v, np.ndarray) and backend.xp is np:
        return stencil_reference(Yq, scale, v, nb, ext, rows)
    xp = backend.xp
    nsite = int(nb.shape[1])
    n = int(Yq.shape[-2])
    _, k, w = _cuda._columns(v, nsite, n)
    src = xp.ascontiguousarray(w if ext is None else ext.reshape(-1, n, k))
    out = xp.empty((nsite, n, k), dtype=np.complex64)
    args = (xp.ascontiguousarray(Yq), xp.ascontiguousarray(scale), src, nb, out, np.int64(nsite), np.int32(n),
            np.int32(k))
    threads = nsite * n * (-(-k // TILE) * lanes if rows else k)
    name = "mg_stencil_half_rows" if rows else "mg_stencil_half"
    fn = cuda_source.function(backend, "solvers.multigrid", "coarse_half.cu", name)
    fn(((threads + BLOCK - 1) // BLOCK,), (BLOCK,), args + ((np.int32(lanes),) if rows else ()))
    return out.reshape(v.shape)


class HalfCoarseOperator(CoarseOperator):
    """A coarse operator whose stencil is stored in half precision (``Yq``, ``scale``: :func:`encode`); applied to
    complex64 vectors. Same lattice, counter and level as the operator it encodes. ``rows``: on a lattice of fewer
    than :data:`ROWS_MAX` local rows, stored row by row for the warp-per-row kernel (``self.rows`` says whether)."""

    def __init__(self, op: CoarseOperator, rows: bool = False):
        g = op.geom
        self.geom, self.xp = g, op.xp
        self.rows = bool(rows) and int(np.prod(g.shape)) * op.n < ROWS_MAX
        self.Yq, self.scale = encode(op.xp, op.Y, self.rows)
        self.n = self.dof = op.n
        self.dtype = np.dtype(np.complex64)
        self.counter, self.level = op.counter, op.level
        self.flops_per_apply = op.flops_per_apply
        self._adj = None
        self._decoded = None

    @property
    def Y(self):
        """The decoded stencil (complex64), built on first use (array path, adjoint, coarsest factorization)."""
        if self._decoded is None:
            self._decoded = decode(self.xp, self.Yq, self.scale, self.rows)
        return self._decoded

    def converted(self, dtype):
        if np.dtype(dtype) == np.complex64:
            return self
        return CoarseOperator(self.geom, self.Y.astype(dtype), self.counter, self.level)

    def apply(self, v):
        t0 = time.perf_counter()
        geom = self.geom
        if applies(geom, v):
            nb, halo = _cuda.tables(geom, self.xp, "stencil")
            ext = None if halo is None else _cuda.extended(geom, halo, v)
            out = stencil(geom.backend, self.Yq, self.scale, v, nb, ext, self.rows)
        else:
            out = self._stencil(self.Y, v)
        self._count(v, t0)
        return out
