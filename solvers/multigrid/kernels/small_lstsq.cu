// The GCR smoother's small least-squares solve on the device (solvers/multigrid/krylov.py, small_lstsq): the s x s
// Gram matrix G_ij = <A p_i, A p_j> and c_i = <A p_i, r> (packed as the host packs them: the upper triangle of G
// row by row, then c; complex128 as (re, im) pairs), scaled to unit diagonal, Gs = G / (d_i d_j), d_i =
// sqrt(max(|G_ii|, 1e-300)), then alpha = pinv(Gs) (c / d) / d with the cutoff of numpy.linalg.lstsq(rcond):
// eigenvalues of the Hermitian Gs (its singular values are their moduli) at or below rcond max|lambda| are dropped.
// The eigenvalues by cyclic Jacobi (each rotation: a phase making Gs_pq real, then the real rotation of Numerical
// Recipes 11.1, t = sgn(theta) / (|theta| + sqrt(theta^2 + 1)), theta = (a_qq - a_pp) / (2 |a_pq|)). One thread:
// s <= LSQ_MAX (the smoother's steps, 4 by default). Plain C arithmetic, so that the CPU tests compile it for the
// host (tests/force/cuda_host.py) and compare it with numpy.linalg.lstsq.
#include "hmc_common.cuh"
#define LSQ_MAX 8

extern "C" __global__ void mg_small_lstsq(const double* __restrict__ sums, double* __restrict__ alpha, int s,
                                          double rcond) {
    if (blockIdx.x * blockDim.x + threadIdx.x != 0) return;
    double ar[LSQ_MAX][LSQ_MAX], ai[LSQ_MAX][LSQ_MAX], vr[LSQ_MAX][LSQ_MAX], vi[LSQ_MAX][LSQ_MAX];
    double d[LSQ_MAX], br[LSQ_MAX], bi[LSQ_MAX];
    int k = 0;
    for (int i = 0; i < s; ++i)
        for (int j = i; j < s; ++j, ++k) {
            ar[i][j] = sums[2 * k]; ai[i][j] = sums[2 * k + 1];
            ar[j][i] = sums[2 * k]; ai[j][i] = -sums[2 * k + 1];
        }
    for (int i = 0; i < s; ++i) {
        double m = hypot(ar[i][i], ai[i][i]);
        d[i] = sqrt(m > 1e-300 ? m : 1e-300);
        br[i] = sums[2 * (k + i)] / d[i];
        bi[i] = sums[2 * (k + i) + 1] / d[i];
    }
    for (int i = 0; i < s; ++i)
        for (int j = 0; j < s; ++j) {
            const double dd = d[i] * d[j];
            ar[i][j] /= dd; ai[i][j] /= dd;
            vr[i][j] = i == j ? 1.0 : 0.0; vi[i][j] = 0.0;
        }
    for (int sweep = 0; sweep < 40; ++sweep) {
        double off = 0.0, diag = 0.0;
        for (int p = 0; p < s; ++p) {
            diag += ar[p][p] * ar[p][p];
            for (int q = p + 1; q < s; ++q) off += ar[p][q] * ar[p][q] + ai[p][q] * ai[p][q];
        }
        if (off <= 1e-36 * diag || off == 0.0) break;
        for (int p = 0; p < s; ++p)
            for (int q = p + 1; q < s; ++q) {
                const double mag = hypot(ar[p][q], ai[p][q]);
                if (!(mag > 1e-300)) continue;
                const double er = ar[p][q] / mag, ei = ai[p][q] / mag;       // e = a_pq / |a_pq|
                for (int r = 0; r < s; ++r) {                                 // column q times conj(e), row q times e
                    const double xr = ar[r][q], xi = ai[r][q];
                    ar[r][q] = xr * er + xi * ei; ai[r][q] = xi * er - xr * ei;
                    const double wr = vr[r][q], wi = vi[r][q];
                    vr[r][q] = wr * er + wi * ei; vi[r][q] = wi * er - wr * ei;
                }
                for (int r = 0; r < s; ++r) {
                    const double xr = ar[q][r], xi = ai[q][r];
                    ar[q][r] = xr * er - xi * ei; ai[q][r] = xi * er + xr * ei;
                }
                const double app = ar[p][p], aqq = ar[q][q];
                const double theta = (aqq - app) / (2.0 * mag);
                double t = 1.0 / (fabs(theta) + sqrt(theta * theta + 1.0));
                if (theta < 0) t = -t;
                const double c = 1.0 / sqrt(t * t + 1.0), sn = t * c;
                for (int r = 0; r < s; ++r) {                                 // A J, V J
                    const double xr = ar[r][p], xi = ai[r][p], yr = ar[r][q], yi = ai[r][q];
                    ar[r][p] = c * xr - sn * yr; ai[r][p] = c * xi - sn * yi;
                    ar[r][q] = sn * xr + c * yr; ai[r][q] = sn * xi + c * yi;
                    const double ur = vr[r][p], ui = vi[r][p], wr = vr[r][q], wi = vi[r][q];
                    vr[r][p] = c * ur - sn * wr; vi[r][p] = c * ui - sn * wi;
                    vr[r][q] = sn * ur + c * wr; vi[r][q] = sn * ui + c * wi;
                }
                for (int r = 0; r < s; ++r) {                                 // J^T (A J)
                    const double xr = ar[p][r], xi = ai[p][r], yr = ar[q][r], yi = ai[q][r];
                    ar[p][r] = c * xr - sn * yr; ai[p][r] = c * xi - sn * yi;
                    ar[q][r] = sn * xr + c * yr; ai[q][r] = sn * xi + c * yi;
                }
                ar[p][q] = ai[p][q] = ar[q][p] = ai[q][p] = 0.0;
                ai[p][p] = ai[q][q] = 0.0;
            }
    }
    double top = 0.0;
    for (int i = 0; i < s; ++i) top = fabs(ar[i][i]) > top ? fabs(ar[i][i]) : top;
    const double cut = rcond * top;
    double yr[LSQ_MAX], yi[LSQ_MAX];
    for (int i = 0; i < s; ++i) yr[i] = yi[i] = 0.0;
    for (int m = 0; m < s; ++m) {
        const double lam = ar[m][m];
        if (!(fabs(lam) > cut)) continue;
        double pr = 0.0, pi = 0.0;                                            // v_m^H b
        for (int i = 0; i < s; ++i) {
            pr += vr[i][m] * br[i] + vi[i][m] * bi[i];
            pi += vr[i][m] * bi[i] - vi[i][m] * br[i];
        }
        pr /= lam; pi /= lam;
        for (int i = 0; i < s; ++i) {
            yr[i] += vr[i][m] * pr - vi[i][m] * pi;
            yi[i] += vr[i][m] * pi + vi[i][m] * pr;
        }
    }
    for (int i = 0; i < s; ++i) {
        alpha[2 * i] = yr[i] / d[i];
        alpha[2 * i + 1] = yi[i] / d[i];
    }
}
