"""Links in half precision: the single-precision operator's link blocks rounded to 16 bits with one scale per link
(switch ``dslash_half_links``, docs/perf-notes.md "Half-precision links").

Each 3x3 link block m (18 reals) gets the scale s = max|m_k| / 32767 (in single precision) and each real becomes
q_k s with q_k = rint(m_k / s), an integer in [-32767, 32767]: a rounding error of at most s / 2, 2^-16 of the
link's largest entry. The rounded blocks are the operator's links on every backend (the NumPy hop, the
distributed and one-GPU hops alike), so answers do not depend on where the operator runs; the GPU hop stores them
as 16-bit integers and the scale (40 bytes a link instead of 72, :func:`half_table`), which it turns back into the
same single-precision values (q_k s is one rounded product either way). QUDA stores the links of its half-precision
staggered operator so too (16-bit fixed point with a scale); here the scale is per link, not per field, so that the
Naik links (entries ~1/24 of the fat links') keep all 16 bits.

Only the sloppy operator of a mixed solve is rounded (the multishift's Krylov stage and the inner solves of the
refinement); the double-precision true residuals, reliable updates and the answers' tolerance are unchanged.
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source
from lattice.placement import Placement, implements, switch_on

#: the run-configuration switch (comms.config.RunConfig.dslash_half_links)
HALF_SWITCH = "dslash_half_links"
#: the largest magnitude of a stored integer: q = rint(m / s) with s = max|m| / QMAX
QMAX = 32767
BLOCK = 128


def half_wanted(geom, dtype) -> bool:
    """Whether an operator of ``dtype`` on ``geom`` takes half-precision links: single precision, switch on."""
    return np.dtype(dtype) == np.complex64 and switch_on(HALF_SWITCH, getattr(geom, "config", None))


@implements("staggered.half_round", Placement.ARRAY)
def half_rounded(geom, blocks):
    """(rounded, scales): complex64 link blocks (..., 3, 3) rounded to 16 bits per real with one scale per block
    (module docstring); scales (...) float32. The twin of the kernel ``half_round``: the same operations in single
    precision (a correctly rounded division, rint, a correctly rounded product), so the same bits."""
    xp = geom.xp
    re = xp.ascontiguousarray(blocks).view(xp.float32).reshape(blocks.shape[:-2] + (18,))
    scales = xp.abs(re).max(axis=-1) / xp.float32(QMAX)
    safe = xp.where(scales > 0, scales, xp.float32(1))
    q = xp.rint(re / safe[..., None])
    rounded = (q * scales[..., None]).astype(xp.float32)
    return rounded.view(xp.complex64).reshape(blocks.shape), scales.astype(xp.float32)


def _single_blocks(geom, blocks) -> bool:
    return blocks.dtype == np.complex64 and blocks.flags.c_contiguous


@implements("staggered.half_round", Placement.WHOLE, Placement.DISTRIBUTED, fits=_single_blocks)
def half_rounded_kernel(geom, blocks):
    """:func:`half_rounded` by the kernel ``half_round`` (solvers/kernels/staggered_hop.cu), one thread a link."""
    xp = geom.xp
    nlinks = int(np.prod(blocks.shape[:-2]))
    rounded = xp.empty_like(blocks)
    scales = xp.empty(blocks.shape[:-2], xp.float32)
    kernel = cuda_source.function(geom.backend, "solvers", "staggered_hop.cu", "half_round")
    kernel(((nlinks + BLOCK - 1) // BLOCK,), (BLOCK,), (blocks, rounded, scales, np.int64(nlinks)))
    return rounded, scales


def half_table(blocks, scales, xp):
    """The GPU hop's table of rounded blocks (nhop, V/2, 3, 3) with their scales (nhop, V/2): per hop 9 planes of
    (re, im) 16-bit integer pairs and one plane of the float32 scale, (nhop * 10, V/2) 32-bit words, so that a warp
    reads 32 consecutive sites. The array twin of the kernel ``table_half``."""
    nhop, vh = blocks.shape[0], blocks.shape[1]
    safe = xp.where(scales > 0, scales, xp.float32(1))[:, :, None]
    planes = blocks.reshape(nhop, vh, 9)
    re = xp.rint(planes.real / safe).astype(xp.int16)
    im = xp.rint(planes.imag / safe).astype(xp.int16)
    pairs = xp.stack([re, im], axis=-1).view(xp.int32)[..., 0]           # (nhop, vh, 9): little-endian (re, im)
    table = xp.empty((nhop, 10, vh), xp.int32)
    table[:, :9] = pairs.transpose(0, 2, 1)
    table[:, 9] = scales.astype(xp.float32).view(xp.int32)
    return table.reshape(nhop * 10, vh)


def half_table_kernel(backend, blocks, scales, out=None):
    """:func:`half_table` by the kernel ``table_half`` into ``out`` (the last links' table, whose address a captured
    hop bakes in) where it has the shape."""
    xp = backend.xp
    nhop, vh = blocks.shape[0], blocks.shape[1]
    fits = out is not None and tuple(out.shape) == (nhop * 10, vh) and out.dtype == np.int32
    table = out if fits else xp.empty((nhop * 10, vh), xp.int32)
    kernel = cuda_source.function(backend, "solvers", "staggered_hop.cu", "table_half")
    kernel(((nhop * vh + BLOCK - 1) // BLOCK,), (BLOCK,), (blocks, scales, table, np.int32(nhop), np.int64(vh)))
    return table
