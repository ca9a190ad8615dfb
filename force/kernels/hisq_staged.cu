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
// of the twin (force/smearing.py, Horner form). Each kernel in two forms: one thread per output matrix, or (the
// _rows kernels) three, thread 3 m + i computing row i of matrix m: the same sums, term for term, in a third of the
// registers' worth of accumulator and operand rows (the full middle and right factors are still loaded).
// A template (lattice/cuda_source.py): the placeholder BOUNDS is empty or __launch_bounds__(128, n), SUF the
// kernel-name suffix of that variant (force.hisq_staged.variant: the run configuration's hisq_min_blocks).
#include "hmc_common.cuh"
// the 3x3 algebra, the lattice walk and S_nu[X]_mu: the shared header's (lattice/kernels/hmc_common.cuh)
using namespace m3;
using lat::other;

// A_p(x) = S_nu[U_mu]_mu(x) for the 12 pairs p = 3 mu + j
template <bool ROWS>
__device__ __forceinline__ void a_kernel(const double2 *U, double2 *A, int nx, int ny, int nz, int nt) {
    typedef staple::Part<ROWS> P;
    const lat::Box L = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job<P::PER>(L, 12, w)) return;
    const int mu = w.f / 3, nu = other(mu, w.f % 3);
    const double2 *Um = U + 9 * (long)mu * L.vol;
    P::store(A + 9 * (long)w.f * L.vol, w.x, w.row,
             P::fwd(L, w.c, w.x, U + 9 * (long)nu * L.vol, nu, mu, staple::arg(Um), w.row));
}

// inner_p(x) = c3 U_mu(x) + cL A_p(x) + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu(x); A: the output of
// staged_a, never inner
template <bool ROWS>
__device__ __forceinline__ void inner_kernel(const double2 *U, const double2 *A, double2 *inner, double c3,
                                             double c5, double c7, double cl, int nx, int ny, int nz, int nt) {
    typedef staple::Part<ROWS> P;
    const lat::Box L = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job<P::PER>(L, 12, w)) return;
    const int p = w.f, mu = p / 3, nu = other(mu, p % 3);
    const double2 *Um = U + 9 * (long)mu * L.vol;
    typename P::T r = scaled(c3, P::load(Um, w.x, w.row));
    if (cl != 0.0) axpy(r, cl, P::load(A + 9 * (long)p * L.vol, w.x, w.row));
    for (int k = 0; k < 3; ++k) {
        const int rho = other(mu, k);
        if (rho == nu) continue;
        const double2 *As = A + 9 * (long)(3 * mu + lat::slot(mu, lat::fourth(mu, nu, rho))) * L.vol;
        add(r, P::fwd(L, w.c, w.x, U + 9 * (long)rho * L.vol, rho, mu, staple::arg(Um, c5, As, c7, c7 != 0.0),
                         w.row));
    }
    P::store(inner + 9 * (long)p * L.vol, w.x, w.row, r);
}

// F_mu(x) = c1 U_mu(x) + sum_{nu != mu} S_nu[inner_{mu,nu}]_mu(x) (c1: the one-link coefficient less 6 cL)
template <bool ROWS>
__device__ __forceinline__ void fat_kernel(const double2 *U, const double2 *inner, double2 *F, double c1,
                                           int nx, int ny, int nz, int nt) {
    typedef staple::Part<ROWS> P;
    const lat::Box L = lat::whole(nx, ny, nz, nt);
    lat::Job w;
    if (!lat::job<P::PER>(L, 4, w)) return;
    const int mu = w.f;
    typename P::T r = scaled(c1, P::load(U + 9 * (long)mu * L.vol, w.x, w.row));
    for (int j = 0; j < 3; ++j) {
        const int nu = other(mu, j);
        const double2 *In = inner + 9 * (long)(3 * mu + j) * L.vol;
        add(r, P::fwd(L, w.c, w.x, U + 9 * (long)nu * L.vol, nu, mu, staple::arg(In), w.row));
    }
    P::store(F + 9 * (long)mu * L.vol, w.x, w.row, r);
}

// the kernels: one thread per matrix (12 V, 12 V, 4 V threads) and the _rows forms (three times as many)
extern "C" __global__ void ${BOUNDS}staged_a${SUF}(
        const double2 *__restrict__ U, double2 *A, int nx, int ny, int nz, int nt) {
    a_kernel<false>(U, A, nx, ny, nz, nt);
}
extern "C" __global__ void ${BOUNDS}staged_a_rows${SUF}(
        const double2 *__restrict__ U, double2 *A, int nx, int ny, int nz, int nt) {
    a_kernel<true>(U, A, nx, ny, nz, nt);
}
extern "C" __global__ void ${BOUNDS}staged_inner${SUF}(
        const double2 *__restrict__ U, const double2 *__restrict__ A, double2 *inner, double c3, double c5,
        double c7, double cl, int nx, int ny, int nz, int nt) {
    inner_kernel<false>(U, A, inner, c3, c5, c7, cl, nx, ny, nz, nt);
}
extern "C" __global__ void ${BOUNDS}staged_inner_rows${SUF}(
        const double2 *__restrict__ U, const double2 *__restrict__ A, double2 *inner, double c3, double c5,
        double c7, double cl, int nx, int ny, int nz, int nt) {
    inner_kernel<true>(U, A, inner, c3, c5, c7, cl, nx, ny, nz, nt);
}
extern "C" __global__ void ${BOUNDS}staged_fat${SUF}(
        const double2 *__restrict__ U, const double2 *__restrict__ inner, double2 *F, double c1, int nx, int ny,
        int nz, int nt) {
    fat_kernel<false>(U, inner, F, c1, nx, ny, nz, nt);
}
extern "C" __global__ void ${BOUNDS}staged_fat_rows${SUF}(
        const double2 *__restrict__ U, const double2 *__restrict__ inner, double2 *F, double c1, int nx, int ny,
        int nz, int nt) {
    fat_kernel<true>(U, inner, F, c1, nx, ny, nz, nt);
}
