// The staged HISQ fat-link kernels: F[U; c] for all four directions in three launches (driver and byte model:
// force/hisq_staged.py; NumPy twin: force.smearing.fat_link). The whole lattice on one GPU, neighbours wrapping
// periodically. A pair p = 3 mu + j names the link direction mu and the staple direction nu = others(mu)[j]
// (others(mu): the three directions != mu, ascending).
//
//   staged_a:     A_p(x)     = S_nu[U_mu]_mu(x)                                                  (12 V threads)
//   staged_inner: inner_p(x) = c3 U_mu(x) + cL A_p(x) + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu(x)
//                 (sigma: the fourth direction; the argument formed in registers at each neighbour) (12 V threads)
//   staged_fat:   F_mu(x)    = c1' U_mu(x) + sum_{nu != mu} S_nu[inner_{mu,nu}]_mu(x), c1' = c1 - 6 cL (4 V threads)
//
// with S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu), summed in the order
// of the twin (force/smearing.py, Horner form). One thread per output matrix. Layout: U, A and inner element-major
// (m3::load(p, site, V): U (4, 9, V), A and inner (12, 9, V), the driver transposes U), so that a warp's loads are
// contiguous; F is written site-major, (4, nt, nz, ny, nx, 3, 3) as the links.
#include "hmc_common.cuh"
// the 3x3 algebra, the lattice walk and S_nu[X]_mu: the shared header's (lattice/kernels/hmc_common.cuh)
using namespace m3;
using lat::other;

// A_p(x) = S_nu[U_mu]_mu(x) for the 12 pairs p = 3 mu + j
extern "C" __global__ void staged_a(const double2 *__restrict__ U, double2 *A, int nx, int ny, int nz, int nt) {
    const lat::Box L = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(L, 12, w)) return;
    const int mu = w.f / 3, nu = other(mu, w.f % 3);
    const double2 *Um = U + 9 * (long)mu * L.vol;
    store(A + 9 * (long)w.f * L.vol, w.x, L.vol,
          staple::fwd<true>(L, w.c, w.x, U + 9 * (long)nu * L.vol, nu, mu, staple::arg(Um)));
}

// inner_p(x) = c3 U_mu(x) + cL A_p(x) + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu(x); A: the output of
// staged_a, never inner
extern "C" __global__ void staged_inner(const double2 *__restrict__ U, const double2 *__restrict__ A, double2 *inner,
                                       double c3, double c5, double c7, double cl, int nx, int ny, int nz, int nt) {
    const lat::Box L = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(L, 12, w)) return;
    const int p = w.f, mu = p / 3, nu = other(mu, p % 3);
    const double2 *Um = U + 9 * (long)mu * L.vol;
    M3 r = scaled(c3, load(Um, w.x, L.vol));
    if (cl != 0.0) axpy(r, cl, load(A + 9 * (long)p * L.vol, w.x, L.vol));
    for (int k = 0; k < 3; ++k) {
        const int rho = other(mu, k);
        if (rho == nu) continue;
        const double2 *As = A + 9 * (long)(3 * mu + lat::slot(mu, lat::fourth(mu, nu, rho))) * L.vol;
        add(r, staple::fwd<true>(L, w.c, w.x, U + 9 * (long)rho * L.vol, rho, mu,
                                 staple::arg(Um, c5, As, c7, c7 != 0.0)));
    }
    store(inner + 9 * (long)p * L.vol, w.x, L.vol, r);
}

// F_mu(x) = c1 U_mu(x) + sum_{nu != mu} S_nu[inner_{mu,nu}]_mu(x) (c1: the one-link coefficient less 6 cL); F
// site-major. At most 168 registers (3 blocks of 128 an SM; ptxas: 64 B of spills against 190 registers without):
// 2.56 -> 1.89 ms at 32^4 on an H100, 2026-12-07 (runs/rhmc/README.md "Session 20")
extern "C" __global__ void __launch_bounds__(128, 3) staged_fat(const double2 *__restrict__ U,
                                                                 const double2 *__restrict__ inner, double2 *F,
                                                                 double c1, int nx, int ny, int nz, int nt) {
    const lat::Box L = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job(L, 4, w)) return;
    const int mu = w.f;
    M3 r = scaled(c1, load(U + 9 * (long)mu * L.vol, w.x, L.vol));
    for (int j = 0; j < 3; ++j) {
        const int nu = other(mu, j);
        const double2 *In = inner + 9 * (long)(3 * mu + j) * L.vol;
        add(r, staple::fwd<true>(L, w.c, w.x, U + 9 * (long)nu * L.vol, nu, mu, staple::arg(In)));
    }
    store(F + 9 * (long)mu * L.vol, w.x, r);
}
