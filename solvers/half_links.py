"""Links in half precision: a single-precision operator's link blocks rounded to 16 bits with one scale per link
(setting ``dslash_half_links``: ``naik``, the Naik links only, or ``all``; docs/perf-notes.md "Half-precision links").

Each 3x3 link block m (18 reals) gets the scale s = max|m_k| / 32767 (in single precision) and each real becomes
q_k s with q_k = rint(m_k / s), an integer in [-32767, 32767]: a rounding error of at most s / 2, 2^-16 of the
link's largest entry. The rounded blocks are the operator's links on every backend (the NumPy hop, the
distributed and one-GPU hops alike), so answers do not depend on where the operator runs; the GPU hop stores a
rounded hop as 16-bit integers and the scale (40 bytes a link instead of 72, :func:`half_table`), which it turns back
into the same single-precision values (q_k s is one rounded product either way). QUDA stores the links of its
half-precision staggered operator so too (16-bit fixed point with a scale); here the scale is per link, not per
field, so that the Naik links (entries ~1/24 of the fat links') keep all 16 bits.

Why ``naik``: the operator's error is ~2^-17 relative to the links rounded, so rounding every link (``all``) puts
an error of the MD tolerance's size (1e-5) into the sloppy operator, and every shift of an MD solve then needs its
own refinement (runs/rhmc/README.md, session 19); the Naik term is ~1/24 of D, so rounding only its links moves
the operator by ~1e-6 and saves 128 of the 1432 bytes a site. Only the sloppy operator of a mixed solve is rounded;
the double-precision true residuals, reliable updates and the answers' tolerance are unchanged.
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source
from lattice.placement import Placement, implements

#: the run-configuration setting (comms.config.RunConfig.dslash_half_links): "off", "naik" or "all"
HALF_SETTING = "dslash_half_links"
#: the largest magnitude of a stored integer: q = rint(m / s) with s = max|m| / QMAX
QMAX = 32767
BLOCK = 128
#: 32-bit words a site of one hop's table takes: a rounded link (9 pairs of 16-bit integers, the scale), a whole one
WORDS_HALF, WORDS_SINGLE = 10, 18


def half_mode(geom, dtype) -> str:
    """The setting of ``geom``'s run configuration for an operator of ``dtype``: "off" unless single precision."""
    return getattr(geom.config, HALF_SETTING) if np.dtype(dtype) == np.complex64 else "off"


def rounded_hops(nhop: int, mode: str) -> tuple:
    """The hops (indices into the link blocks: +1, -1, +3, -3 per direction) whose links ``mode`` rounds."""
    if mode == "all":
        return tuple(range(nhop))
    if mode == "naik" and nhop == 16:
        return tuple(h for h in range(nhop) if h % 4 >= 2)
    return ()


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


def _kernel_fits(geom, blocks, hops) -> bool:
    """The kernel takes C-contiguous complex64 blocks and rounds the hops of one of the two forms."""
    nhop = blocks.shape[0]
    forms = (rounded_hops(nhop, "naik"), rounded_hops(nhop, "all"))
    return blocks.dtype == np.complex64 and blocks.flags.c_contiguous and tuple(hops) in forms


@implements("staggered.round_links", Placement.ARRAY)
def round_links(geom, blocks, hops):
    """(blocks, scales): one output parity's link blocks (nhop, V/2, 3, 3) complex64 with the hops ``hops`` rounded
    (:func:`half_rounded`), a new array, and their scales (len(hops), V/2)."""
    idx = list(hops)
    rounded, scales = half_rounded(geom, geom.xp.ascontiguousarray(blocks[idx]))
    out = blocks.copy()
    out[idx] = rounded
    return out, scales


@implements("staggered.round_links", Placement.WHOLE, Placement.DISTRIBUTED, fits=_kernel_fits)
def round_links_kernel(geom, blocks, hops):
    """:func:`round_links` by the kernel ``half_round`` in place (the blocks are the link store's own, made for it
    by the link build): one pass over the rounded hops, one thread a link; the same bits as the twin."""
    xp = geom.xp
    nhop, vh = blocks.shape[0], blocks.shape[1]
    naik_only = len(hops) < nhop
    scales = xp.empty((len(hops), vh), xp.float32)
    nlinks = len(hops) * vh
    kernel = cuda_source.function(geom.backend, "solvers", "staggered_hop.cu", "half_round")
    kernel(((nlinks + BLOCK - 1) // BLOCK,), (BLOCK,),
           (blocks, scales, np.int64(vh), np.int64(nlinks), np.int32(naik_only)))
    return blocks, scales


def table_words(nhop: int, naik_only: bool) -> int:
    """32-bit words a site of the table: per hop :data:`WORDS_HALF` if rounded, else :data:`WORDS_SINGLE`."""
    nhalf = len(rounded_hops(nhop, "naik" if naik_only else "all"))
    return nhalf * WORDS_HALF + (nhop - nhalf) * WORDS_SINGLE


def half_table(blocks, scales, xp, naik_only: bool):
    """The GPU hop's table, (words, V/2) 32-bit words, so that a warp reads 32 consecutive sites: hop after hop, a
    rounded one as 9 planes of (re, im) 16-bit integer pairs and a plane of its float32 scale, a whole one
    (``naik_only``: the one-link hops) as 9 planes of complex64 (2 words each). ``scales``: one row per rounded hop,
    in hop order. The array twin of the kernel ``table_half``."""
    nhop, vh = blocks.shape[0], blocks.shape[1]
    half = rounded_hops(nhop, "naik" if naik_only else "all")
    planes = blocks.reshape(nhop, vh, 9)
    parts = []
    for h in range(nhop):
        if h in half:
            s = scales[half.index(h)].astype(xp.float32)
            safe = xp.where(s > 0, s, xp.float32(1))[:, None]
            re = xp.rint(planes[h].real / safe).astype(xp.int16)
            im = xp.rint(planes[h].imag / safe).astype(xp.int16)
            pairs = xp.stack([re, im], axis=-1).view(xp.int32)[..., 0]     # (vh, 9): little-endian (re, im)
            parts += [pairs.T, s.view(xp.int32)[None]]
        else:       # complex64 plane e, site j at float2 index e vh + j: the planes' memory as words
            parts.append(xp.ascontiguousarray(planes[h].T).view(xp.int32).reshape(18, vh))
    return xp.ascontiguousarray(xp.concatenate(parts, axis=0))


def half_table_kernel(backend, blocks, scales, naik_only: bool, out=None):
    """:func:`half_table` by the kernel ``table_half`` into ``out`` (the last links' table, whose address a captured
    hop bakes in) where it has the shape."""
    xp = backend.xp
    nhop, vh = blocks.shape[0], blocks.shape[1]
    shape = (table_words(nhop, naik_only), vh)
    fits = out is not None and tuple(out.shape) == shape and out.dtype == np.int32
    table = out if fits else xp.empty(shape, xp.int32)
    kernel = cuda_source.function(backend, "solvers", "staggered_hop.cu", "table_half")
    kernel(((nhop * vh + BLOCK - 1) // BLOCK,), (BLOCK,),
           (blocks, scales, table, np.int32(nhop), np.int64(vh), np.int32(bool(naik_only))))
    return table
