"""MILC's random numbers, reproduced exactly and vectorized over sites (docs/conventions.md 3.3).

MILC's RHMC (``ks_imp_rhmc``, compiled with ``SITERAND``) gives every lattice site its own generator
(``generic/ranstuff.c``), seeded by ``initialize_prn(prn, iseed, index)`` with MILC's site index
index = x + nx (y + ny (z + nz t)):

* seed <- (69607 + 8 index) seed + 12345 (32-bit wrap), 7 times: r0..r6 = (seed >> 8) & 0xffffff; once more:
  ic_state = seed, sign-extended to 64 bits; multiplier = 100000005 + 8 index, addend = 12345;
* ``myrand``: t = (((r5>>7)|(r6<<17)) ^ ((r4>>1)|(r5<<23))) & 0xffffff; shift r6 <- r5 ... r0 <- t;
  ic <- ic*multiplier + addend (mod 2^64); return (t ^ ((ic>>40) & 0xffffff)) / 2^24;
* ``complex_gaussian_rand_no`` (``libraries/gaussrand.c``, polar Box-Muller): v1 = 2 myrand - 1, v2 = 2 myrand - 1
  until r = v1^2 + v2^2 < 1; fac = sqrt(-ln r / r); z = v2 fac + i v1 fac. Density exp(-|z|^2): <|z|^2> = 1, each
  part has variance 1/2.

Draws at each site, in order: ``ranmom`` (``generic/ranmom.c`` -> ``libraries/rand_ahmat.c``) for d = x, y, z, t four
complex Gaussians r38, m01, m02, m12 making the traceless anti-Hermitian P with P_00 = i(r38.re + r38.im/sqrt3),
P_11 = i(-r38.re + r38.im/sqrt3), P_22 = -2i r38.im/sqrt3, P_01 = m01, P_02 = m02, P_12 = m12, P_ji = -conj(P_ij)
(<|P_01|^2> = 1, <Tr P^dag P / 2> = 4); then, on even sites only, 3 complex Gaussians per pseudofermion in file
order (``grsource_rhmc.c``); after the trajectory the PBP measurement draws 3 per site (all sites) per pbp mass.
Because every site has its own generator the order *between* sites never matters: a site's numbers are the same
in any decomposition, so each rank draws just its own sites.

The accept/reject number comes from ``node_prn`` = initialize_prn(iseed, volume + node) (node 0 on one rank; MILC
runs on N ranks use volume + rank, so that number depends on the rank count).

Checked against MILC's published outputs: for ``su3_rhmc_hisq.2`` (iseed 86658, 6^4, 4 pseudofermions) the
momenta give h = sum_{x,mu} [Tr P^dag P / 2 - 4] = -8.03775303465063e+01 (summed in MILC's order, see momentum_action) and the four ``GRSOURCE: sum`` values
1963.6750556, 1902.7332579, 1932.8576806, 1936.3357347, exactly as MILC prints them; node_prn's first number is
0.04078.

``variant="old"`` is MILC before ``OLD_GAUSSRAND`` was retired (multiplier 100005 + 8 index, 32-bit congruential
state, t ^ ((s >> 8) & 0xffffff); ``gaussian_rand_no`` returns v2 fac and caches v1 fac for the next call, and
``rand_ahmat`` fills r3, r8, m01.re, m02.re, m12.re, m01.im, m02.im, m12.im from successive reals). It reproduces
MILC's 2009 ``su3_rhmc_hisq.f211.2.sample-out`` (iseed 4563421): h = 99.4856713096055 and its five GRSOURCE sums.
MILC's old cache is one static (value, generator) pair; keeping the cached half per generator here is the same
thing whenever a site's draws are made together, as in all of MILC's SITERAND loops (ranmom, grsource, PBP).

Arithmetic is MILC's: the uniform numbers are exact, sqrt is IEEE (correctly rounded everywhere) and log is the C
library's (``math.log``): numpy's own SIMD log, used where the processor has AVX-512, differs from it in the last bit
for about 0.3 % of arguments, enough to change a Gaussian draw and MILC's trajectory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_M24 = 0xFFFFFF
_M32 = 0xFFFFFFFF
_SCALE = 1.0 / float(1 << 24)
_SQRT_THIRD = float(np.sqrt(1.0 / 3.0))


def _libm_log(x: np.ndarray) -> np.ndarray:
    """Natural log by the C library, element by element (MILC's ``log``; see the module notes); log 0 = -inf as in C
    (MILC's polar loop accepts r = 0, probability 2^-48)."""
    return np.fromiter((math.log(v) if v > 0.0 else -math.inf for v in x.tolist()), dtype=np.float64, count=x.size)


VARIANTS = ("current", "old")


def site_index(x, y, z, t, dims) -> np.ndarray:
    """MILC's site index x + nx (y + ny (z + nz t)) (the generator's index, and the file order)."""
    nx, ny, nz, _ = dims
    return np.asarray(x) + nx * (np.asarray(y) + ny * (np.asarray(z) + nz * np.asarray(t)))


def site_coords(index, dims) -> tuple[np.ndarray, ...]:
    nx, ny, nz, _ = dims
    i = np.asarray(index)
    return i % nx, (i // nx) % ny, (i // (nx * ny)) % nz, i // (nx * ny * nz)


def even_sites(dims) -> np.ndarray:
    """MILC indices of the even sites ((x+y+z+t) even), ascending."""
    idx = np.arange(int(np.prod(dims)))
    x, y, z, t = site_coords(idx, dims)
    return idx[(x + y + z + t) % 2 == 0]


def odd_sites(dims) -> np.ndarray:
    idx = np.arange(int(np.prod(dims)))
    x, y, z, t = site_coords(idx, dims)
    return idx[(x + y + z + t) % 2 == 1]


class PRNArray:
    """A set of independent MILC generators (one per index), advanced together or a subset at a time."""

    def __init__(self, seed: int, indices, variant: str = "current"):
        if variant not in VARIANTS:
            raise ValueError(f"unknown MILC RNG variant {variant!r}: use one of {VARIANTS}")
        if not 0 <= int(seed) <= _M32:
            raise ValueError(f"MILC's iseed is a 32-bit unsigned integer; got {seed}")
        self.variant = variant
        self.seed = int(seed)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() > _M32):
            raise ValueError("generator indices must be in [0, 2^32)")
        self.indices = idx
        n = idx.size
        a = (np.uint64(69607) + np.uint64(8) * idx.astype(np.uint64)) & np.uint64(_M32)
        s = np.full(n, self.seed, dtype=np.uint64)
        self.r = np.empty((7, n), dtype=np.int64)
        for k in range(7):
            s = (a * s + np.uint64(12345)) & np.uint64(_M32)
            self.r[k] = ((s >> np.uint64(8)) & np.uint64(_M24)).astype(np.int64)
        s = (a * s + np.uint64(12345)) & np.uint64(_M32)
        if variant == "current":
            # ic_state = seed: a 32-bit signed int, sign-extended into the 64-bit state
            neg = s >= np.uint64(1 << 31)
            ic = s.copy()
            ic[neg] = s[neg] | np.uint64(0xFFFFFFFF00000000)
            self.ic = ic
            self.mult = np.uint64(100000005) + np.uint64(8) * idx.astype(np.uint64)
        else:
            self.ic = s
            self.mult = (np.uint64(100005) + np.uint64(8) * idx.astype(np.uint64)) & np.uint64(_M32)
        self.addend = np.uint64(12345)
        # OLD_GAUSSRAND's gaussian_rand_no keeps the second number of each pair
        self.cached = np.zeros(n, dtype=bool)
        self.cache = np.zeros(n, dtype=np.float64)

    def __len__(self):
        return int(self.indices.size)

    # -- state ----------------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"variant": self.variant, "seed": self.seed, "indices": self.indices.copy(), "r": self.r.copy(),
                "ic": self.ic.copy(), "cached": self.cached.copy(), "cache": self.cache.copy()}

    @classmethod
    def from_state(cls, st: dict) -> "PRNArray":
        obj = cls(int(st["seed"]), np.asarray(st["indices"]), str(st["variant"]))
        r = np.asarray(st["r"], dtype=np.int64)
        ic = np.asarray(st["ic"], dtype=np.uint64)
        if r.shape != obj.r.shape or ic.shape != obj.ic.shape:
            raise ValueError(f"MILC RNG state has shape {r.shape}/{ic.shape}, expected {obj.r.shape}/{obj.ic.shape}")
        obj.r[...] = r
        obj.ic[...] = ic
        obj.cached[...] = np.asarray(st.get("cached", obj.cached), dtype=bool)
        obj.cache[...] = np.asarray(st.get("cache", obj.cache), dtype=np.float64)
        return obj

    # -- draws ----------------------------------------------------------------------------------------------------
    def _sel(self, sel):
        if sel is None:
            return np.arange(len(self))
        s = np.asarray(sel, dtype=np.int64).reshape(-1)
        if s.size and (s.min() < 0 or s.max() >= len(self)):
            raise IndexError("generator selection out of range")
        if np.unique(s).size != s.size:
            raise ValueError("a generator appears twice in one draw: draw it twice instead")
        return s

    def _myrand(self, s: np.ndarray) -> np.ndarray:
        r = self.r
        r4, r5, r6 = r[4, s], r[5, s], r[6, s]
        t = (((r5 >> 7) | (r6 << 17)) ^ ((r4 >> 1) | (r5 << 23))) & _M24
        r[1:, s] = r[:-1, s]
        r[0, s] = t
        if self.variant == "current":
            ic = self.ic[s] * self.mult[s] + self.addend          # uint64 arithmetic wraps mod 2^64
            self.ic[s] = ic
            hi = ((ic >> np.uint64(40)) & np.uint64(_M24)).astype(np.int64)
        else:
            ic = (self.ic[s] * self.mult[s] + self.addend) & np.uint64(_M32)
            self.ic[s] = ic
            hi = ((ic >> np.uint64(8)) & np.uint64(_M24)).astype(np.int64)
        return (t ^ hi).astype(np.float64) * _SCALE

    def uniform(self, sel=None) -> np.ndarray:
        """One ``myrand`` per selected generator (all by default), in [0, 1)."""
        return self._myrand(self._sel(sel))

    def _pairs(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One accepted polar Box-Muller pair (v2 fac, v1 fac) per generator in s; rejected generators draw again."""
        a = np.empty(s.size)
        b = np.empty(s.size)
        pending = np.arange(s.size)
        while pending.size:
            g = s[pending]
            v1 = 2.0 * self._myrand(g) - 1.0
            v2 = 2.0 * self._myrand(g) - 1.0
            rr = v1 * v1 + v2 * v2
            ok = rr < 1.0
            acc = pending[ok]
            with np.errstate(divide="ignore", invalid="ignore"):
                fac = np.sqrt(-_libm_log(rr[ok]) / rr[ok])
            a[acc] = v2[ok] * fac
            b[acc] = v1[ok] * fac
            pending = pending[~ok]
        return a, b

    def complex_gaussian(self, sel=None) -> np.ndarray:
        """``complex_gaussian_rand_no`` per selected generator: density exp(-|z|^2)."""
        s = self._sel(sel)
        if self.variant == "old":
            re = self._gaussian_old(s)
            im = self._gaussian_old(s)
            return re + 1j * im
        a, b = self._pairs(s)
        return a + 1j * b

    def gaussian(self, sel=None) -> np.ndarray:
        """``gaussian_rand_no`` (real, variance 1/2). Current MILC draws a fresh pair and drops v1 fac; the old one
        returns v2 fac and keeps v1 fac for the generator's next call."""
        s = self._sel(sel)
        if self.variant == "old":
            return self._gaussian_old(s)
        a, _ = self._pairs(s)
        return a

    def _gaussian_old(self, s):
        out = np.empty(s.size)
        have = self.cached[s]
        hs = s[have]
        out[have] = self.cache[hs]
        self.cached[hs] = False
        need = s[~have]
        if need.size:
            a, b = self._pairs(need)
            out[~have] = a
            self.cache[need] = b
            self.cached[need] = True
        return out


@dataclass
class _Layout:
    dims: tuple | None
    volume: int


class MilcRNG:
    """MILC's site generators (index 0 .. volume-1, MILC's site order) plus its node generator (volume + node).

    ``MilcRNG(seed, volume)`` or ``MilcRNG(seed, dims=(nx, ny, nz, nt))``. Site arguments (``sites``) are MILC
    site indices (all sites by default); every call draws one value (or vector/matrix) per listed site, in MILC's
    per-site order, and returns them in the order listed.
    """

    def __init__(self, seed: int, volume: int | None = None, *, dims=None, node: int = 0, variant: str = "current"):
        if dims is not None:
            dims = tuple(int(d) for d in dims)
            if len(dims) != 4 or min(dims) < 1:
                raise ValueError(f"dims must be four positive sizes, got {dims}")
            v = int(np.prod(dims))
            if volume is not None and int(volume) != v:
                raise ValueError(f"volume {volume} does not match dims {dims}")
            volume = v
        if volume is None or int(volume) < 1:
            raise ValueError("give the lattice volume or dims")
        self.layout = _Layout(dims, int(volume))
        self.seed = int(seed)
        self.variant = variant
        self.node = int(node)
        self.sites = PRNArray(seed, np.arange(self.layout.volume), variant)
        self.node_prn = PRNArray(seed, [self.layout.volume + self.node], variant)

    @property
    def volume(self) -> int:
        return self.layout.volume

    @property
    def dims(self):
        return self.layout.dims

    # -- basic draws ----------------------------------------------------------------------------------------------
    def uniform(self, sites=None) -> np.ndarray:
        return self.sites.uniform(sites)

    def gaussian(self, sites=None) -> np.ndarray:
        return self.sites.gaussian(sites)

    def complex_gaussian(self, sites=None) -> np.ndarray:
        return self.sites.complex_gaussian(sites)

    def gaussian_vector(self, sites=None, ncolors: int = 3) -> np.ndarray:
        """(n_sites, ncolors) complex: MILC's Gaussian color vector (color 0 first), as in grsource and the PBP
        source; on each site, density exp(-|g|^2)."""
        s = self.sites._sel(sites)
        return np.stack([self.sites.complex_gaussian(s) for _ in range(ncolors)], axis=1)

    def node_uniform(self) -> float:
        """The node generator's next ``myrand``: MILC's accept/reject number."""
        return float(self.node_prn.uniform()[0])

    # -- MILC's physics draws -------------------------------------------------------------------------------------
    def ranmom(self, sites=None) -> np.ndarray:
        """MILC's ``ranmom``: (n_sites, 4, 3, 3) complex traceless anti-Hermitian momenta, directions x, y, z, t."""
        s = self.sites._sel(sites)
        P = np.zeros((s.size, 4, 3, 3), dtype=np.complex128)
        for d in range(4):
            if self.variant == "old":
                g = [self.sites.gaussian(s) for _ in range(8)]
                r3, r8 = g[0], g[1]
                m01, m02, m12 = g[2] + 1j * g[5], g[3] + 1j * g[6], g[4] + 1j * g[7]
            else:
                r38 = self.sites.complex_gaussian(s)
                r3, r8 = r38.real, r38.imag
                m01 = self.sites.complex_gaussian(s)
                m02 = self.sites.complex_gaussian(s)
                m12 = self.sites.complex_gaussian(s)
            P[:, d] = ahmat(r3, r8, m01, m02, m12)
        return P

    def grsource(self, n_pseudo: int = 1, sites=None) -> np.ndarray:
        """(n_pseudo, n_sites, 3) complex: the heat-bath Gaussians g of each pseudofermion, in file order, on
        ``sites`` (the even sites, MILC's parity for the RHMC, when ``dims`` are known and sites is None)."""
        if sites is None:
            if self.dims is None:
                raise ValueError("grsource needs the even sites: construct MilcRNG with dims, or pass sites")
            sites = even_sites(self.dims)
        s = self.sites._sel(sites)
        return np.stack([self.gaussian_vector(s) for _ in range(int(n_pseudo))])

    # -- state ----------------------------------------------------------------------------------------------------
    def state(self) -> dict:
        """Everything needed to resume the streams exactly (numpy arrays and scalars; HDF5/npz friendly)."""
        st = {"seed": self.seed, "variant": self.variant, "node": self.node, "volume": self.volume,
              "dims": np.asarray(self.dims if self.dims else (), dtype=np.int64)}
        for k, v in self.sites.state().items():
            if k not in ("seed", "variant", "indices"):
                st[f"site_{k}"] = v
        for k, v in self.node_prn.state().items():
            if k not in ("seed", "variant", "indices"):
                st[f"node_{k}"] = v
        return st

    @classmethod
    def from_state(cls, st: dict) -> "MilcRNG":
        dims = tuple(int(d) for d in np.asarray(st.get("dims", ()))) or None
        obj = cls(int(st["seed"]), int(st["volume"]), dims=dims, node=int(st["node"]), variant=str(st["variant"]))
        for arr, pre in ((obj.sites, "site_"), (obj.node_prn, "node_")):
            sub = {"seed": obj.seed, "variant": obj.variant, "indices": arr.indices}
            sub.update({k[len(pre):]: v for k, v in st.items() if k.startswith(pre)})
            restored = PRNArray.from_state(sub)
            arr.r, arr.ic, arr.cached, arr.cache = restored.r, restored.ic, restored.cached, restored.cache
        return obj

    def set_state(self, st: dict) -> None:
        other = MilcRNG.from_state(st)
        self.__dict__.update(other.__dict__)


def ahmat(r3, r8, m01, m02, m12) -> np.ndarray:
    """MILC's anti_hermitmat (m00im, m11im, m22im from r3, r8; m01, m02, m12) as (..., 3, 3) complex matrices."""
    r3 = np.asarray(r3)
    P = np.zeros(r3.shape + (3, 3), dtype=np.complex128)
    P[..., 0, 0] = 1j * (r3 + _SQRT_THIRD * r8)
    P[..., 1, 1] = 1j * (-r3 + _SQRT_THIRD * r8)
    P[..., 2, 2] = 1j * (-2.0 * _SQRT_THIRD * r8)
    P[..., 0, 1] = m01
    P[..., 0, 2] = m02
    P[..., 1, 2] = m12
    P[..., 1, 0] = -np.conj(m01)
    P[..., 2, 0] = -np.conj(m02)
    P[..., 2, 1] = -np.conj(m12)
    return P


def ahmat_mag_sq(P) -> np.ndarray:
    """MILC's ahmat_mag_sq per matrix, in its order of operations: (m00^2 + m11^2 + m22^2)/2 + |m01|^2 + ..."""
    P = np.asarray(P)
    d = [P[..., k, k].imag for k in range(3)]
    s = 0.5 * d[0] * d[0]
    s = s + 0.5 * d[1] * d[1]
    s = s + 0.5 * d[2] * d[2]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        s = s + P[..., i, j].real * P[..., i, j].real
        s = s + P[..., i, j].imag * P[..., i, j].imag
    return s


def momentum_action(P, dims=None) -> float:
    """MILC's hmom_action: sum over links of [Tr(P^dag P)/2 - 4].

    P has shape (volume, 4, 3, 3) in MILC's site order. The sum is MILC's: sequential, over sites in the order of
    MILC's single-node hyper_prime layout when ``dims`` are given (even sites, then odd sites, each in index order;
    directions x..t within a site), else in index order. With ``dims`` it reproduces MILC's printed h to all 15
    digits (su3_rhmc_hisq.2: -8.03775303465063e+01).
    """
    per = ahmat_mag_sq(P) - 4.0
    if dims is not None:
        per = np.concatenate([per[even_sites(dims)].reshape(-1), per[odd_sites(dims)].reshape(-1)])
    return float(np.cumsum(per.reshape(-1))[-1]) if per.size else 0.0
