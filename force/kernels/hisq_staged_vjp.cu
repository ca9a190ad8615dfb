// The chain rule of the HISQ fat link F[U; c] in five staged kernels over all directions at once (driver and the
// formulas: force/hisq_staged_vjp.py; NumPy twin: force.smearing_derivative.fat_link_vjp). Whole lattice on one
// GPU, periodic, unpadded. The fields of one (mu, nu) pair, nu != mu, are numbered p = 3 mu + j with nu the j-th
// direction != mu in increasing order; an intermediate is a (12, V, 3, 3) array, U and the link derivatives
// (4, V, 3, 3). Every output matrix has one owning thread that sums all the terms landing on it: no atomics.
#include "hmc_common.cuh"

// --- 3x3 helpers (those of force/kernels/hisq.cu, the same arithmetic) ---------------------------------------
__device__ __forceinline__ M3 ld(const double2 *__restrict__ p, long m) {
    M3 r;
    const double2 *q = p + 9 * m;
    #pragma unroll
    for (int i = 0; i < 9; ++i) r.e[i] = __ldg(q + i);
    return r;
}
__device__ __forceinline__ void st(double2 *__restrict__ p, long m, const M3 &a) {
    double2 *q = p + 9 * m;
    #pragma unroll
    for (int i = 0; i < 9; ++i) q[i] = a.e[i];
}
__device__ __forceinline__ M3 nn(const M3 &a, const M3 &b) {  // a b
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
__device__ __forceinline__ void mac(M3 &y, const M3 &a, const M3 &b) {  // y += a b, no temporary
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
__device__ __forceinline__ M3 dg(const M3 &a) {
    M3 c;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) c.e[3 * i + k] = make_double2(a.e[3 * k + i].x, -a.e[3 * k + i].y);
    return c;
}
__device__ __forceinline__ void add(M3 &y, const M3 &x) {
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

// --- the periodic lattice -------------------------------------------------------------------------------------
struct Grid4 {
    int n[4];
    long vol;
};
__device__ __forceinline__ Grid4 make_grid(int nx, int ny, int nz, int nt) {
    Grid4 g;
    g.n[0] = nx; g.n[1] = ny; g.n[2] = nz; g.n[3] = nt;
    g.vol = (long)nx * ny * nz * nt;
    return g;
}
__device__ __forceinline__ void site_coords(const Grid4 &g, long s, int c[4]) {
    c[0] = s % g.n[0]; s /= g.n[0];
    c[1] = s % g.n[1]; s /= g.n[1];
    c[2] = s % g.n[2]; c[3] = s / g.n[2];
}
// the site x + s1 d1_hat + s2 d2_hat, periodic
__device__ __forceinline__ long step2(const Grid4 &g, const int c[4], int d1, int s1, int d2, int s2) {
    int q[4] = {c[0], c[1], c[2], c[3]};
    q[d1] = (q[d1] + s1 + 2 * g.n[d1]) % g.n[d1];
    q[d2] = (q[d2] + s2 + 2 * g.n[d2]) % g.n[d2];
    return q[0] + (long)g.n[0] * (q[1] + (long)g.n[1] * (q[2] + (long)g.n[2] * q[3]));
}
// the j-th direction != mu (increasing), and the index j of the direction nu != mu
__device__ __forceinline__ int other(int mu, int j) { return j < mu ? j : j + 1; }
__device__ __forceinline__ int slot(int mu, int nu) { return nu < mu ? nu : nu - 1; }
// the fourth direction, not mu, nu, rho
__device__ __forceinline__ int fourth(int mu, int nu, int rho) { return 6 - mu - nu - rho; }

// S_nu[X]_mu(x) = U_nu(x) X(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag X(x-nu) U_nu(x-nu+mu), X = a1 X1 + a2 X2
// (X2 only when a2 != 0); Un: the nu links, X1, X2 one-direction fields
__device__ __forceinline__ M3 comb(const double2 *X1, double a1, const double2 *X2, double a2, long s) {
    M3 m = scaled(a1, ld(X1, s));
    if (a2 != 0.0) axpy(m, a2, ld(X2, s));
    return m;
}
__device__ M3 staple(const Grid4 &g, const int c[4], long x, const double2 *Un, int nu, int mu,
                     const double2 *X1, double a1, const double2 *X2, double a2) {
    const long xpn = step2(g, c, nu, 1, mu, 0), xpm = step2(g, c, mu, 1, nu, 0);
    const long xmn = step2(g, c, nu, -1, mu, 0), xmnpm = step2(g, c, nu, -1, mu, 1);
    M3 r = nd(nn(ld(Un, x), comb(X1, a1, X2, a2, xpn)), ld(Un, xpm));
    add(r, nn(dn(ld(Un, xmn), comb(X1, a1, X2, a2, xmn)), ld(Un, xmnpm)));
    return r;
}
// S_nu^T[D](x) = U_nu(x-nu+mu)^dag D(x-nu) U_nu(x-nu) + U_nu(x+mu) D(x+nu) U_nu(x)^dag (the adjoint in X)
__device__ M3 staple_adj(const Grid4 &g, const int c[4], long x, const double2 *Un, int nu, int mu,
                         const double2 *D) {
    const long xpn = step2(g, c, nu, 1, mu, 0), xpm = step2(g, c, mu, 1, nu, 0);
    const long xmn = step2(g, c, nu, -1, mu, 0), xmnpm = step2(g, c, nu, -1, mu, 1);
    M3 r = dn(ld(Un, xmnpm), nn(ld(D, xmn), ld(Un, xmn)));
    add(r, nn(ld(Un, xpm), nd(ld(D, xpn), ld(Un, x))));
    return r;
}
// The derivative of Re Tr[S_nu[X]_mu D] by the staple link U_nu(x) (nu = lam, the owned link's direction),
// X = a1 X1 + a2 X2 (X2 when a2 != 0), D and U_lam read at s = {x, x+lam, x-mu, x-mu+lam} and xpm = x+mu:
//   g += X(x+lam) U_lam(x+mu)^dag D(x) + D(x-mu+lam) U_lam(x-mu)^dag X(x-mu)
//   h += X(x) U_lam(x+mu) D(x+lam) + D(x-mu) U_lam(x-mu) X(x-mu+lam)        (the caller adds h^dag to g)
// Every operand is loaded where it is used (the neighbours' re-reads hit the cache): two accumulators stay in
// registers, not the eight matrices of the four sites.
__device__ void link_terms(M3 &g, M3 &h, const double2 *X1, double a1, const double2 *X2, double a2,
                           const double2 *D, const double2 *Ul, const long s[4], long xpm) {
    mac(g, comb(X1, a1, X2, a2, s[1]), dn(ld(Ul, xpm), ld(D, s[0])));
    mac(g, ld(D, s[3]), dn(ld(Ul, s[2]), comb(X1, a1, X2, a2, s[2])));
    mac(h, comb(X1, a1, X2, a2, s[0]), nn(ld(Ul, xpm), ld(D, s[1])));
    mac(h, ld(D, s[2]), nn(ld(Ul, s[2]), comb(X1, a1, X2, a2, s[3])));
}

// stage 1 (forward): A_p(x) = S_nu[U_mu]_mu(x), one thread per (p, x)
extern "C" __global__ void svjp_a(const double2 *__restrict__ U, double2 *A, int nx, int ny, int nz, int nt) {
    const Grid4 g = make_grid(nx, ny, nz, nt);
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= 12 * g.vol) return;
    const int p = t / g.vol, mu = p / 3, nu = other(mu, p % 3);
    const long x = t - p * g.vol;
    int c[4];
    site_coords(g, x, c);
    const double2 *Um = U + 9 * mu * g.vol;
    st(A + 9 * p * g.vol, x, staple(g, c, x, U + 9 * nu * g.vol, nu, mu, Um, 1.0, Um, 0.0));
}

// stage 2 (forward): inner_p = c3 U_mu + cL A_p + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu
extern "C" __global__ void svjp_inner(const double2 *__restrict__ U, const double2 *__restrict__ A,
                                      double2 *inner, double c3, double c5, double c7, double cl,
                                      int nx, int ny, int nz, int nt) {
    const Grid4 g = make_grid(nx, ny, nz, nt);
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= 12 * g.vol) return;
    const int p = t / g.vol, mu = p / 3, nu = other(mu, p % 3);
    const long x = t - p * g.vol;
    int c[4];
    site_coords(g, x, c);
    const double2 *Um = U + 9 * mu * g.vol;
    M3 r = scaled(c3, ld(Um, x));
    axpy(r, cl, ld(A + 9 * p * g.vol, x));
    for (int k = 0; k < 3; ++k) {
        const int rho = other(mu, k);
        if (rho == nu) continue;
        const double2 *As = A + 9 * (3 * mu + slot(mu, fourth(mu, nu, rho))) * g.vol;
        add(r, staple(g, c, x, U + 9 * rho * g.vol, rho, mu, Um, c5, As, c7));
    }
    st(inner + 9 * p * g.vol, x, r);
}

// stage 3 (adjoint of F_mu = ... + sum_nu S_nu[inner_nu]_mu): DI_p = S_nu^T[D_F mu]
extern "C" __global__ void svjp_d_inner(const double2 *__restrict__ U, const double2 *__restrict__ DF,
                                        double2 *DI, int nx, int ny, int nz, int nt) {
    const Grid4 g = make_grid(nx, ny, nz, nt);
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= 12 * g.vol) return;
    const int p = t / g.vol, mu = p / 3, nu = other(mu, p % 3);
    const long x = t - p * g.vol;
    int c[4];
    site_coords(g, x, c);
    st(DI + 9 * p * g.vol, x, staple_adj(g, c, x, U + 9 * nu * g.vol, nu, mu, DF + 9 * mu * g.vol));
}

// stage 4 (adjoint of the inner_nu), one thread per (mu, x): with D_arg(nu, rho) = S_rho^T[DI_{mu,nu}],
//   DA_{mu,sigma} = cL DI_{mu,sigma} + c7 [D_arg(nu, rho) + D_arg(rho, nu)]   ({nu, rho} the two others),
//   DU_mu(x) = (c1 - 6 cL) D_F mu(x) + c3 sum_nu DI_{mu,nu}(x) + c5 sum_{nu != rho} D_arg(nu, rho)(x)  (written)
extern "C" __global__ void svjp_d_a(const double2 *__restrict__ U, const double2 *__restrict__ DF,
                                    const double2 *__restrict__ DI, double2 *DA, double2 *DU,
                                    double c1, double c3, double c5, double c7, double cl,
                                    int nx, int ny, int nz, int nt) {
    const Grid4 g = make_grid(nx, ny, nz, nt);
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= 4 * g.vol) return;
    const int mu = t / g.vol;
    const long x = t - mu * g.vol;
    int c[4];
    site_coords(g, x, c);
    M3 du = scaled(c1 - 6.0 * cl, ld(DF + 9 * mu * g.vol, x));
    for (int j = 0; j < 3; ++j) {  // sigma = other(mu, j)
        const int nu = other(mu, j == 0 ? 1 : 0), rho = other(mu, j == 2 ? 1 : 2);
        const double2 *DIs = DI + 9 * (3 * mu + j) * g.vol;
        M3 args = staple_adj(g, c, x, U + 9 * rho * g.vol, rho, mu, DI + 9 * (3 * mu + slot(mu, nu)) * g.vol);
        add(args, staple_adj(g, c, x, U + 9 * nu * g.vol, nu, mu, DI + 9 * (3 * mu + slot(mu, rho)) * g.vol));
        const M3 di = ld(DIs, x);
        M3 da = scaled(cl, di);
        axpy(da, c7, args);
        st(DA + 9 * (3 * mu + j) * g.vol, x, da);
        axpy(du, c3, di);
        axpy(du, c5, args);
    }
    st(DU + 9 * mu * g.vol, x, du);
}

// stage 5, one thread per output link (lam, x): DU_lam(x) += sum_nu S_nu^T[DA_{lam,nu}](x) (the adjoint of
// A = S_nu[U_lam]) and, for every mu != lam, the derivatives by the staple link U_lam(x) of the staples in
// direction lam of the level's mu links (link_terms):
//   S_lam[inner_{mu,lam}]_mu with D_F mu;  S_lam[U_mu]_mu with DA_{mu,lam};
//   S_lam[c5 U_mu + c7 A_{mu,sigma}]_mu with DI_{mu,nu} for the two nu != mu, lam (sigma the fourth direction)
extern "C" __global__ void svjp_links(const double2 *__restrict__ U, const double2 *__restrict__ A,
                                      const double2 *__restrict__ inner, const double2 *__restrict__ DF,
                                      const double2 *__restrict__ DI, const double2 *__restrict__ DA,
                                      double2 *DU, double c5, double c7, int nx, int ny, int nz, int nt) {
    const Grid4 g = make_grid(nx, ny, nz, nt);
    const long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= 4 * g.vol) return;
    const int lam = t / g.vol;
    const long x = t - lam * g.vol;
    int c[4];
    site_coords(g, x, c);
    const long V9 = 9 * g.vol;
    const double2 *Ul = U + lam * V9;
    M3 du = ld(DU + lam * V9, x);
    for (int j = 0; j < 3; ++j) {
        const int nu = other(lam, j);
        add(du, staple_adj(g, c, x, U + nu * V9, nu, lam, DA + (3 * lam + j) * V9));
    }
    M3 h;
    #pragma unroll
    for (int i = 0; i < 9; ++i) h.e[i] = make_double2(0.0, 0.0);
    #pragma unroll 1
    for (int k = 0; k < 3; ++k) {
        const int mu = other(lam, k);
        const long s[4] = {x, step2(g, c, lam, 1, mu, 0), step2(g, c, mu, -1, lam, 0), step2(g, c, mu, -1, lam, 1)};
        const long xpm = step2(g, c, mu, 1, lam, 0);
        const double2 *Um = U + mu * V9;
        const long pl = 3 * mu + slot(mu, lam);
        link_terms(du, h, inner + pl * V9, 1.0, Um, 0.0, DF + mu * V9, Ul, s, xpm);
        link_terms(du, h, Um, 1.0, Um, 0.0, DA + pl * V9, Ul, s, xpm);
        #pragma unroll 1
        for (int i = 0; i < 3; ++i) {
            const int nu = other(mu, i);
            if (nu == lam) continue;
            const double2 *As = A + (3 * mu + slot(mu, fourth(mu, nu, lam))) * V9;
            link_terms(du, h, Um, c5, As, c7, DI + (3 * mu + i) * V9, Ul, s, xpm);
        }
    }
    add(du, dg(h));
    st(DU + lam * V9, x, du);
}
