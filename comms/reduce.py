"""Exact (order-independent) summation of float64 data, so that global sums are bitwise the same for every
decomposition, rank count and transport.

Every finite double is +-m * 2**(e - 1075) with an integer m < 2**53 and a biased exponent e in 1..2046 (read
from its bits). Splitting m = hi * 2**26 + lo (|hi| <= 2**27, 0 <= lo < 2**26) and summing hi and lo per exponent
with ``bincount`` is exact in float64 as long as no partial sum reaches 2**53 (guaranteed for chunks of at most
2**24 values), so a rank's sum is an exact Python integer N with its sum = N * 2**-1074. Those pairs are added exactly across ranks and rounded once (Python's int / int is
correctly rounded): the result is the correctly rounded sum of all values, whatever their order or distribution.
"""
from __future__ import annotations

import numpy as np

_CHUNK = 1 << 16                   # exact for chunks up to 2**24 values; smaller ones stay in cache
_SPLIT = 26


def exact_parts(a) -> tuple:
    """(N, e0) with sum(a) == N * 2**e0 exactly, for a real float array (any shape); ('nonfinite', s) when the
    array holds inf or nan (the plain sum is then the only sensible answer)."""
    a = np.ascontiguousarray(a, dtype=np.float64).ravel()
    if a.size == 0:
        return (0, 0)
    total = 0
    for s in range(0, a.size, _CHUNK):
        n = _chunk_parts(a[s:s + _CHUNK])
        if n is None:
            return ("nonfinite", float(a.sum()))
        total += n
    return (total, -1074)


_FRAC = (1 << 52) - 1
_LOW = (1 << _SPLIT) - 1


def _chunk_parts(a: np.ndarray):
    """Exact sum of a chunk as an integer multiple of 2**-1074 (the smallest subnormal), None if not finite."""
    bits = a.view(np.int64)
    ex = (bits >> 52) & 0x7FF                          # biased exponent
    if (ex == 0x7FF).any():
        return None
    frac = bits & _FRAC
    normal = ex > 0
    mant = np.where(normal, frac | (1 << 52), frac)    # a = +-mant 2**(max(ex,1) - 1075), mant < 2**53
    mant = np.where(bits < 0, -mant, mant)
    hi = mant >> _SPLIT                                # floor: mant = hi 2**26 + lo, 0 <= lo < 2**26, |hi| <= 2**27
    lo = mant & _LOW
    idx = np.maximum(ex, 1)
    hs = np.bincount(idx, weights=hi.astype(np.float64))
    ls = np.bincount(idx, weights=lo.astype(np.float64))
    total = 0
    for k in np.flatnonzero((hs != 0) | (ls != 0)):
        total += ((int(hs[k]) << _SPLIT) + int(ls[k])) << (int(k) - 1)
    return total


def combine(parts) -> float:
    """The correctly rounded float of a sum of (N, e0) pairs (and any 'nonfinite' partial sums)."""
    special = [p[1] for p in parts if p[0] == "nonfinite"]
    if special:
        return float(sum(special))
    parts = [p for p in parts if p[0] != 0]
    if not parts:
        return 0.0
    base = min(p[1] for p in parts)
    total = sum(n << (e0 - base) for n, e0 in parts)
    if base >= 0:
        return float(total << base)
    return total / (1 << -base)


def local_parts(a) -> tuple:
    """Exact parts of a real or complex array: ((N, e0) of the real part, (N, e0) of the imaginary part or None)."""
    a = np.asarray(a)
    if np.iscomplexobj(a):
        return (exact_parts(a.real), exact_parts(a.imag))
    return (exact_parts(a), None)


def exact_sum(a) -> float | complex:
    """Correctly rounded sum of a local array (one process)."""
    re, im = local_parts(a)
    return combine([re]) if im is None else complex(combine([re]), combine([im]))
