"""Counter-based random numbers keyed by global site index: the same numbers on CPU and GPU, for any decomposition.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11). The key is the run seed and
the stream name; the counter is (global site index, block within the site, draw number of the stream). Every
site draws its own numbers wherever it lives, so a rank holding part of the lattice draws exactly the numbers a
single process would. The generator's only state is one draw counter per stream, stored in the run file.
"""
from __future__ import annotations

import zlib

import numpy as np

from .backend import array_module

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32 on uint64 arrays holding 32-bit words; returns four uint64 arrays of 32-bit words."""
    xp = array_module(c0)
    m0, m1, mask = xp.uint64(_M0), xp.uint64(_M1), xp.uint64(_MASK32)
    s32 = xp.uint64(32)
    for _ in range(rounds):
        p0 = c0 * m0
        p1 = c2 * m1
        hi0, lo0 = p0 >> s32, p0 & mask
        hi1, lo1 = p1 >> s32, p1 & mask
        c0, c1, c2, c3 = hi1 ^ c1 ^ xp.uint64(k0), lo1, hi0 ^ c3 ^ xp.uint64(k1), lo0
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def _stream_key(seed: int, stream: str) -> tuple[int, int]:
    tag = zlib.crc32(stream.encode())
    return seed & _MASK32, ((seed >> 32) ^ tag) & _MASK32


class CounterRNG:
    """Gaussian and uniform numbers for named streams, indexed by global site."""

    def __init__(self, seed: int, counters: dict | None = None):
        if not 0 <= int(seed) < 2**63:
            raise ValueError(f"seed {seed} out of range: use an integer in [0, 2^63)")
        self.seed = int(seed)
        self.counters: dict[str, int] = dict(counters or {})

    def state(self) -> dict:
        return {"seed": self.seed, "counters": dict(self.counters)}

    def next_draw(self, stream: str) -> int:
        n = self.counters.get(stream, 0)
        self.counters[stream] = n + 1
        return n

    def _words(self, stream, draw, site_ids, nblocks):
        xp = array_module(site_ids)
        k0, k1 = _stream_key(self.seed, stream)
        sid = site_ids.astype(xp.uint64).reshape(-1, 1)
        blk = xp.arange(nblocks, dtype=xp.uint64).reshape(1, -1)
        shape = (sid.shape[0], nblocks)
        c0 = xp.broadcast_to(sid & xp.uint64(_MASK32), shape).copy()
        c1 = xp.broadcast_to(sid >> xp.uint64(32), shape).copy()
        c2 = xp.broadcast_to(blk, shape).copy()
        c3 = xp.full(shape, draw & _MASK32, dtype=xp.uint64)
        return philox4x32(c0, c1, c2, c3, k0, k1)

    def uniform(self, stream: str, site_ids, n: int, draw: int | None = None):
        """Uniform doubles in [0, 1), shape site_ids.shape + (n,): 53 random bits from two 32-bit words."""
        xp = array_module(site_ids)
        draw = self.next_draw(stream) if draw is None else draw
        nblocks = (n + 1) // 2
        w = self._words(stream, draw, site_ids, nblocks)
        scale = 1.0 / 9007199254740992.0
        a = ((w[0] >> xp.uint64(5)) * xp.uint64(67108864) + (w[1] >> xp.uint64(6))).astype(xp.float64) * scale
        b = ((w[2] >> xp.uint64(5)) * xp.uint64(67108864) + (w[3] >> xp.uint64(6))).astype(xp.float64) * scale
        u = xp.stack([a, b], axis=-1).reshape(sid_shape(site_ids) + (2 * nblocks,))
        return u[..., :n]

    def gaussian(self, stream: str, site_ids, n: int, draw: int | None = None):
        """N(0,1) doubles, shape site_ids.shape + (n,), by Box-Muller on pairs of uniforms."""
        xp = array_module(site_ids)
        m = n + (n % 2)
        u = self.uniform(stream, site_ids, m, draw)
        u1 = 1.0 - u[..., 0::2]  # in (0, 1]
        u2 = u[..., 1::2]
        r = xp.sqrt(-2.0 * xp.log(u1))
        g = xp.stack([r * xp.cos(2 * np.pi * u2), r * xp.sin(2 * np.pi * u2)], axis=-1)
        return g.reshape(u.shape[:-1] + (m,))[..., :n]

    def global_uniform(self, stream: str) -> float:
        """One uniform number shared by all ranks (for example the Metropolis test)."""
        return float(self.uniform(stream, np.zeros(1, dtype=np.int64), 1)[0, 0])


def sid_shape(site_ids) -> tuple:
    return tuple(site_ids.shape)
