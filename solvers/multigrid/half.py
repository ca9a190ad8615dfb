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

A warp-per-row form for the small coarse lattices (blocks stored row by row, 32 lanes an output row) was slower on
the H200 and is gone (runs/multigrid/README.md, "The warp-per-row half kernel").
"""
from __future__ import annotations

import time

import numpy as np

from lattice import cuda_source

from . import cuda as _cuda
from .operators import CoarseOperator

QMAX = 32767
BLOCK = 128


def encode(xp, Y):
    """(Yq, scale) of a stencil Y (9, *sites, n, n): int16 (9, *sites, n, n, 2), each block transposed, and float32
    (9, *sites), computed in float32 (module docstring)."""
    Y = Y.astype(np.complex64)
    parts = xp.stack([Y.real, Y.imag], axis=-1)                     # (9, *sites, n, n, 2) float32
    peak = xp.abs(parts).max(axis=(-3, -2, -1))
    scale = (peak / np.float32(QMAX)).astype(np.float32)
    safe = xp.where(scale > 0, scale, np.float32(1.0))
    q = xp.rint(parts / safe[..., None, None, None])
    q = xp.clip(q, -QMAX, QMAX).astype(np.int16)
    return xp.ascontiguousarray(xp.swapaxes(q, -3, -2)), scale


def decode(xp, Yq, scale):
    """The complex64 stencil (9, *sites, n, n) of (Yq, scale): Y_ij = scale * (q_re + i q_im), in float32."""
    s = scale[..., None, None]
    re = s * Yq[..., 0].astype(np.float32)
    im = s * Yq[..., 1].astype(np.float32)
    Y = (re + 1j * im).astype(np.complex64)
    return xp.ascontiguousarray(xp.swapaxes(Y, -1, -2))


def applies(geom, v) -> bool:
    """Whether the half kernel serves ``v``: the multigrid kernels switched on (:func:`.cuda.applies`) and v
    complex64 (the half cycle's vectors)."""
    return _cuda.applies(geom, v) and np.dtype(v.dtype) == np.complex64


def stencil_reference(Yq, scale, v, nb, ext=None):
    """The kernels' twin (NumPy or CuPy): :func:`decode`, then :func:`.cuda.stencil_reference`."""
    xp = np if isinstance(Yq, np.ndarray) else __import__("cupy")
    return _cuda.stencil_reference(decode(xp, Yq, scale), v, nb, ext)


def stencil(backend, Yq, scale, v, nb, ext=None):
    """The 9-point stencil with half links by one kernel of ``backend`` (arguments as :func:`.cuda.stencil`):
    ``mg_stencil_half``, one thread per output; NumPy fields (:func:`.cuda.set_emulation`):
    :func:`stencil_reference`."""
    if isinstance(v, np.ndarray) and backend.xp is np:
        return stencil_reference(Yq, scale, v, nb, ext)
    xp = backend.xp
    nsite = int(nb.shape[1])
    n = int(Yq.shape[-2])
    _, k, w = _cuda._columns(v, nsite, n)
    src = xp.ascontiguousarray(w if ext is None else ext.reshape(-1, n, k))
    out = xp.empty((nsite, n, k), dtype=np.complex64)
    args = (xp.ascontiguousarray(Yq), xp.ascontiguousarray(scale), src, nb, out, np.int64(nsite), np.int32(n),
            np.int32(k))
    threads = nsite * n * k
    fn = cuda_source.function(backend, "solvers.multigrid", "coarse_half.cu", "mg_stencil_half")
    fn(((threads + BLOCK - 1) // BLOCK,), (BLOCK,), args)
    return out.reshape(v.shape)


class HalfCoarseOperator(CoarseOperator):
    """A coarse operator whose stencil is stored in half precision (``Yq``, ``scale``: :func:`encode`); applied to
    complex64 vectors. Same lattice, counter and level as the operator it encodes."""

    def __init__(self, op: CoarseOperator):
        g = op.geom
        self.geom, self.xp = g, op.xp
        self.Yq, self.scale = encode(op.xp, op.Y)
        self.n = self.dof = op.n
        self.dtype = np.dtype(np.complex64)
        self.counter, self.level = op.counter, op.level
        self.flops_per_apply = op.flops_per_apply
        self._adj = None
        self._decoded = None

    @property
    def stencil_nbytes(self) -> int:
        """The stencil's 16-bit storage with its scales (what an application reads)."""
        return int(self.Yq.nbytes) + int(self.scale.nbytes)

    @property
    def Y(self):
        """The decoded stencil (complex64), built on first use (array path, adjoint, coarsest factorization)."""
        if self._decoded is None:
            self._decoded = decode(self.xp, self.Yq, self.scale)
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
            out = stencil(geom.backend, self.Yq, self.scale, v, nb, ext)
        else:
            out = self._stencil(self.Y, v)
        self._count(v, t0)
        return out
