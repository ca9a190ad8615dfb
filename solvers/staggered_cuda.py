"""The HISQ hop (one output parity of D, with an a*x + b*D psi epilogue) as a hand-written CUDA kernel.

Twin: :meth:`solvers.staggered.StaggeredDslash._hop_numpy`. One thread per output site of the parity. The link
blocks of the operator (16 hops: +-1 and +-3 in each direction, backward links precomputed) are re-laid here once
as structure of arrays, (nhop, 9, V/2) complex, so that a warp reads 32 consecutive values per element: fully
coalesced. Neighbour sites come from the thread's coordinates (no index tables): the lattice site of checkerboard
index j of parity p is x = 2k + ((p + y + z + t) & 1) on row j / (nx/2).

Bytes moved per output site (the figure ``hmc bench dslash`` divides by): 16 links (144 B each in double), 16
neighbour vectors (48 B), the output vector and, with a != 0, the x vector: 3216 + 48 B in double, half in single.
"""
from __future__ import annotations

import numpy as np

_SOURCE = r"""
template <typename R> struct C2;
template <> struct C2<double> { typedef double2 T; };
template <> struct C2<float> { typedef float2 T; };

template <typename R>
__device__ __forceinline__ void madd(typename C2<R>::T &acc, typename C2<R>::T a, typename C2<R>::T b) {
    acc.x += a.x * b.x - a.y * b.y;
    acc.y += a.x * b.y + a.y * b.x;
}

__device__ __forceinline__ int wrap(int c, int n) { return c < 0 ? c + n : (c >= n ? c - n : c); }

// One output site j (checkerboard index of ``parity``). DIST: the lattice is this rank's block; a hop that leaves it
// along a partitioned dimension (bit mu of pmask) reads the received face (mu, side) in ``ghost`` at goff[2 mu + side]
// (complex elements): a block of the local shape with extent ``depth`` along mu, side 0 = the backward neighbour's
// last depth slabs, side 1 = the forward neighbour's first ones. The arithmetic is the same in both instantiations.
template <typename R, bool DIST>
__device__ __forceinline__ void hop_site(const typename C2<R>::T *__restrict__ psi,
                    const typename C2<R>::T *__restrict__ links, typename C2<R>::T *__restrict__ out,
                    const typename C2<R>::T *__restrict__ x, R a, R b, int parity, int nhop,
                    int nx, int ny, int nz, int nt, long j, const typename C2<R>::T *__restrict__ ghost,
                    const long long *__restrict__ goff, int pmask, int depth) {
    typedef typename C2<R>::T T;
    const long vh = (long)nx * ny * nz * nt / 2;
    const int half = nx / 2;
    long row = j / half;
    const int k = j - row * half;
    const int y = row % ny; row /= ny;
    const int z = row % nz;
    const int t = row / nz;
    const int xx = 2 * k + ((parity + y + z + t) & 1);
    const int c[4] = {xx, y, z, t};
    const int n[4] = {nx, ny, nz, nt};
    T acc0 = {0, 0}, acc1 = {0, 0}, acc2 = {0, 0};
    #pragma unroll
    for (int h = 0; h < 16; ++h) {
        if (h >= nhop) break;
        const int per = nhop / 4;            // hops per direction: 2 (+1,-1) or 4 (+1,-1,+3,-3)
        const int mu = h / per;
        const int w = h - mu * per;
        const int step = (w == 0) ? 1 : (w == 1) ? -1 : (w == 2) ? 3 : -3;
        int cc[4] = {c[0], c[1], c[2], c[3]};
        const T *src = psi;
        long s;
        const int m = cc[mu] + step;
        if (DIST && ((pmask >> mu) & 1) && (m < 0 || m >= n[mu])) {
            const int side = m < 0 ? 0 : 1;
            cc[mu] = side ? m - n[mu] : m + depth;
            int d[4] = {nx, ny, nz, nt};
            d[mu] = depth;
            s = cc[0] + (long)d[0] * (cc[1] + (long)d[1] * (cc[2] + (long)d[2] * cc[3]));
            src = ghost + goff[2 * mu + side];
        } else {
            cc[mu] = wrap(m, n[mu]);
            s = cc[0] + (long)nx * (cc[1] + (long)ny * (cc[2] + (long)nz * cc[3]));
        }
        const T v0 = src[3 * s], v1 = src[3 * s + 1], v2 = src[3 * s + 2];
        const T *L = links + (long)h * 9 * vh + j;
        madd<R>(acc0, __ldg(L + 0 * vh), v0); madd<R>(acc0, __ldg(L + 1 * vh), v1); madd<R>(acc0, __ldg(L + 2 * vh), v2);
        madd<R>(acc1, __ldg(L + 3 * vh), v0); madd<R>(acc1, __ldg(L + 4 * vh), v1); madd<R>(acc1, __ldg(L + 5 * vh), v2);
        madd<R>(acc2, __ldg(L + 6 * vh), v0); madd<R>(acc2, __ldg(L + 7 * vh), v1); madd<R>(acc2, __ldg(L + 8 * vh), v2);
    }
    const long o = (xx + (long)nx * (y + (long)ny * (z + (long)nz * t))) * 3;
    T r0 = {b * acc0.x, b * acc0.y}, r1 = {b * acc1.x, b * acc1.y}, r2 = {b * acc2.x, b * acc2.y};
    if (x != 0) {
        const T x0 = x[o], x1 = x[o + 1], x2 = x[o + 2];
        r0.x += a * x0.x; r0.y += a * x0.y; r1.x += a * x1.x; r1.y += a * x1.y; r2.x += a * x2.x; r2.y += a * x2.y;
    }
    out[o] = r0; out[o + 1] = r1; out[o + 2] = r2;
}

template <typename R>
__device__ void hop(const typename C2<R>::T *__restrict__ psi, const typename C2<R>::T *__restrict__ links,
                    typename C2<R>::T *__restrict__ out, const typename C2<R>::T *__restrict__ x,
                    R a, R b, int parity, int nhop, int nx, int ny, int nz, int nt) {
    const long vh = (long)nx * ny * nz * nt / 2;
    const long j = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (j >= vh) return;
    hop_site<R, false>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, j, 0, 0, 0, 1);
}

// The distributed hop on the sites listed in ``sites`` (checkerboard indices; all vh sites when sites == 0).
template <typename R>
__device__ void hop_dist(const typename C2<R>::T *psi, const typename C2<R>::T *links, typename C2<R>::T *out,
                         const typename C2<R>::T *x, R a, R b, int parity, int nhop, int nx, int ny, int nz, int nt,
                         const int *sites, long nsites, const typename C2<R>::T *ghost, const long long *goff,
                         int pmask, int depth) {
    const long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= nsites) return;
    const long j = sites ? (long)sites[i] : i;
    hop_site<R, true>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, j, ghost, goff, pmask, depth);
}

// Faces into one contiguous send buffer: face f (table row f: mu, dir, offset, length in complex elements) holds the
// first (dir 0, for the backward neighbour) or last (dir 1) ``depth`` slabs along mu, in site order, 3 colours.
template <typename T>
__device__ void pack(const T *__restrict__ psi, T *__restrict__ buf, const int *__restrict__ tab, int nfaces,
                     long total, int nx, int ny, int nz, int nt, int depth) {
    const long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= total) return;
    int f = 0;
    while (f + 1 < nfaces && i >= tab[4 * (f + 1) + 2]) ++f;
    const int mu = tab[4 * f], dir = tab[4 * f + 1];
    const long e = i - tab[4 * f + 2];
    const int col = e % 3;
    long site = e / 3;
    int d[4] = {nx, ny, nz, nt};
    const int n[4] = {nx, ny, nz, nt};
    d[mu] = depth;
    int cc[4];
    cc[0] = site % d[0]; site /= d[0];
    cc[1] = site % d[1]; site /= d[1];
    cc[2] = site % d[2];
    cc[3] = site / d[2];
    if (dir == 1) cc[mu] += n[mu] - depth;
    const long s = cc[0] + (long)nx * (cc[1] + (long)ny * (cc[2] + (long)nz * cc[3]));
    buf[i] = psi[3 * s + col];
}

extern "C" __global__ void hop_double(const double2 *psi, const double2 *links, double2 *out, const double2 *x,
                                      double a, double b, int parity, int nhop, int nx, int ny, int nz, int nt) {
    hop<double>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt);
}
extern "C" __global__ void hop_single(const float2 *psi, const float2 *links, float2 *out, const float2 *x,
                                      float a, float b, int parity, int nhop, int nx, int ny, int nz, int nt) {
    hop<float>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt);
}
extern "C" __global__ void hop_dist_double(const double2 *psi, const double2 *links, double2 *out, const double2 *x,
                                           double a, double b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                           const int *sites, long long nsites, const double2 *ghost,
                                           const long long *goff, int pmask, int depth) {
    hop_dist<double>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, sites, nsites, ghost, goff, pmask, depth);
}
extern "C" __global__ void hop_dist_single(const float2 *psi, const float2 *links, float2 *out, const float2 *x,
                                           float a, float b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                           const int *sites, long long nsites, const float2 *ghost,
                                           const long long *goff, int pmask, int depth) {
    hop_dist<float>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, sites, nsites, ghost, goff, pmask, depth);
}
extern "C" __global__ void pack_double(const double2 *psi, double2 *buf, const int *tab, int nfaces, long long total,
                                       int nx, int ny, int nz, int nt, int depth) {
    pack<double2>(psi, buf, tab, nfaces, total, nx, ny, nz, nt, depth);
}
extern "C" __global__ void pack_single(const float2 *psi, float2 *buf, const int *tab, int nfaces, long long total,
                                       int nx, int ny, int nz, int nt, int depth) {
    pack<float2>(psi, buf, tab, nfaces, total, nx, ny, nz, nt, depth);
}
"""

BLOCK = 128


def hop_bytes(dtype, naik: bool = True, axpy: bool = False) -> int:
    """Bytes one output site must move: links, neighbour vectors, output (and x for the a*x epilogue)."""
    c = np.dtype(dtype).itemsize
    nhop = 16 if naik else 8
    return nhop * 9 * c + nhop * 3 * c + 3 * c + (3 * c if axpy else 0)


class CudaHop:
    """``f(psi, parity, out, a, x, b)`` for one StaggeredDslash, on its geometry's GPU."""

    def __init__(self, dslash):
        self.dslash = dslash
        be = dslash.geom.backend
        cp = be.xp
        self.cp = cp
        mod = be.kernel(("staggered_hop",), lambda: cp.RawModule(code=_SOURCE, options=("--std=c++14",)))
        single = np.dtype(dslash.dtype) == np.complex64
        self.kernel = mod.get_function("hop_single" if single else "hop_double")
        self.real = np.float32 if single else np.float64
        self._soa = {}

    def _links(self, parity):
        """The operator's links of this parity in SoA layout, rebuilt when the operator's links change."""
        blocks = self.dslash._links[parity]
        key = (parity, id(blocks))
        if key not in self._soa:
            self._soa = {k: v for k, v in self._soa.items() if k[0] != parity}
            nhop, vh = blocks.shape[0], blocks.shape[1]
            self._soa[key] = (self.cp.ascontiguousarray(blocks.reshape(nhop, vh, 9).transpose(0, 2, 1)), blocks)
        return self._soa[key][0]

    def __call__(self, psi, parity, out, a, x, b):
        geom = self.dslash.geom
        nx, ny, nz, nt = geom.local_dims
        links = self._links(parity)
        nhop = links.shape[0]
        vh = links.shape[2]
        psi = self.cp.ascontiguousarray(psi)
        xarg = self.cp.ascontiguousarray(x) if (x is not None and a != 0.0) else 0
        self.kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,),
                    (psi, links, out, xarg, self.real(a), self.real(b), np.int32(parity), np.int32(nhop),
                     np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt)))


def _factory(dslash):
    """The kernel when the whole lattice lives on this GPU; on a partitioned grid the distributed hop of
    :mod:`solvers.staggered_dist_cuda` (pack kernel, device-to-device exchange, interior and exterior kernels), or
    the array body (shifts through the halo code) where its layout does not fit."""
    if dslash.geom.grid.comm.size != 1 or any(getattr(dslash.geom.grid, "partitioned", (False,) * 4)):
        from .staggered_dist_cuda import make_hop

        return make_hop(dslash) or dslash._hop_numpy
    if dslash.geom.local_dims[0] % 2:
        return dslash._hop_numpy
    return CudaHop(dslash)


from .staggered import register_hop_kernel  # noqa: E402

register_hop_kernel("cupy", _factory)
