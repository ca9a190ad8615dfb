// The declarations every kernel file of the project shares (each .cu file starts with #include "hmc_common.cuh";
// lattice/cuda_source.py puts this text in place of that line before compiling, so nvrtc needs no include path and
// CuPy's compile cache sees every byte that is compiled). Only helpers that were written out identically in
// several kernel sources live here; a file's own variants (other loads, products with another summation order)
// stay in it, so that every kernel's arithmetic is exactly what it was. The 3x3 algebra (namespace m3), the walk on
// a periodic or halo-padded box (namespace lat) and the staple operator of the link smearing (namespace staple)
// are those of the HISQ kernels (force/kernels/hisq*.cu); namespaces keep their short names apart from the other
// files' own helpers.
#ifndef HMC_COMMON_CUH
#define HMC_COMMON_CUH

// the complex type of a real precision R: C2<double>::T = double2, C2<float>::T = float2
template <typename R> struct C2;
template <> struct C2<double> { typedef double2 T; };
template <> struct C2<float> { typedef float2 T; };

// a 3x3 complex matrix, row-major (e[3 i + j] = M_ij), as the (..., 3, 3) link arrays store it
struct M3 { double2 e[9]; };

// double-precision complex arithmetic on double2 (x: real part, y: imaginary part)
__device__ __forceinline__ double2 cadd(double2 a, double2 b) { return make_double2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ double2 cmul(double2 a, double2 b) {
    return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ double2 cmulc(double2 a, double2 b) {  // a * conj(b)
    return make_double2(a.x * b.x + a.y * b.y, a.y * b.x - a.x * b.y);
}
__device__ __forceinline__ double2 ccmul(double2 a, double2 b) {  // conj(a) * b
    return make_double2(a.x * b.x + a.y * b.y, a.x * b.y - a.y * b.x);
}

namespace m3 {
// the matrix at `site` of a field of 3x3 matrices (9 double2 each, row-major), through the read-only cache
__device__ __forceinline__ M3 load(const double2 *__restrict__ p, long site) {
    M3 m;
    const double2 *q = p + 9 * site;
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = __ldg(q + i);
    return m;
}
__device__ __forceinline__ void store(double2 *__restrict__ p, long site, const M3 &m) {
    double2 *q = p + 9 * site;
    #pragma unroll
    for (int i = 0; i < 9; ++i) q[i] = m.e[i];
}
// the element-major layout of the staged HISQ kernels' fields (force/kernels/hisq_staged*.cu): element i of the
// matrix at `site` at p[i stride + site], stride the field's sites, so that the threads of consecutive sites read
// consecutive 16-byte elements (a warp's load: 512 contiguous bytes, not 32 pieces 144 bytes apart)
__device__ __forceinline__ M3 load(const double2 *__restrict__ p, long site, long stride) {
    M3 m;
    const double2 *q = p + site;
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = __ldg(q + i * stride);
    return m;
}
__device__ __forceinline__ void store(double2 *__restrict__ p, long site, long stride, const M3 &m) {
    #pragma unroll
    for (int i = 0; i < 9; ++i) p[i * stride + site] = m.e[i];
}
// the products a b, a b^dag, a^dag b: (c)_ik = sum_j in the order j = 0, 1, 2, the first term not added to zero
__device__ __forceinline__ M3 nn(const M3 &a, const M3 &b) {
    M3 c;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = cmul(a.e[3 * i], b.e[k]);
            s = cadd(s, cmul(a.e[3 * i + 1], b.e[3 + k]));
            s = cadd(s, cmul(a.e[3 * i + 2], b.e[6 + k]));
            c.e[3 * i + k] = s;
        }
    return c;
}
__device__ __forceinline__ M3 nd(const M3 &a, const M3 &b) {  // a b^dag
    M3 c;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = cmulc(a.e[3 * i], b.e[3 * k]);
            s = cadd(s, cmulc(a.e[3 * i + 1], b.e[3 * k + 1]));
            s = cadd(s, cmulc(a.e[3 * i + 2], b.e[3 * k + 2]));
            c.e[3 * i + k] = s;
        }
    return c;
}
__device__ __forceinline__ M3 dn(const M3 &a, const M3 &b) {  // a^dag b
    M3 c;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = ccmul(a.e[i], b.e[k]);
            s = cadd(s, ccmul(a.e[3 + i], b.e[3 + k]));
            s = cadd(s, ccmul(a.e[6 + i], b.e[6 + k]));
            c.e[3 * i + k] = s;
        }
    return c;
}
__device__ __forceinline__ void mac(M3 &y, const M3 &a, const M3 &b) {  // y += a b, each term added to y in turn
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = y.e[3 * i + k];
            s = cadd(s, cmul(a.e[3 * i], b.e[k]));
            s = cadd(s, cmul(a.e[3 * i + 1], b.e[3 + k]));
            s = cadd(s, cmul(a.e[3 * i + 2], b.e[6 + k]));
            y.e[3 * i + k] = s;
        }
}
__device__ __forceinline__ M3 dag(const M3 &a) {
    M3 c;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) c.e[3 * i + k] = make_double2(a.e[3 * k + i].x, -a.e[3 * k + i].y);
    return c;
}
__device__ __forceinline__ void add(M3 &y, const M3 &x) {  // y += x
    #pragma unroll
    for (int i = 0; i < 9; ++i) y.e[i] = cadd(y.e[i], x.e[i]);
}
__device__ __forceinline__ void axpy(M3 &y, double a, const M3 &x) {  // y += a x
    #pragma unroll
    for (int i = 0; i < 9; ++i) { y.e[i].x += a * x.e[i].x; y.e[i].y += a * x.e[i].y; }
}
__device__ __forceinline__ M3 scaled(double a, const M3 &x) {
    M3 y;
    #pragma unroll
    for (int i = 0; i < 9; ++i) y.e[i] = make_double2(a * x.e[i].x, a * x.e[i].y);
    return y;
}
__device__ __forceinline__ M3 zero() {
    M3 y;
    #pragma unroll
    for (int i = 0; i < 9; ++i) y.e[i] = make_double2(0.0, 0.0);
    return y;
}
__device__ __forceinline__ void add_dag(M3 &y, const M3 &h) { add(y, dag(h)); }  // y += h^dag
}  // namespace m3

namespace lat {
// The sites the threads cover (the region: extents n, vol of them) at the origin o of the box the fields live on
// (extents p, pvol sites, x fastest; neighbours wrap modulo p). One GPU, whole lattice: region = box, o = 0,
// periodic (whole()). On a partitioned lattice the box is the halo-padded local array and the region its interior,
// or the interior grown by the sites an intermediate is read at; the padding is deep enough that the walks of the
// interior's paths never wrap on a padded dimension.
struct Box {
    int n[4];
    long vol;
    int p[4];
    long pvol;
    int o[4];
};
__device__ __forceinline__ Box box(int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                   int ox, int oy, int oz, int ot) {
    Box L;
    L.n[0] = nx; L.n[1] = ny; L.n[2] = nz; L.n[3] = nt;
    L.vol = (long)nx * ny * nz * nt;
    L.p[0] = px; L.p[1] = py; L.p[2] = pz; L.p[3] = pt;
    L.pvol = (long)px * py * pz * pt;
    L.o[0] = ox; L.o[1] = oy; L.o[2] = oz; L.o[3] = ot;
    return L;
}
__device__ __forceinline__ Box whole(int nx, int ny, int nz, int nt) {
    return box(nx, ny, nz, nt, nx, ny, nz, nt, 0, 0, 0, 0);
}
// the box coordinates of region site number `site` (x fastest)
__device__ __forceinline__ void coords(const Box &L, long site, int c[4]) {
    long r = site;
    c[0] = r % L.n[0] + L.o[0]; r /= L.n[0];
    c[1] = r % L.n[1] + L.o[1]; r /= L.n[1];
    c[2] = r % L.n[2] + L.o[2]; c[3] = r / L.n[2] + L.o[3];
}
__device__ __forceinline__ long index(const Box &L, const int q[4]) {
    return q[0] + (long)L.p[0] * (q[1] + (long)L.p[1] * (q[2] + (long)L.p[2] * q[3]));
}
__device__ __forceinline__ int wrap(int v, int n) { v %= n; return v < 0 ? v + n : v; }
// v[d] for a d known only at run time, by selects: an array indexed at run time would live in local memory
__device__ __forceinline__ int pick(const int v[4], int d) {
    return d == 0 ? v[0] : d == 1 ? v[1] : d == 2 ? v[2] : v[3];
}
// the site x + s1 d1_hat + s2 d2_hat (modulo the box; d2 may be d1: then wrapped after each step, as two hops)
__device__ __forceinline__ long hop(const Box &L, const int c[4], int d1, int s1, int d2, int s2) {
    const int q1 = wrap(pick(c, d1) + s1, pick(L.p, d1));
    const int q2 = wrap((d2 == d1 ? q1 : pick(c, d2)) + s2, pick(L.p, d2));
    int q[4];
    #pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = k == d2 ? q2 : k == d1 ? q1 : c[k];
    return index(L, q);
}
// the j-th direction != mu (increasing), the index j of the direction nu != mu, and the fourth direction
__device__ __forceinline__ int other(int mu, int j) { return j < mu ? j : j + 1; }
__device__ __forceinline__ int slot(int mu, int nu) { return nu < mu ? nu : nu - 1; }
__device__ __forceinline__ int fourth(int mu, int nu, int rho) { return 6 - mu - nu - rho; }
// The order in which the threads of a launch over several fields of one lattice take their sites: 32 consecutive
// sites (lanes) times the fields, so that the operands the fields of a site share, and their neighbours', are read
// by threads that run together (from L1 and L2, not once per field from memory), and the sites in tiles of extents
// (nx, ty, tz, tt), x whole, the tiles in lexicographic order, so that the y, z and t neighbours of the sites in
// flight are mostly in flight or recent too (docs/perf-notes.md, session 18). ty, tz, tt divide ny, nz, nt (1:
// lexicographic along that axis). Sets the box coordinates x of the s-th site of the region (extents nx..nt at
// ox..ot in the box) and returns its lexicographic number in the region.
#define LANES 32
__device__ __forceinline__ long tiled_site(long s, int *x, int nx, int ny, int nz, int nt, int ty, int tz, int tt,
                                           int ox, int oy, int oz, int ot) {
    const long tile_sites = (long)nx * ty * tz * tt;
    long tile = s / tile_sites, w = s - tile * tile_sites;
    const int cx = w % nx; w /= nx;
    const int dy = w % ty; w /= ty;
    const int dz = w % tz, dt = w / tz;
    const int my = ny / ty, mz = nz / tz;
    const int cy = (tile % my) * ty + dy; tile /= my;
    const int cz = (tile % mz) * tz + dz, ct = (tile / mz) * tt + dt;
    x[0] = cx + ox; x[1] = cy + oy; x[2] = cz + oz; x[3] = ct + ot;
    return cx + (long)nx * (cy + (long)ny * (cz + (long)nz * ct));
}
// the tile extent of job(): the greatest common divisor of n and 8
__device__ __forceinline__ int tile8(int n) { return n % 8 == 0 ? 8 : n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1; }
// what thread gid of a launch over `fields` fields of matrices, one thread a matrix, works on: field f, site x (its
// lexicographic number in the region; coordinates c), in the order of tiled_site with tiles (ty, tz, tt); false
// past the end. The launch has fields x 32 x ceil(vol / 32) threads (force.hisq_staged.launch).
struct Job {
    int f;
    long x;
    int c[4];
};
__device__ __forceinline__ bool job(const Box &L, int fields, int ty, int tz, int tt, Job &j) {
    const long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    const long chunk = gid / (fields * LANES);
    const int w = gid - chunk * (fields * LANES);
    const long s = chunk * LANES + w % LANES;
    if (s >= L.vol) return false;
    j.f = w / LANES;
    j.x = tiled_site(s, j.c, L.n[0], L.n[1], L.n[2], L.n[3], ty, tz, tt, L.o[0], L.o[1], L.o[2], L.o[3]);
    return true;
}
// the same with the tiles of tile8(n) (the staged HISQ kernels, outer_acc)
__device__ __forceinline__ bool job(const Box &L, int fields, Job &j) {
    return job(L, fields, tile8(L.n[1]), tile8(L.n[2]), tile8(L.n[3]), j);
}
}  // namespace lat

namespace staple {
// Every field below is read site-major (SOA false: m3::load(p, site), the link arrays' layout) or element-major
// (SOA true: m3::load(p, site, stride) with stride the box's sites, L.pvol; the staged kernels); the same sums.
template <bool SOA>
__device__ __forceinline__ M3 ld(const double2 *p, long site, long stride) {
    return SOA ? m3::load(p, site, stride) : m3::load(p, site);     // SOA is a constant: one of the two is compiled
}
// X = a1 X1 + a2 X2 at a site of the box (X2 only where has2), X1, X2 one-direction fields
struct Arg {
    const double2 *x1;
    double a1;
    const double2 *x2;
    double a2;
    bool has2;
};
__device__ __forceinline__ Arg arg(const double2 *x1, double a1 = 1.0, const double2 *x2 = nullptr, double a2 = 0.0,
                                   bool has2 = false) {
    Arg a;
    a.x1 = x1; a.a1 = a1; a.x2 = x2; a.a2 = a2; a.has2 = has2;
    return a;
}
template <bool SOA = false>
__device__ __forceinline__ M3 at(const Arg &X, long site, long stride = 0) {
    M3 m = m3::scaled(X.a1, ld<SOA>(X.x1, site, stride));
    if (X.has2) m3::axpy(m, X.a2, ld<SOA>(X.x2, site, stride));
    return m;
}
// S_nu[X]_mu(x) = U_nu(x) X(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag X(x-nu) U_nu(x-nu+mu) (docs/conventions.md 1.3),
// x the box site of coordinates c; Un: the nu links
template <bool SOA = false>
__device__ __forceinline__ M3 fwd(const lat::Box &L, const int c[4], long x, const double2 *Un, int nu, int mu,
                                  const Arg &X) {
    const long xpn = lat::hop(L, c, nu, 1, mu, 0), xpm = lat::hop(L, c, mu, 1, nu, 0);
    const long xmn = lat::hop(L, c, nu, -1, mu, 0), xmnpm = lat::hop(L, c, nu, -1, mu, 1);
    const long n = L.pvol;
    M3 r = m3::nd(m3::nn(ld<SOA>(Un, x, n), at<SOA>(X, xpn, n)), ld<SOA>(Un, xpm, n));
    m3::add(r, m3::nn(m3::dn(ld<SOA>(Un, xmn, n), at<SOA>(X, xmn, n)), ld<SOA>(Un, xmnpm, n)));
    return r;
}
// the adjoint in X: S_nu^T[D](x) = U_nu(x-nu+mu)^dag D(x-nu) U_nu(x-nu) + U_nu(x+mu) D(x+nu) U_nu(x)^dag
template <bool SOA = false>
__device__ __forceinline__ M3 adj(const lat::Box &L, const int c[4], long x, const double2 *Un, int nu, int mu,
                                  const double2 *D) {
    const long xpn = lat::hop(L, c, nu, 1, mu, 0), xpm = lat::hop(L, c, mu, 1, nu, 0);
    const long xmn = lat::hop(L, c, nu, -1, mu, 0), xmnpm = lat::hop(L, c, nu, -1, mu, 1);
    const long n = L.pvol;
    M3 r = m3::dn(ld<SOA>(Un, xmnpm, n), m3::nn(ld<SOA>(D, xmn, n), ld<SOA>(Un, xmn, n)));
    m3::add(r, m3::nn(ld<SOA>(Un, xpm, n), m3::nd(ld<SOA>(D, xpn, n), ld<SOA>(Un, x, n))));
    return r;
}
}  // namespace staple

#endif  // HMC_COMMON_CUH
