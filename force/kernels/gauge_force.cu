// The gauge action density and force from a table of loops, on whole or halo-padded links. Driver:
// force/gauge_force_cuda.py; NumPy twin: force.gauge_action.GaugeAction.
#include "hmc_common.cuh"
__device__ __forceinline__ void load(M3 &m, const double2 *__restrict__ p) {
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = __ldg(p + i);
}
// c = a * b  or  c = a * b^dag
__device__ __forceinline__ void mul(M3 &c, const M3 &a, const M3 &b, bool dag) {
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = make_double2(0.0, 0.0);
            #pragma unroll
            for (int j = 0; j < 3; ++j) {
                double2 t = dag ? cmulc(a.e[3 * i + j], b.e[3 * k + j]) : cmul(a.e[3 * i + j], b.e[3 * j + k]);
                s.x += t.x; s.y += t.y;
            }
            c.e[3 * i + k] = s;
        }
}

// U holds links on a (possibly padded) box of extents (px, py, pz, pt), n[] in the kernels; the lattice's
// (interior) sites, extents (nx, ny, nz, nt), sit at (ox, oy, oz, ot) + x in it. Walks wrap modulo the box: on an
// unpadded dimension (offset 0, box = interior) that is the periodic wrap; on a padded one the walk stays inside the
// box (depth >= the loops' excursion) and never wraps.
__device__ __forceinline__ long box_index(const int *x, int px, int py, int pz) {
    return x[0] + (long)px * (x[1] + (long)py * (x[2] + (long)pz * x[3]));
}
// the box coordinates of interior site number `site` (x fastest)
__device__ __forceinline__ void box_coords(long site, int *x, int nx, int ny, int nz, int ox, int oy, int oz, int ot) {
    long r = site;
    x[0] = r % nx + ox; r /= nx; x[1] = r % ny + oy; r /= ny; x[2] = r % nz + oz; x[3] = r / nz + ot;
}

// sum over loops starting at each site of c_i (3 - ReTr W): the action density (times 3/beta), one thread per
// interior site
extern "C" __global__ void gauge_action_density(const double2 *__restrict__ U, double *__restrict__ out,
                                                const int *__restrict__ steps, const int *__restrict__ path_start,
                                                const double *__restrict__ coef, int npaths,
                                                int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                                int ox, int oy, int oz, int ot) {
    const long vol = (long)nx * ny * nz * nt, pvol = (long)px * py * pz * pt;
    const int n[4] = {px, py, pz, pt};
    long site = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (site >= vol) return;
    int x0[4];
    box_coords(site, x0, nx, ny, nz, ox, oy, oz, ot);
    M3 acc, link, tmp;
    double total = 0.0;
    for (int p = 0; p < npaths; ++p) {
        int x[4] = {x0[0], x0[1], x0[2], x0[3]};
        bool started = false;
        for (int k = path_start[p]; k < path_start[p + 1]; ++k) {
            const int s = steps[k];
            const int nu = (s > 0 ? s : -s) - 1;
            if (s < 0) x[nu] = (x[nu] + n[nu] - 1) % n[nu];
            load(link, U + (nu * pvol + box_index(x, px, py, pz)) * 9);
            if (!started) {
                if (s > 0) { acc = link; }
                else {
                    #pragma unroll
                    for (int i = 0; i < 3; ++i)
                        #pragma unroll
                        for (int j = 0; j < 3; ++j)
                            acc.e[3 * i + j] = make_double2(link.e[3 * j + i].x, -link.e[3 * j + i].y);
                }
                started = true;
            } else {
                mul(tmp, acc, link, s < 0);
                acc = tmp;
            }
            if (s > 0) x[nu] = (x[nu] + 1) % n[nu];
        }
        total += coef[p] * (3.0 - (acc.e[0].x + acc.e[4].x + acc.e[8].x));
    }
    out[site] = total;
}

// one thread per (interior site, mu); F has the interior extents
extern "C" __global__ void gauge_force(const double2 *__restrict__ U, double2 *__restrict__ F,
                                       const int *__restrict__ steps, const int *__restrict__ path_start,
                                       const double *__restrict__ coef, const int *__restrict__ mu_start,
                                       int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                       int ox, int oy, int oz, int ot, double scale) {
    const long vol = (long)nx * ny * nz * nt, pvol = (long)px * py * pz * pt;
    const int n[4] = {px, py, pz, pt};
    long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 4 * vol) return;
    const int mu = gid / vol;
    const long site = gid - mu * vol;
    int x0[4];
    box_coords(site, x0, nx, ny, nz, ox, oy, oz, ot);

    M3 first, acc, link, tmp;
    load(first, U + (mu * pvol + box_index(x0, px, py, pz)) * 9);
    double2 sum[9];
    #pragma unroll
    for (int i = 0; i < 9; ++i) sum[i] = make_double2(0.0, 0.0);

    for (int p = mu_start[mu]; p < mu_start[mu + 1]; ++p) {
        int x[4] = {x0[0], x0[1], x0[2], x0[3]};
        x[mu] = (x[mu] + 1) % n[mu];
        acc = first;
        for (int k = path_start[p] + 1; k < path_start[p + 1]; ++k) {
            const int s = steps[k];
            const int nu = (s > 0 ? s : -s) - 1;
            if (s < 0) x[nu] = (x[nu] + n[nu] - 1) % n[nu];
            load(link, U + (nu * pvol + box_index(x, px, py, pz)) * 9);
            mul(tmp, acc, link, s < 0);
            acc = tmp;
            if (s > 0) x[nu] = (x[nu] + 1) % n[nu];
        }
        const double c = coef[p];
        #pragma unroll
        for (int i = 0; i < 9; ++i) { sum[i].x += c * acc.e[i].x; sum[i].y += c * acc.e[i].y; }
    }
    // TA(A) = (A - A^dag)/2 - Tr(A - A^dag)/6, times scale
    double2 out[9];
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            double2 a = sum[3 * i + j], b = sum[3 * j + i];
            out[3 * i + j] = make_double2(0.5 * (a.x - b.x), 0.5 * (a.y + b.y));
        }
    double tr = (out[0].y + out[4].y + out[8].y) / 3.0;
    out[0].y -= tr; out[4].y -= tr; out[8].y -= tr;
    double2 *o = F + (mu * vol + site) * 9;
    #pragma unroll
    for (int i = 0; i < 9; ++i) o[i] = make_double2(scale * out[i].x, scale * out[i].y);
}
