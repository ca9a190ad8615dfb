"""Exact fixed-point accumulators of float64 sums (a Kulisch-style superaccumulator): the NumPy twin of the device
kernels of lattice/kernels/exact_sum.cu, and the format the ranks exchange (docs/reductions.md, 'The accumulator').

Every finite double is x = (-1)**sign * m * 2**(s - 1074) with an integer mantissa m < 2**53 and s = max(e, 1) - 1
(e: its biased exponent, 1..2046 for normal numbers, 0 for subnormals), so s is in 0..2045. An accumulator
holds the integer N with sum = N * 2**-1074 as :data:`NLIMBS` = 67 signed 64-bit limbs L_i of 32-bit digits,

    N = sum_i L_i * 2**(32 i),        i = 0..66  (2144 bits: 2**-1074 up to 2**1070),

plus one slot of non-finite flags (:data:`FLAGS`): a record is :data:`WIDTH` = 68 int64. A double adds its shifted
mantissa m * 2**(s mod 32), at most 53 + 31 = 84 bits, as three digits to the limbs k = s // 32, k + 1, k + 2
(k <= 63, so limbs 64..66 only ever receive digits or carries). Each digit is below 2**32, so a limb takes 2**31
additions before it can overflow. :func:`normalise` propagates the carries: digits 0..65 in [0, 2**32), the top
limb signed; that form is unique, so equal sums give equal records bitwise, whatever the order of the additions,
and normalised records of up to 2**31 ranks add without overflow. The top limb has room for sums of up to 2**46
values of the largest magnitude.

:func:`to_float` rounds once, to nearest with ties to even, subnormals exact, and a total beyond the largest double
to +-inf (where ``comms.reduce.combine`` raises OverflowError: Python's int / int). Non-finite inputs set flags
(:data:`NAN`, :data:`POS_INF`, :data:`NEG_INF`) and the result is then their IEEE sum: nan if a nan or both
infinities were seen, else the infinity (comms.reduce returns the plain float sum of such arrays: the same, unless
finite values of the same array overflow to the opposite infinity on the way).

API: :func:`accumulate` (values -> normalised record), :func:`add` (records -> their normalised sum),
:func:`to_float` (record -> the correctly rounded double). Everything else is the kernels' line-by-line twin.
"""
from __future__ import annotations

import struct

import numpy as np

DIGIT_BITS = 32
NLIMBS = 67                          # limbs of digits: 2**-1074 .. 2**1070, the top one signed
FLAGS = NLIMBS                       # the record slot of the non-finite flags
WIDTH = NLIMBS + 1                   # int64 per accumulator record
NAN, POS_INF, NEG_INF = 1, 2, 4      # flag bits
_DIGIT = (1 << DIGIT_BITS) - 1
_FRAC = (1 << 52) - 1
_M64 = (1 << 64) - 1
_INF_BITS = 0x7FF << 52
_NAN_BITS = 0x7FF8 << 48
_CHUNK = 1 << 20                     # float64 bincount of 2**20 digits < 2**32 stays below 2**52: exact


def split(values: np.ndarray):
    """The digits of float64 values: (k, d0, d1, d2, flags), d_j signed int64 digits of limb k + j (kernel:
    exs_split). Zeros and non-finite values get k = -1 and zero digits; flags ORs the non-finite flag bits."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    ex = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    frac = bits & np.uint64(_FRAC)
    neg = (bits >> np.uint64(63)) != 0
    special = ex == 0x7FF
    flags = 0
    if special.any():
        flags |= NAN * bool((special & (frac != 0)).any())
        inf = special & (frac == 0)
        flags |= POS_INF * bool((inf & ~neg).any()) | NEG_INF * bool((inf & neg).any())
    m = np.where(ex > 0, frac | np.uint64(1 << 52), frac)
    m = np.where(special, np.uint64(0), m)
    s = np.maximum(ex, 1) - 1
    r = (s & 31).astype(np.uint64)
    lo = m << r                                              # m * 2**r mod 2**64
    hi = (m >> np.uint64(32)) >> (np.uint64(32) - r)         # m * 2**r >> 64 (no shift by 64 when r = 0)
    sign = np.where(neg, -1, 1)
    d0 = (lo & np.uint64(_DIGIT)).astype(np.int64) * sign
    d1 = (lo >> np.uint64(32)).astype(np.int64) * sign
    d2 = hi.astype(np.int64) * sign
    k = np.where(m == 0, -1, s >> 5)
    return k, d0, d1, d2, flags


def normalise(rec: np.ndarray) -> np.ndarray:
    """Propagate the carries of a record in place (kernel: exs_normalise): digits 0..65 in [0, 2**32), the top limb
    signed. Python ints, so that any int64 limbs are handled exactly."""
    carry = 0
    for i in range(NLIMBS - 1):
        v = int(rec[i]) + carry
        rec[i] = v & _DIGIT
        carry = v >> DIGIT_BITS                              # floor, as the kernel's arithmetic shift
    top = int(rec[NLIMBS - 1]) + carry
    if not -(1 << 63) <= top < (1 << 63):
        raise OverflowError("superaccumulator: the top limb overflows (a sum of more than 2**46 huge values)")
    rec[NLIMBS - 1] = top
    return rec


def accumulate(values) -> np.ndarray:
    """The normalised record (WIDTH int64) of the exact sum of a real float array (float32 is widened exactly)."""
    a = np.asarray(values)
    if a.dtype.kind != "f":
        raise TypeError(f"superaccumulator: a real float array is needed, not {a.dtype}: pass a.real / a.imag")
    a = a.astype(np.float64, copy=False).ravel()
    rec = np.zeros(WIDTH, dtype=np.int64)
    for start in range(0, a.size, _CHUNK):
        k, d0, d1, d2, flags = split(a[start:start + _CHUNK])
        rec[FLAGS] |= flags
        live = k >= 0
        k = k[live]
        part = np.zeros(NLIMBS, dtype=np.float64)
        for j, d in enumerate((d0, d1, d2)):
            part += np.bincount(k + j, weights=d[live].astype(np.float64), minlength=NLIMBS)[:NLIMBS]
        rec[:NLIMBS] += part.astype(np.int64)
        normalise(rec)
    return rec


def add(*records) -> np.ndarray:
    """The normalised record of the sum of normalised records (kernel: exact_sum_round's limb sums)."""
    if not records:
        raise ValueError("superaccumulator.add: give at least one record")
    recs = np.asarray(records, dtype=np.int64).reshape(len(records), WIDTH)
    out = np.zeros(WIDTH, dtype=np.int64)
    out[:NLIMBS] = recs[:, :NLIMBS].sum(axis=0)               # each |digit| < 2**32: no overflow below 2**31 ranks
    out[FLAGS] = np.bitwise_or.reduce(recs[:, FLAGS])
    return normalise(out)


def _special(flags: int) -> float:
    if flags & NAN or flags & (POS_INF | NEG_INF) == POS_INF | NEG_INF:
        return _from_bits(_NAN_BITS)
    return float("inf") if flags & POS_INF else float("-inf")


def _from_bits(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def to_float(record) -> float:
    """The correctly rounded double of a record (kernel: exs_round): round half to even, +-inf beyond the largest
    double, +0.0 for an exact zero; the flags' IEEE sum when non-finite values were added."""
    rec = normalise(np.array(record, dtype=np.int64).reshape(WIDTH))
    if rec[FLAGS]:
        return _special(int(rec[FLAGS]))
    limbs = [int(x) for x in rec[:NLIMBS]]
    neg = limbs[-1] < 0
    if neg:
        mag = np.zeros(WIDTH, dtype=np.int64)
        mag[:NLIMBS] = [-x for x in limbs]
        limbs = [int(x) for x in normalise(mag)[:NLIMBS]]
    return _from_bits(_round_bits(limbs) | (int(neg) << 63))


def to_parts(record) -> tuple:
    """The record as comms.reduce's exact parts: (N, -1074) with the sum = N 2**-1074, or ('nonfinite', the IEEE
    sum of the non-finite values) when its flags are set."""
    rec = normalise(np.array(record, dtype=np.int64).reshape(WIDTH))
    if rec[FLAGS]:
        return ("nonfinite", _special(int(rec[FLAGS])))
    return (sum(int(x) << (DIGIT_BITS * i) for i, x in enumerate(rec[:NLIMBS])), -1074)


def _round_bits(limbs: list) -> int:
    """The bits of the non-negative double nearest to sum_i limbs[i] 2**(32 i - 1074) (normalised digits)."""
    h = max((i for i, x in enumerate(limbs) if x), default=-1)
    if h < 0:
        return 0
    low = (limbs[1] << 32 | limbs[0]) if h >= 1 else limbs[0]
    if h <= 1 and low < (1 << 53):
        return low                                           # subnormal or below 2**-1021: exact, bits = N
    x = limbs[h]
    lz = 32 - x.bit_length()                                 # __clz of the top digit
    p = 32 * h + 31 - lz                                     # the leading bit of N
    if p > 2097:
        return _INF_BITS
    l1 = limbs[h - 1]
    l2 = limbs[h - 2] if h >= 2 else 0
    t = (((x << 32 | l1) << lz) | (l2 >> (32 - lz))) & _M64   # N's top 64 bits, leading bit at 63
    sticky = (t & 0x3FF) != 0 or (l2 & ((1 << (32 - lz)) - 1)) != 0 or any(limbs[:max(h - 2, 0)])
    q = t >> 11                                              # the top 53 bits
    up = (t >> 10) & 1 and (sticky or q & 1)                 # round half to even
    return min(((p - 52) << 52) + q + int(up), _INF_BITS)    # a carry out of q moves into the exponent
