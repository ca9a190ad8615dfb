// The chain rule of the HISQ fat link F[U; c] in staged kernels over all directions at once (driver and the
// formulas: force/hisq_staged_vjp.py; NumPy twin: force.smearing_derivative.fat_link_vjp). Whole lattice on one
// GPU, periodic, unpadded. The fields of one (mu, nu) pair, nu != mu, are numbered p = 3 mu + j with nu the j-th
// direction != mu in increasing order; an intermediate is a (12, V, 3, 3) array, U and the link derivatives
// (4, V, 3, 3). Every output matrix has one owning thread that sums all the terms landing on it: no atomics.
// (the forward intermediates A and inner come from staged_a and staged_inner of force/kernels/hisq_staged.cu).
// Layout: every field element-major (m3::load(p, site, V): U, D_F and D_U (4, 9, V), the pairs' fields (12, 9, V)),
// as in hisq_staged.cu, except the result, written site-major by svjp_links (4, nt, nz, ny, nx, 3, 3).
#include "hmc_common.cuh"
// the 3x3 algebra, the lattice walk, S_nu[X]_mu and its adjoint: the shared header's (lattice/kernels/hmc_common.cuh)
using namespace m3;
using lat::other;
using lat::slot;
using lat::fourth;

// The derivative of Re Tr[S_nu[X]_mu D] by the staple link U_nu(x) (nu = lam, the owned link's direction),
// X = a1 X1 + a2 X2 (staple::Arg), D and U_lam read at s = {x, x+lam, x-mu, x-mu+lam} and xpm = x+mu:
//   g += X(x+lam) U_lam(x+mu)^dag D(x) + D(x-mu+lam) U_lam(x-mu)^dag X(x-mu)
//   h += X(x) U_lam(x+mu) D(x+lam) + D(x-mu) U_lam(x-mu) X(x-mu+lam)            (h^dag joins g)
// Every operand is loaded where it is used (the neighbours' re-reads hit the cache): the accumulators stay in
// registers, not the eight matrices of the four sites.
template <bool G, bool H>
__device__ __forceinline__ void link_terms(M3 &g, M3 &h, const staple::Arg &X, const double2 *D, const double2 *Ul,
                                           const long s[4], long xpm, long V) {
    if (G) {
        mac(g, staple::at<true>(X, s[1], V), dn(load(Ul, xpm, V), load(D, s[0], V)));
        mac(g, load(D, s[3], V), dn(load(Ul, s[2], V), staple::at<true>(X, s[2], V)));
    }
    if (H) {
        mac(h, staple::at<true>(X, s[0], V), nn(load(Ul, xpm, V), load(D, s[1], V)));
        mac(h, load(D, s[2], V), nn(load(Ul, s[2], V), staple::at<true>(X, s[3], V)));
    }
}

// stage 3 (adjoint of F_mu = ... + sum_nu S_nu[inner_nu]_mu): DI_p = S_nu^T[D_F mu]
extern "C" __global__ void svjp_d_inner(const double2 *__restrict__ U, const double2 *__restrict__ DF, double2 *DI,
                                        int nx, int ny, int nz, int nt) {
    const lat::Box g = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(g, 12, w)) return;
    const int p = w.f, mu = p / 3, nu = other(mu, p % 3);
    store(DI + 9 * p * g.vol, w.x, g.vol,
          staple::adj<true>(g, w.c, w.x, U + 9 * nu * g.vol, nu, mu, DF + 9 * mu * g.vol));
}

// stage 4 (adjoint of the inner_nu), one thread per (mu, x): with D_arg(nu, rho) = S_rho^T[DI_{mu,nu}],
//   DA_{mu,sigma} = cL DI_{mu,sigma} + c7 [D_arg(nu, rho) + D_arg(rho, nu)]   ({nu, rho} the two others),
//   DU_mu(x) = (c1 - 6 cL) D_F mu(x) + c3 sum_nu DI_{mu,nu}(x) + c5 sum_{nu != rho} D_arg(nu, rho)(x)  (written)
extern "C" __global__ void svjp_d_a(const double2 *__restrict__ U, const double2 *__restrict__ DF,
                                    const double2 *__restrict__ DI, double2 *DA, double2 *DU, double c1, double c3,
                                    double c5, double c7, double cl, int nx, int ny, int nz, int nt) {
    const lat::Box g = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(g, 4, w)) return;
    const int mu = w.f;
    const long x = w.x;
    M3 du = scaled(c1 - 6.0 * cl, load(DF + 9 * mu * g.vol, x, g.vol));
    for (int j = 0; j < 3; ++j) {  // sigma = other(mu, j)
        const int nu = other(mu, j == 0 ? 1 : 0), rho = other(mu, j == 2 ? 1 : 2);
        const double2 *DIs = DI + 9 * (3 * mu + j) * g.vol;
        M3 args = staple::adj<true>(g, w.c, x, U + 9 * rho * g.vol, rho, mu, DI + 9 * (3 * mu + slot(mu, nu)) * g.vol);
        add(args, staple::adj<true>(g, w.c, x, U + 9 * nu * g.vol, nu, mu, DI + 9 * (3 * mu + slot(mu, rho)) * g.vol));
        const M3 di = load(DIs, x, g.vol);
        M3 da = scaled(cl, di);
        axpy(da, c7, args);
        store(DA + 9 * (3 * mu + j) * g.vol, x, g.vol, da);
        axpy(du, c3, di);
        axpy(du, c5, args);
    }
    store(DU + 9 * mu * g.vol, x, g.vol, du);
}

// stage 5, one thread per output link (lam, x): DU_lam(x) += sum_nu S_nu^T[DA_{lam,nu}](x) (the adjoint of
// A = S_nu[U_lam]) and, for every mu != lam, the derivatives by the staple link U_lam(x) of the staples in
// direction lam of the level's mu links (link_terms):
//   S_lam[inner_{mu,lam}]_mu with D_F mu;  S_lam[U_mu]_mu with DA_{mu,lam};
//   S_lam[c5 U_mu + c7 A_{mu,sigma}]_mu with DI_{mu,nu} for the two nu != mu, lam (sigma the fourth direction)
// in two launches, each with one of the two accumulators (g, then h) so that the registers hold one:
// svjp_links_g adds the adjoint of A and the g terms to svjp_d_a's DU (element-major, in place), svjp_links_h
// sums the h terms and writes OUT = DU + h^dag (site-major). The sums are those of one thread doing both.
template <bool G, bool H>
__device__ __forceinline__ void staple_link_terms(M3 &du, M3 &h, const lat::Box &g, const int *c, long x, int lam,
                                                  const double2 *U, const double2 *A, const double2 *inner,
                                                  const double2 *DF, const double2 *DI, const double2 *DA, double c5,
                                                  double c7) {
    const long V = g.vol, V9 = 9 * g.vol;
    const double2 *Ul = U + lam * V9;
    #pragma unroll 1
    for (int k = 0; k < 3; ++k) {
        const int mu = other(lam, k);
        const long s[4] = {x, lat::hop(g, c, lam, 1, mu, 0), lat::hop(g, c, mu, -1, lam, 0),
                           lat::hop(g, c, mu, -1, lam, 1)};
        const long xpm = lat::hop(g, c, mu, 1, lam, 0);
        const double2 *Um = U + mu * V9;
        const long pl = 3 * mu + slot(mu, lam);
        link_terms<G, H>(du, h, staple::arg(inner + pl * V9), DF + mu * V9, Ul, s, xpm, V);
        link_terms<G, H>(du, h, staple::arg(Um), DA + pl * V9, Ul, s, xpm, V);
        #pragma unroll 1
        for (int i = 0; i < 3; ++i) {
            const int nu = other(mu, i);
            if (nu == lam) continue;
            const double2 *As = A + (3 * mu + slot(mu, fourth(mu, nu, lam))) * V9;
            link_terms<G, H>(du, h, staple::arg(Um, c5, As, c7, c7 != 0.0), DI + (3 * mu + i) * V9, Ul, s, xpm, V);
        }
    }
}

extern "C" __global__ void svjp_links_g(const double2 *__restrict__ U, const double2 *__restrict__ A,
                                        const double2 *__restrict__ inner, const double2 *__restrict__ DF,
                                        const double2 *__restrict__ DI, const double2 *__restrict__ DA,
                                        double2 *DU, double c5, double c7, int nx, int ny, int nz, int nt) {
    const lat::Box g = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(g, 4, w)) return;
    const int lam = w.f;
    const long V9 = 9 * g.vol;
    M3 du = load(DU + lam * V9, w.x, g.vol);   // D_U_lam(x), then the terms of A's adjoint
    for (int j = 0; j < 3; ++j) {
        const int nu = other(lam, j);
        add(du, staple::adj<true>(g, w.c, w.x, U + nu * V9, nu, lam, DA + (3 * lam + j) * V9));
    }
    M3 unused;
    staple_link_terms<true, false>(du, unused, g, w.c, w.x, lam, U, A, inner, DF, DI, DA, c5, c7);
    store(DU + lam * V9, w.x, g.vol, du);
}

extern "C" __global__ void svjp_links_h(const double2 *__restrict__ U, const double2 *__restrict__ A,
                                        const double2 *__restrict__ inner, const double2 *__restrict__ DF,
                                        const double2 *__restrict__ DI, const double2 *__restrict__ DA,
                                        const double2 *__restrict__ DU, double2 *OUT, double c5, double c7,
                                        int nx, int ny, int nz, int nt) {
    const lat::Box g = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(g, 4, w)) return;
    const int lam = w.f;
    M3 h = zero(), unused;
    staple_link_terms<false, true>(unused, h, g, w.c, w.x, lam, U, A, inner, DF, DI, DA, c5, c7);
    M3 du = load(DU + lam * 9 * g.vol, w.x, g.vol);
    add_dag(du, h);
    store(OUT + lam * 9 * g.vol, w.x, du);
}
