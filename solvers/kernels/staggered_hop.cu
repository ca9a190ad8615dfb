// The HISQ hop (one output parity, a x + b D psi epilogue), its distributed variant reading received faces, and the
// face pack kernel. Drivers: solvers/staggered_cuda.py (CudaHop), solvers/staggered_dist_cuda.py (DistHop);
// NumPy twin: solvers.staggered.StaggeredDslash._hop_numpy. ``frozen`` (null, or the status slot of a device-resident
// solve's state vector, solvers/krylov_graph.py): when it is nonzero the solve has stopped and the replays past its
// end recompute nothing, so the hops return at once (the solve's fields stay as they are).
#include "hmc_common.cuh"

template <typename R>
__device__ __forceinline__ void madd(typename C2<R>::T &acc, typename C2<R>::T a, typename C2<R>::T b) {
    acc.x += a.x * b.x - a.y * b.y;
    acc.y += a.x * b.y + a.y * b.x;
}

__device__ __forceinline__ int wrap(int c, int n) { return c < 0 ? c + n : (c >= n ? c - n : c); }

// q conj(a b - c d): one entry of the rebuilt third row of a compressed Naik link
template <typename R>
__device__ __forceinline__ typename C2<R>::T rebuilt(typename C2<R>::T q, typename C2<R>::T a, typename C2<R>::T b,
                                                     typename C2<R>::T c, typename C2<R>::T d) {
    const R re = a.x * b.x - a.y * b.y - (c.x * d.x - c.y * d.y);
    const R im = a.x * b.y + a.y * b.x - (c.x * d.y + c.y * d.x);
    typename C2<R>::T r = {q.x * re + q.y * im, q.y * re - q.x * im};
    return r;
}

// The first plane of hop h in the link table: 9 planes a hop, or with ``clong`` (Naik hops present) 9 for each
// one-link hop and 7 for each Naik hop (rows 0 and 1, then the factor q with row 2 = q conj(row 0 x row 1):
// solvers.staggered_cuda.link_table), per direction +1, -1, +3, -3: 32 planes.
__device__ __forceinline__ int first_plane(int h, int mu, int w, int clong) {
    return clong ? mu * 32 + (w < 2 ? 9 * w : 18 + 7 * (w - 2)) : 9 * h;
}

// The 9 entries of hop h's link at site j (row-major). From a table of complex planes (first_plane: whole, or a
// compressed Naik link's rows 0 and 1 and q, row 2 = q conj(row 0 x row 1)), or, HALF, from the half-precision table
// of 32-bit words (solvers.half_links.half_table; ``clong`` then says that only the Naik hops are rounded): a rounded
// hop is 9 planes of 16-bit (re, im) pairs q and a plane of the link's scale s, entry = float(q) s, the value of the
// rounded block (one rounded product, as the twin makes it); a whole one 9 planes of complex numbers.
__device__ __forceinline__ long half_first_word(int h, int mu, int w, int naik_only) {
    return naik_only ? (long)mu * 56 + (w == 0 ? 0 : w == 1 ? 18 : w == 2 ? 36 : 46) : (long)h * 10;
}
template <typename R, bool HALF>
__device__ __forceinline__ void load_link(const void *__restrict__ links, int h, int mu, int w, int clong, long vh,
                                          long j, typename C2<R>::T l[9]) {
    typedef typename C2<R>::T T;
    if (HALF) {
        const long word = half_first_word(h, mu, w, clong) * vh;
        if (clong && w < 2) {
            const T *P = (const T *)((const int *)links + word) + j;
            #pragma unroll
            for (int e = 0; e < 9; ++e) l[e] = __ldg(P + e * vh);
            return;
        }
        const short2 *Q = (const short2 *)links + word + j;
        const R sc = __ldg((const float *)Q + 9 * vh);
        #pragma unroll
        for (int e = 0; e < 9; ++e) {
            const short2 q = __ldg(Q + e * vh);
            l[e].x = R(q.x) * sc;
            l[e].y = R(q.y) * sc;
        }
        return;
    }
    const T *L = (const T *)links + (long)first_plane(h, mu, w, clong) * vh + j;
    #pragma unroll
    for (int e = 0; e < 6; ++e) l[e] = __ldg(L + e * vh);
    if (clong && w >= 2) {
        const T q = __ldg(L + 6 * vh);
        l[6] = rebuilt<R>(q, l[1], l[5], l[2], l[4]);
        l[7] = rebuilt<R>(q, l[2], l[3], l[0], l[5]);
        l[8] = rebuilt<R>(q, l[0], l[4], l[1], l[3]);
    } else {
        #pragma unroll
        for (int e = 6; e < 9; ++e) l[e] = __ldg(L + e * vh);
    }
}

// The kernel's link table from the link blocks (nhop, V/2, 3, 3) of one output parity, one thread a site: every
// hop's 9 planes, or with ``clong`` a Naik hop's rows 0 and 1 and q, the least-squares factor of row 2 = q conj(row 0
// x row 1); err[j] = the largest |row 2 - q conj(row 0 x row 1)|^2 / |row 2|^2 of the site's Naik links. Twin:
// solvers.staggered_cuda.link_table (the same formulas, summed in another order).
template <typename R>
__device__ void build_table(const typename C2<R>::T *__restrict__ blocks, typename C2<R>::T *__restrict__ table,
                            R *__restrict__ err, int nhop, long vh, int clong) {
    typedef typename C2<R>::T T;
    const long j = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (j >= vh) return;
    const int per = nhop / 4;
    R worst = 0;
    for (int h = 0; h < nhop; ++h) {
        const int mu = h / per, w = h - mu * per;
        const T *m = blocks + ((long)h * vh + j) * 9;
        T *t = table + (long)first_plane(h, mu, w, clong) * vh + j;
        if (!(clong && w >= 2)) {
            for (int e = 0; e < 9; ++e) t[e * vh] = m[e];
            continue;
        }
        for (int e = 0; e < 6; ++e) t[e * vh] = m[e];
        const T one = {1, 0};
        T c[3] = {rebuilt<R>(one, m[1], m[5], m[2], m[4]), rebuilt<R>(one, m[2], m[3], m[0], m[5]),
                  rebuilt<R>(one, m[0], m[4], m[1], m[3])};         // conj(row 0 x row 1)
        R norm = 0, row = 0, miss = 0;
        T num = {0, 0};
        for (int e = 0; e < 3; ++e) {
            const T r = m[6 + e];
            norm += c[e].x * c[e].x + c[e].y * c[e].y;
            row += r.x * r.x + r.y * r.y;
            num.x += c[e].x * r.x + c[e].y * r.y;                    // conj(c) r
            num.y += c[e].x * r.y - c[e].y * r.x;
        }
        const R den = norm > 0 ? norm : R(1);                        // q = 0 where rows 0 and 1 are
        const T q = {num.x / den, num.y / den};
        for (int e = 0; e < 3; ++e) {
            const R dx = m[6 + e].x - (q.x * c[e].x - q.y * c[e].y), dy = m[6 + e].y - (q.x * c[e].y + q.y * c[e].x);
            miss += dx * dx + dy * dy;
        }
        const R ratio = miss / (row > 0 ? row : R(1));
        worst = ratio > worst ? ratio : worst;
        t[6 * vh] = q;
    }
    if (err != 0) err[j] = worst;
}

// One output site j (checkerboard index of ``parity``). DIST: the lattice is this rank's block; a hop that leaves it
// along a partitioned dimension (bit mu of pmask) reads the received face (mu, side) in ``ghost`` at goff[2 mu + side]
// (complex elements): a block of the local shape with extent ``depth`` along mu, side 0 = the backward neighbour's
// last depth slabs, side 1 = the forward neighbour's first ones. The arithmetic is the same in both instantiations.
// ``compact`` (whole lattice only): psi, out and x are parity-compact, checkerboard site j of its parity at row j: the
// neighbour at full-lattice index s (of the other parity) is compact site s >> 1 (x runs fastest and nx is even, so
// s >> 1 = (x >> 1) + (nx / 2) * row), and the output site and x are site j itself.
template <typename R, bool DIST, bool HALF>
__device__ __forceinline__ void hop_site(const typename C2<R>::T *__restrict__ psi, const void *__restrict__ links,
                    typename C2<R>::T *__restrict__ out,
                    const typename C2<R>::T *__restrict__ x, R a, R b, int parity, int nhop,
                    int nx, int ny, int nz, int nt, long j, const typename C2<R>::T *__restrict__ ghost,
                    const long long *__restrict__ goff, int pmask, int depth, int compact, int clong) {
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
            if (compact) s >>= 1;
        }
        const T v0 = src[3 * s], v1 = src[3 * s + 1], v2 = src[3 * s + 2];
        T l[9];
        load_link<R, HALF>(links, h, mu, w, clong, vh, j, l);
        madd<R>(acc0, l[0], v0); madd<R>(acc0, l[1], v1); madd<R>(acc0, l[2], v2);
        madd<R>(acc1, l[3], v0); madd<R>(acc1, l[4], v1); madd<R>(acc1, l[5], v2);
        madd<R>(acc2, l[6], v0); madd<R>(acc2, l[7], v1); madd<R>(acc2, l[8], v2);
    }
    const long o = (compact ? j : xx + (long)nx * (y + (long)ny * (z + (long)nz * t))) * 3;
    T r0 = {b * acc0.x, b * acc0.y}, r1 = {b * acc1.x, b * acc1.y}, r2 = {b * acc2.x, b * acc2.y};
    if (x != 0) {
        const T x0 = x[o], x1 = x[o + 1], x2 = x[o + 2];
        r0.x += a * x0.x; r0.y += a * x0.y; r1.x += a * x1.x; r1.y += a * x1.y; r2.x += a * x2.x; r2.y += a * x2.y;
    }
    out[o] = r0; out[o + 1] = r1; out[o + 2] = r2;
}

template <typename R, bool HALF>
__device__ void hop(const typename C2<R>::T *__restrict__ psi, const void *__restrict__ links,
                    typename C2<R>::T *__restrict__ out, const typename C2<R>::T *__restrict__ x,
                    R a, R b, int parity, int nhop, int nx, int ny, int nz, int nt, int compact, int clong,
                    const double *frozen) {
    if (frozen != 0 && *frozen != 0.0) return;      // a device-resident solve that has stopped (module note)
    const long vh = (long)nx * ny * nz * nt / 2;
    const long j = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (j >= vh) return;
    hop_site<R, false, HALF>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, j, 0, 0, 0, 1, compact,
                             clong);
}

// The distributed hop on the sites listed in ``sites`` (checkerboard indices; all vh sites when sites == 0).
template <typename R, bool HALF>
__device__ void hop_dist(const typename C2<R>::T *psi, const void *links, typename C2<R>::T *out,
                         const typename C2<R>::T *x, R a, R b, int parity, int nhop, int nx, int ny, int nz, int nt,
                         const int *sites, long nsites, const typename C2<R>::T *ghost, const long long *goff,
                         int pmask, int depth, int clong, const double *frozen) {
    if (frozen != 0 && *frozen != 0.0) return;
    const long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= nsites) return;
    const long j = sites ? (long)sites[i] : i;
    hop_site<R, true, HALF>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, j, ghost, goff, pmask, depth, 0,
                            clong);
}

// Faces into one contiguous send buffer: face f (table row f: mu, dir, offset, length in complex elements) holds the
// first (dir 0, for the backward neighbour) or last (dir 1) ``depth`` slabs along mu, in site order, 3 colours.
// hop_many: the one-rank hop of ``hop`` (compact or full-lattice fields) on nvec fields at once: psis[k], outs[k] and
// xs[k] (xs == 0: no a x term) are device addresses. Each hop's links are loaded once for up to MANY fields, so the
// links (2304 of the 3120 bytes a site of a double hop) are read ceil(nvec / MANY) times instead of nvec times. Each
// field's sums run in hop_site's order (the same hops, the same products, the same epilogue): the numbers of nvec
// ``hop`` calls. Driver: solvers.staggered_cuda.CudaHop.many (the refinement's batched true residuals,
// solvers/multishift.py). Kept beside hop_site rather than folded into it: the single-field hop runs at the copy
// bandwidth and stays as it was timed.
#define MANY 4
template <typename R, bool HALF>
__device__ void hop_many(const unsigned long long *psis, const void *__restrict__ links,
                         const unsigned long long *outs, const unsigned long long *xs, int nvec, R a, R b, int parity,
                         int nhop, int nx, int ny, int nz, int nt, int compact, int clong) {
    typedef typename C2<R>::T T;
    const long vh = (long)nx * ny * nz * nt / 2;
    const long j = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (j >= vh) return;
    const int half = nx / 2;
    long row = j / half;
    const int kx = j - row * half;
    const int y = row % ny; row /= ny;
    const int z = row % nz;
    const int t = row / nz;
    const int xx = 2 * kx + ((parity + y + z + t) & 1);
    const int c[4] = {xx, y, z, t};
    const int n[4] = {nx, ny, nz, nt};
    const long o = (compact ? j : xx + (long)nx * (y + (long)ny * (z + (long)nz * t))) * 3;
    for (int c0 = 0; c0 < nvec; c0 += MANY) {
        const int kc = nvec - c0 < MANY ? nvec - c0 : MANY;
        T acc[MANY][3];
        #pragma unroll
        for (int k = 0; k < MANY; ++k) {
            #pragma unroll
            for (int e = 0; e < 3; ++e) { acc[k][e].x = 0; acc[k][e].y = 0; }
        }
        for (int h = 0; h < nhop; ++h) {
            const int per = nhop / 4;
            const int mu = h / per;
            const int w = h - mu * per;
            const int step = (w == 0) ? 1 : (w == 1) ? -1 : (w == 2) ? 3 : -3;
            int cc[4] = {c[0], c[1], c[2], c[3]};
            cc[mu] = wrap(cc[mu] + step, n[mu]);
            long s = cc[0] + (long)nx * (cc[1] + (long)ny * (cc[2] + (long)nz * cc[3]));
            if (compact) s >>= 1;
            T l[9];
            load_link<R, HALF>(links, h, mu, w, clong, vh, j, l);
            #pragma unroll
            for (int k = 0; k < MANY; ++k) {
                if (k >= kc) break;
                const T *src = (const T *)psis[c0 + k];
                const T v0 = src[3 * s], v1 = src[3 * s + 1], v2 = src[3 * s + 2];
                madd<R>(acc[k][0], l[0], v0); madd<R>(acc[k][0], l[1], v1); madd<R>(acc[k][0], l[2], v2);
                madd<R>(acc[k][1], l[3], v0); madd<R>(acc[k][1], l[4], v1); madd<R>(acc[k][1], l[5], v2);
                madd<R>(acc[k][2], l[6], v0); madd<R>(acc[k][2], l[7], v1); madd<R>(acc[k][2], l[8], v2);
            }
        }
        #pragma unroll
        for (int k = 0; k < MANY; ++k) {      // unrolled with static indices: acc stays in registers
            if (k >= kc) break;
            T *out = (T *)outs[c0 + k];
            T r[3];
            #pragma unroll
            for (int e = 0; e < 3; ++e) { r[e].x = b * acc[k][e].x; r[e].y = b * acc[k][e].y; }
            if (xs != 0) {
                const T *x = (const T *)xs[c0 + k];
                #pragma unroll
                for (int e = 0; e < 3; ++e) { r[e].x += a * x[o + e].x; r[e].y += a * x[o + e].y; }
            }
            #pragma unroll
            for (int e = 0; e < 3; ++e) out[o + e] = r[e];
        }
    }
}

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
                                      double a, double b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                      int compact, int clong, const double *frozen) {
    hop<double, false>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, compact, clong, frozen);
}
extern "C" __global__ void hop_single(const float2 *psi, const float2 *links, float2 *out, const float2 *x,
                                      float a, float b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                      int compact, int clong, const double *frozen) {
    hop<float, false>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, compact, clong, frozen);
}
extern "C" __global__ void hop_dist_double(const double2 *psi, const double2 *links, double2 *out, const double2 *x,
                                           double a, double b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                           const int *sites, long long nsites, const double2 *ghost,
                                           const long long *goff, int pmask, int depth, int clong,
                                           const double *frozen) {
    hop_dist<double, false>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, sites, nsites, ghost, goff, pmask,
                            depth, clong, frozen);
}
extern "C" __global__ void hop_dist_single(const float2 *psi, const float2 *links, float2 *out, const float2 *x,
                                           float a, float b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                           const int *sites, long long nsites, const float2 *ghost,
                                           const long long *goff, int pmask, int depth, int clong,
                                           const double *frozen) {
    hop_dist<float, false>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, sites, nsites, ghost, goff, pmask,
                           depth, clong, frozen);
}
// The half-precision links (solvers.half_links): single-precision fields, the table of 16-bit link entries and
// scales; ``clong`` says that only the Naik hops are rounded (the rounded Naik links are never compressed).
extern "C" __global__ void hop_half(const float2 *psi, const int *links, float2 *out, const float2 *x, float a,
                                    float b, int parity, int nhop, int nx, int ny, int nz, int nt, int compact,
                                    int clong, const double *frozen) {
    hop<float, true>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, compact, clong, frozen);
}
extern "C" __global__ void hop_dist_half(const float2 *psi, const int *links, float2 *out, const float2 *x, float a,
                                         float b, int parity, int nhop, int nx, int ny, int nz, int nt,
                                         const int *sites, long long nsites, const float2 *ghost,
                                         const long long *goff, int pmask, int depth, int clong,
                                         const double *frozen) {
    hop_dist<float, true>(psi, links, out, x, a, b, parity, nhop, nx, ny, nz, nt, sites, nsites, ghost, goff, pmask,
                          depth, clong, frozen);
}
extern "C" __global__ void hop_many_half(const unsigned long long *psis, const int *links,
        const unsigned long long *outs, const unsigned long long *xs, int nvec, float a, float b, int parity,
        int nhop, int nx, int ny, int nz, int nt, int compact, int clong) {
    hop_many<float, true>(psis, links, outs, xs, nvec, a, b, parity, nhop, nx, ny, nz, nt, compact, clong);
}

// solvers.half_links.round_links (its twin: half_rounded, the same single-precision operations), in place: link k of
// the rounded hops (all of them, or with naik_only the Naik hops 4 mu + 2, 4 mu + 3), at site j of its hop's row r
// (k = r vh + j), becomes q s, q = rint(m / s) with s = max |m| / 32767, and scales[k] = s; one thread a link.
extern "C" __global__ void half_round(float2 *blocks, float *scales, long long vh, long long nlinks, int naik_only) {
    const long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (k >= nlinks) return;
    const long long r = k / vh, j = k - r * vh;
    const long long h = naik_only ? 4 * (r / 2) + 2 + (r % 2) : r;
    float2 *m = blocks + (h * vh + j) * 9;
    float big = 0.0f;
    for (int e = 0; e < 9; ++e) big = fmaxf(big, fmaxf(fabsf(m[e].x), fabsf(m[e].y)));
    const float sc = big / 32767.0f, safe = sc > 0.0f ? sc : 1.0f;
    for (int e = 0; e < 9; ++e) {
        const float2 r2 = {rintf(m[e].x / safe) * sc, rintf(m[e].y / safe) * sc};
        m[e] = r2;
    }
    scales[k] = sc;
}

// solvers.half_links.half_table: the blocks (nhop, vh, 9), rounded where the table rounds them, and the rounded hops'
// scales (one row each) as the half table (load_link); one thread a (hop, site).
extern "C" __global__ void table_half(const float2 *blocks, const float *scales, int *table, int nhop, long long vh,
                                      int naik_only) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)nhop * vh) return;
    const long long h = i / vh, j = i - h * vh;
    const int per = nhop / 4, mu = h / per, w = h - mu * per;
    const long long word = half_first_word(h, mu, w, naik_only) * vh;
    if (naik_only && w < 2) {                                       // a whole one-link hop
        float2 *P = (float2 *)(table + word) + j;
        for (int e = 0; e < 9; ++e) P[e * vh] = blocks[9 * i + e];
        return;
    }
    const long long row = naik_only ? 2 * mu + (w - 2) : h;        // the hop's row of scales
    const float sc = scales[row * vh + j], safe = sc > 0.0f ? sc : 1.0f;
    short2 *Q = (short2 *)table + word + j;
    for (int e = 0; e < 9; ++e) {
        const float2 v = blocks[9 * i + e];
        const short2 q = {(short)rintf(v.x / safe), (short)rintf(v.y / safe)};
        Q[e * vh] = q;
    }
    ((float *)Q)[9 * vh] = sc;
}

extern "C" __global__ void table_double(const double2 *blocks, double2 *table, double *err, int nhop, long long vh,
                                        int clong) {
    build_table<double>(blocks, table, err, nhop, vh, clong);
}
extern "C" __global__ void table_single(const float2 *blocks, float2 *table, float *err, int nhop, long long vh,
                                        int clong) {
    build_table<float>(blocks, table, err, nhop, vh, clong);
}
extern "C" __global__ void pack_double(const double2 *psi, double2 *buf, const int *tab, int nfaces, long long total,
                                       int nx, int ny, int nz, int nt, int depth) {
    pack<double2>(psi, buf, tab, nfaces, total, nx, ny, nz, nt, depth);
}
extern "C" __global__ void pack_single(const float2 *psi, float2 *buf, const int *tab, int nfaces, long long total,
                                       int nx, int ny, int nz, int nt, int depth) {
    pack<float2>(psi, buf, tab, nfaces, total, nx, ny, nz, nt, depth);
}
extern "C" __global__ void hop_many_double(const unsigned long long *psis, const double2 *links,
        const unsigned long long *outs, const unsigned long long *xs, int nvec, double a, double b, int parity,
        int nhop, int nx, int ny, int nz, int nt, int compact, int clong) {
    hop_many<double, false>(psis, links, outs, xs, nvec, a, b, parity, nhop, nx, ny, nz, nt, compact, clong);
}
extern "C" __global__ void hop_many_single(const unsigned long long *psis, const float2 *links,
        const unsigned long long *outs, const unsigned long long *xs, int nvec, float a, float b, int parity,
        int nhop, int nx, int ny, int nz, int nt, int compact, int clong) {
    hop_many<float, false>(psis, links, outs, xs, nvec, a, b, parity, nhop, nx, ny, nz, nt, compact, clong);
}

// The link blocks of StaggeredDslash.set_links (array twin: solvers.staggered._link_blocks_array): block h at the
// j-th site x = sites[j] of the output parity is, with mu = h / (nhop / 4) and kind = h % (nhop / 4),
//     0: fat_mu(x)    1: -fat_mu(x - mu)^dag    2: long_mu(x)    3: -long_mu(x - 3 mu)^dag    (periodic)
// on the whole lattice (fat, lng: (4, V, 3, 3) double, x fastest), written in double (out_d) and in single (out_s:
// the double value rounded, as astype rounds it), either null. One thread per matrix element (block, site, element),
// elements fastest, so that a warp's loads and stores are contiguous runs (one thread a matrix wrote 144-byte strides
// and took 9.3 ms at 32^4 against the twin's 5.8).
extern "C" __global__ void link_blocks(const double2 *__restrict__ fat, const double2 *__restrict__ lng,
        const long long *__restrict__ sites, double2 *__restrict__ out_d, float2 *__restrict__ out_s, int nhop,
        long long vh, int nx, int ny, int nz, int nt) {
    const long long gid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (gid >= 9 * nhop * vh) return;
    const long long m = gid / 9;                 // the matrix (h, j)
    const int e = gid - 9 * m, h = m / vh, per = nhop / 4, mu = h / per, kind = h % per;
    const long long j = m - (long long)h * vh, vol = (long long)nx * ny * nz * nt;
    long long s = sites[j];
    const bool back = kind & 1;
    if (back) {
        const int n[4] = {nx, ny, nz, nt}, step = kind == 1 ? 1 : 3;
        int c[4];
        long long r = s;
        c[0] = r % nx; r /= nx; c[1] = r % ny; r /= ny; c[2] = r % nz; c[3] = r / nz;
        #pragma unroll
        for (int i = 0; i < 4; ++i)          // unrolled select: c[mu] with mu known at run time only
            if (i == mu) c[i] = ((c[i] - step) % n[i] + n[i]) % n[i];
        s = c[0] + nx * (c[1] + ny * (c[2] + (long long)nz * c[3]));
    }
    const double2 *src = (kind < 2 ? fat : lng) + ((long long)mu * vol + s) * 9;
    const int row = e / 3, col = e - 3 * row;
    const double2 t = src[back ? 3 * col + row : e];
    const double2 v = back ? make_double2(-t.x, t.y) : t;          // -conj(m)^T: exact
    if (out_d) out_d[gid] = v;
    if (out_s) { const float2 w = {(float)v.x, (float)v.y}; out_s[gid] = w; }
}
