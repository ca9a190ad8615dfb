// The staged HISQ fat-link kernels: F[U; c] for all four directions in three launches (driver and byte model:
// force/hisq_staged.py; NumPy twin: force.smearing.fat_link). The whole lattice on one GPU, unpadded links
// (4, nt, nz, ny, nx, 3, 3), neighbours wrapping periodically. A pair p = 3 mu + j names the link direction mu and
// the staple direction nu = others(mu)[j] (others(mu): the three directions != mu, ascending); the intermediate
// fields of the pairs are (12, nt, nz, ny, nx, 3, 3).
//
//   staged_a:     A_p(x)     = S_nu[U_mu]_mu(x)                                                  (12 V threads)
//   staged_inner: inner_p(x) = c3 U_mu(x) + cL A_p(x) + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu(x)
//                 (sigma: the fourth direction; the argument formed in registers at each neighbour) (12 V threads)
//   staged_fat:   F_mu(x)    = c1' U_mu(x) + sum_{nu != mu} S_nu[inner_{mu,nu}]_mu(x), c1' = c1 - 6 cL (4 V threads)
//
// with S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu), summed in the order
// of the twin (force/smearing.py, Horner form).
#include "hmc_common.cuh"
// (load, products and the lattice walk as in force/kernels/hisq.cu: this file's own copies, same arithmetic)
__device__ __forceinline__ M3 sg_load(const double2 *__restrict__ p, long site) {
    M3 m;
    const double2 *q = p + 9 * site;
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = __ldg(q + i);
    return m;
}
__device__ __forceinline__ void sg_store(double2 *__restrict__ p, long site, const M3 &m) {
    double2 *q = p + 9 * site;
    #pragma unroll
    for (int i = 0; i < 9; ++i) q[i] = m.e[i];
}
__device__ __forceinline__ M3 sg_mul_nn(const M3 &a, const M3 &b) {
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
__device__ __forceinline__ M3 sg_mul_nd(const M3 &a, const M3 &b) {  // a b^dag
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
__device__ __forceinline__ M3 sg_mul_dn(const M3 &a, const M3 &b) {  // a^dag b
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
__device__ __forceinline__ void sg_add(M3 &y, const M3 &x) {  // y += x
    #pragma unroll
    for (int i = 0; i < 9; ++i) y.e[i] = cadd(y.e[i], x.e[i]);
}
__device__ __forceinline__ void sg_axpy(M3 &y, double a, const M3 &x) {  // y += a x
    #pragma unroll
    for (int i = 0; i < 9; ++i) { y.e[i].x += a * x.e[i].x; y.e[i].y += a * x.e[i].y; }
}
__device__ __forceinline__ M3 sg_scaled(double a, const M3 &x) {
    M3 y;
    #pragma unroll
    for (int i = 0; i < 9; ++i) y.e[i] = make_double2(a * x.e[i].x, a * x.e[i].y);
    return y;
}

// the periodic lattice n[0..3] = (nx, ny, nz, nt), x fastest, and a thread's site
struct SgLat {
    int n[4];
    long vol;
};
__device__ __forceinline__ SgLat sg_lat(int nx, int ny, int nz, int nt) {
    SgLat L;
    L.n[0] = nx; L.n[1] = ny; L.n[2] = nz; L.n[3] = nt;
    L.vol = (long)nx * ny * nz * nt;
    return L;
}
__device__ __forceinline__ void sg_coords(const SgLat &L, long site, int c[4]) {
    long r = site;
    c[0] = r % L.n[0]; r /= L.n[0];
    c[1] = r % L.n[1]; r /= L.n[1];
    c[2] = r % L.n[2]; c[3] = r / L.n[2];
}
__device__ __forceinline__ int sg_wrap(int v, int n) { v %= n; return v < 0 ? v + n : v; }
// the site x + s1 d1_hat + s2 d2_hat, periodic
__device__ __forceinline__ long sg_hop(const SgLat &L, const int c[4], int d1, int s1, int d2, int s2) {
    int q[4] = {c[0], c[1], c[2], c[3]};
    q[d1] = sg_wrap(q[d1] + s1, L.n[d1]);
    q[d2] = sg_wrap(q[d2] + s2, L.n[d2]);
    return q[0] + (long)L.n[0] * (q[1] + (long)L.n[1] * (q[2] + (long)L.n[2] * q[3]));
}
// the staple direction of pair j of link direction mu: others(mu)[j]
__device__ __forceinline__ int sg_other(int mu, int j) { return j < mu ? j : j + 1; }
// the index j of direction d != mu in others(mu)
__device__ __forceinline__ int sg_slot(int mu, int d) { return d < mu ? d : d - 1; }

// a1 A1(y) + a2 A2(y) (A2 only when a2 != 0 and A2 is given), A1, A2 one-direction fields
__device__ __forceinline__ M3 sg_arg(const double2 *A1, double a1, const double2 *A2, double a2, long y) {
    M3 m = sg_scaled(a1, sg_load(A1, y));
    if (A2 != nullptr && a2 != 0.0) sg_axpy(m, a2, sg_load(A2, y));
    return m;
}
// S_nu[a1 A1 + a2 A2]_mu(x) at the site with coordinates c; U: the four link directions
__device__ __forceinline__ M3 sg_staple(const double2 *U, const double2 *A1, double a1, const double2 *A2, double a2,
                                        const SgLat &L, const int c[4], long x, int nu, int mu) {
    const double2 *Un = U + 9 * (long)nu * L.vol;
    const long xpn = sg_hop(L, c, nu, 1, mu, 0), xpm = sg_hop(L, c, mu, 1, nu, 0);
    const long xmn = sg_hop(L, c, nu, -1, mu, 0), xmnpm = sg_hop(L, c, nu, -1, mu, 1);
    M3 r = sg_mul_nd(sg_mul_nn(sg_load(Un, x), sg_arg(A1, a1, A2, a2, xpn)), sg_load(Un, xpm));
    sg_add(r, sg_mul_nn(sg_mul_dn(sg_load(Un, xmn), sg_arg(A1, a1, A2, a2, xmn)), sg_load(Un, xmnpm)));
    return r;
}

// A_p(x) = S_nu[U_mu]_mu(x) for the 12 pairs p = 3 mu + j, one thread per (pair, site)
extern "C" __global__ void staged_a(const double2 *__restrict__ U, double2 *A, int nx, int ny, int nz, int nt) {
    const SgLat L = sg_lat(nx, ny, nz, nt);
    const long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 12 * L.vol) return;
    const int p = gid / L.vol, mu = p / 3, nu = sg_other(mu, p % 3);
    const long x = gid - p * L.vol;
    int c[4];
    sg_coords(L, x, c);
    const double2 *Um = U + 9 * (long)mu * L.vol;
    sg_store(A + 9 * (long)p * L.vol, x, sg_staple(U, Um, 1.0, nullptr, 0.0, L, c, x, nu, mu));
}

// inner_p(x) = c3 U_mu(x) + cL A_p(x) + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu(x), one thread per
// (pair, site); A: the output of staged_a, never inner
extern "C" __global__ void staged_inner(const double2 *__restrict__ U, const double2 *__restrict__ A, double2 *inner,
                                        double c3, double c5, double c7, double cl,
                                        int nx, int ny, int nz, int nt) {
    const SgLat L = sg_lat(nx, ny, nz, nt);
    const long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 12 * L.vol) return;
    const int p = gid / L.vol, mu = p / 3, nu = sg_other(mu, p % 3);
    const long x = gid - p * L.vol;
    int c[4];
    sg_coords(L, x, c);
    const double2 *Um = U + 9 * (long)mu * L.vol;
    M3 r = sg_scaled(c3, sg_load(Um, x));
    if (cl != 0.0) sg_axpy(r, cl, sg_load(A + 9 * (long)p * L.vol, x));
    for (int k = 0; k < 3; ++k) {
        const int rho = sg_other(mu, k);
        if (rho == nu) continue;
        const int sigma = 6 - mu - nu - rho;
        const double2 *As = A + 9 * (long)(3 * mu + sg_slot(mu, sigma)) * L.vol;
        sg_add(r, sg_staple(U, Um, c5, As, c7, L, c, x, rho, mu));
    }
    sg_store(inner + 9 * (long)p * L.vol, x, r);
}

// F_mu(x) = c1 U_mu(x) + sum_{nu != mu} S_nu[inner_{mu,nu}]_mu(x) (c1: the one-link coefficient less 6 cL), one
// thread per link
extern "C" __global__ void staged_fat(const double2 *__restrict__ U, const double2 *__restrict__ inner, double2 *F,
                                      double c1, int nx, int ny, int nz, int nt) {
    const SgLat L = sg_lat(nx, ny, nz, nt);
    const long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 4 * L.vol) return;
    const int mu = gid / L.vol;
    const long x = gid - mu * L.vol;
    int c[4];
    sg_coords(L, x, c);
    M3 r = sg_scaled(c1, sg_load(U + 9 * (long)mu * L.vol, x));
    for (int j = 0; j < 3; ++j)
        sg_add(r, sg_staple(U, inner + 9 * (long)(3 * mu + j) * L.vol, 1.0, nullptr, 0.0, L, c, x,
                            sg_other(mu, j), mu));
    sg_store(F + 9 * (long)mu * L.vol, x, r);
}
