// The gauge action density and force, on whole or halo-padded links. Driver: force/gauge_force_cuda.py; NumPy
// twin: force.gauge_action.GaugeAction.
//
// Two force paths. gauge_force walks any table of loops, one thread per (site, mu), each loop from scratch (L - 1
// products a loop a link). The Wilson / Symanzik family (plaquettes, 1x2 rectangles, 1x1x1 parallelograms: MILC's
// loop tables with any coefficients) has a staple-sharing pair instead. With L(y, e) the matrix of the step e
// (signed direction) from y (U_d(y) forward, U_d(y - d)^dag backward) and the plaquette staple
//     S^b_mu(y) = L(y + mu, b) L(y + mu + b, -mu) L(y + b, -b)     (the path y + mu -> y + mu + b -> y + b -> y),
// every loop through the link (x, mu), rotated to start on it, is U_mu(x) times one of (a, b signed, a, b, mu on
// distinct axes)
//     plaquette                            S^b_mu(x)
//     rectangle, link first of the long side   U_mu(x + mu) S^b_mu(x + mu) S^b_mu(x)
//     rectangle, link second of the long side  S^b_mu(x) S^b_mu(x - mu) U_mu(x - mu)
//     rectangle, link the short side       L(x + mu, a) S^a_mu(x + a) L(x + a, -a)
//     parallelogram (mu, a, b, -mu, -a, -b)    L(x + mu, a) S^b_mu(x + a) S^b_a(x),   S^b_{-d}(x) = S^b_d(x - d)^dag
// (the first two rectangles and the parallelogram are two plaquette staples glued along a link walked there and
// back, L(z, -b) L(z - b, b) = 1: exact for unitary links, which gauge links are). gauge_force_staples writes the
// 24 S^b_mu of every site once (2 products each) into a scratch buffer, structure of arrays (element-major, site
// fastest: a warp's loads of one element are one contiguous 512-byte run); gauge_force_symanzik, one thread per
// (site, mu) for all four directions in one launch, reads 72 of them and sums
//     Sigma = c_pl sum_b S^b_mu(x)
//           + c_rt sum_b [U_mu(x + mu) S^b_mu(x + mu) S^b_mu(x) + S^b_mu(x) S^b_mu(x - mu) U_mu(x - mu)]
//           + sum_a L(x + mu, a) [c_rt S^a_mu(x + a) L(x + a, -a) + c_pg sum_b S^b_mu(x + a) S^b_a(x)]
// (the factor L(x + mu, a) shared by the 5 loops of each a): 51 products a link against 228 for the walk, so 252 a
// site with the staples against 912. F = scale TA(U_mu(x) Sigma). The scratch (24 matrices a site: 3.6 GB at 32^4)
// is written once and read 72 times a link, 288 a site, mostly from cache (24 at best): this traffic, not the flops,
// should bind the pair (bench/rhmc_floors.py counts both: 56016 flops a site for production, 48 M a site). Plaquettes
// alone (Wilson) need only S^b_mu(x), each used by its one link: gauge_force_plaquette builds them in registers,
// one kernel, no scratch (13 products a link against 18). On halo-padded links the staples are built on the interior
// and one layer around it (padding 2 for rectangles or parallelograms, gauge_force_cuda.halo_depth).
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
// The thread order of the staple-sharing pair is lat::job's (lattice/kernels/hmc_common.cuh): a block's threads
// are 32 consecutive sites times the staples or directions of those sites, the sites in tiles of (nx, ty, tz, tt),
// so that the staples a site writes and the links they read, or the staples its four links read, are touched by
// threads that run together.

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

// ---- the staple-sharing force of the plaquette / rectangle / parallelogram family (header comment) -------------

__device__ __forceinline__ void load_dag(M3 &m, const double2 *__restrict__ p) {
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            const double2 v = __ldg(p + 3 * j + i);
            m.e[3 * i + j] = make_double2(v.x, -v.y);
        }
}
__device__ __forceinline__ void set_zero(M3 &m) {
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = make_double2(0.0, 0.0);
}
// c (+)= a * b
__device__ __forceinline__ void mul_nn(M3 &c, const M3 &a, const M3 &b, bool accumulate) {
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = accumulate ? c.e[3 * i + k] : make_double2(0.0, 0.0);
            #pragma unroll
            for (int j = 0; j < 3; ++j) {
                const double2 t = cmul(a.e[3 * i + j], b.e[3 * j + k]);
                s.x += t.x; s.y += t.y;
            }
            c.e[3 * i + k] = s;
        }
}
// acc += c * m
__device__ __forceinline__ void add_scaled(M3 &acc, double c, const M3 &m) {
    #pragma unroll
    for (int i = 0; i < 9; ++i) { acc.e[i].x += c * m.e[i].x; acc.e[i].y += c * m.e[i].y; }
}
// z = y + e (e a signed step +-(d + 1)), wrapped modulo the box; the unrolled select keeps z in registers (z[d]
// with d known only at run time would put it in local memory)
__device__ __forceinline__ void step_to(int *z, const int *y, int e, const int *n) {
    const int d = (e > 0 ? e : -e) - 1;
    #pragma unroll
    for (int i = 0; i < 4; ++i) z[i] = i == d ? (y[i] + (e > 0 ? 1 : n[i] - 1)) % n[i] : y[i];
}
// m = L(y, e): U_d(y) for e = d + 1, U_d(y - d)^dag for e = -(d + 1)
__device__ __forceinline__ void load_step(M3 &m, const double2 *__restrict__ U, const int *y, int e, const int *n,
                                          long pvol) {
    const int d = (e > 0 ? e : -e) - 1;
    if (e > 0) { load(m, U + (d * pvol + box_index(y, n[0], n[1], n[2])) * 9); return; }
    int z[4];
    step_to(z, y, e, n);
    load_dag(m, U + (d * pvol + box_index(z, n[0], n[1], n[2])) * 9);
}
// the signed direction number j = 0..5 of the six perpendicular to mu: +-(each other axis, in order)
__device__ __forceinline__ int perpendicular(int mu, int j) {
    const int d = j / 2 + (j / 2 >= mu ? 1 : 0);
    return (j & 1) ? -(d + 1) : d + 1;
}
// the scratch slot of S^b_mu (mu = 0..3, b a signed step off the mu axis): 6 mu + j, j as in perpendicular
__device__ __forceinline__ int slot(int mu, int b) {
    const int d = (b > 0 ? b : -b) - 1;
    return 6 * mu + 2 * (d < mu ? d : d - 1) + (b < 0 ? 1 : 0);
}
// S^b_mu(y) = L(y + mu, b) L(y + mu + b, -mu) L(y + b, -b), from the links
__device__ __forceinline__ void plaquette_staple(M3 &s, const double2 *__restrict__ U, const int *y, int mu, int b,
                                                 const int *n, long pvol) {
    int z[4], w[4];
    M3 a, c, t;
    step_to(z, y, mu + 1, n);
    load_step(a, U, z, b, n, pvol);
    step_to(w, z, b, n);
    load_step(c, U, w, -(mu + 1), n, pvol);
    mul_nn(t, a, c, false);
    step_to(z, y, b, n);
    load_step(c, U, z, -b, n, pvol);
    mul_nn(s, t, c, false);
}
// scratch: S[(slot * 9 + i) * pvol + box site] holds element i of S^b_mu at that site
__device__ __forceinline__ void load_staple(M3 &m, const double2 *__restrict__ S, int mu, int b, const int *y,
                                            const int *n, long pvol) {
    const double2 *p = S + (long)slot(mu, b) * 9 * pvol + box_index(y, n[0], n[1], n[2]);
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = __ldg(p + i * pvol);
}
// S^b_a(y) for a signed a: stored for a forward, S^b_d(y - d)^dag for a = -(d + 1)
__device__ __forceinline__ void load_staple_signed(M3 &m, const double2 *__restrict__ S, int a, int b, const int *y,
                                                   const int *n, long pvol) {
    if (a > 0) { load_staple(m, S, a - 1, b, y, n, pvol); return; }
    int z[4];
    M3 t;
    step_to(z, y, a, n);
    load_staple(t, S, -a - 1, b, z, n, pvol);
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) m.e[3 * i + j] = make_double2(t.e[3 * j + i].x, -t.e[3 * j + i].y);
}
// F_mu(site) = scale TA(U_mu(x) Sigma), TA(A) = (A - A^dag)/2 - Tr(A - A^dag)/6
__device__ __forceinline__ void write_force(double2 *__restrict__ F, const double2 *__restrict__ U, const int *x,
                                            int mu, long site, long vol, const int *n, long pvol, const M3 &sigma,
                                            double scale) {
    M3 u, a;
    load_step(u, U, x, mu + 1, n, pvol);
    mul_nn(a, u, sigma, false);
    double2 out[9];
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            const double2 p = a.e[3 * i + j], q = a.e[3 * j + i];
            out[3 * i + j] = make_double2(0.5 * (p.x - q.x), 0.5 * (p.y + q.y));
        }
    const double tr = (out[0].y + out[4].y + out[8].y) / 3.0;
    out[0].y -= tr; out[4].y -= tr; out[8].y -= tr;
    double2 *o = F + (mu * vol + site) * 9;
    #pragma unroll
    for (int i = 0; i < 9; ++i) o[i] = make_double2(scale * out[i].x, scale * out[i].y);
}

// the 24 staples S^b_mu of every site of the region (extents rx..rt at qx..qt in the box: the interior, and one
// layer around it on a padded dimension), one thread per (staple, site), in the order of lat::job
// at most 128 registers (4 blocks of 128 an SM): 8.97 -> 8.78 ms for the pair at 32^4 on the H200, 2026-12-04
extern "C" __global__ void __launch_bounds__(128, 4) gauge_force_staples(
        const double2 *__restrict__ U, double2 *__restrict__ S, int rx, int ry, int rz, int rt,
        int px, int py, int pz, int pt, int qx, int qy, int qz, int qt, int ty, int tz, int tt) {
    const lat::Box L = lat::box(rx, ry, rz, rt, px, py, pz, pt, qx, qy, qz, qt);
    const long pvol = L.pvol;
    const int n[4] = {px, py, pz, pt};
    lat::Job w;                                         // 32 sites x their 24 staples (lat::job)
    if (!lat::job(L, 24, ty, tz, tt, w)) return;
    const int k = w.f;
    const int *y = w.c;
    M3 s;
    plaquette_staple(s, U, y, k / 6, perpendicular(k / 6, k % 6), n, pvol);
    double2 *p = S + (long)k * 9 * pvol + box_index(y, px, py, pz);
    #pragma unroll
    for (int i = 0; i < 9; ++i) p[i * pvol] = s.e[i];
}

// the force of c_pl plaquettes + c_rt rectangles + c_pg parallelograms from the staples S (gauge_force_staples),
// one thread per (interior site, mu), in the order of lat::job; F has the interior extents
extern "C" __global__ void gauge_force_symanzik(const double2 *__restrict__ U, const double2 *__restrict__ S,
                                                double2 *__restrict__ F, double c_pl, double c_rt, double c_pg,
                                                int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                                int ox, int oy, int oz, int ot, double scale,
                                                int ty, int tz, int tt) {
    const lat::Box L = lat::box(nx, ny, nz, nt, px, py, pz, pt, ox, oy, oz, ot);
    const long vol = L.vol, pvol = L.pvol;
    const int n[4] = {px, py, pz, pt};
    lat::Job w;                                         // 32 sites x their 4 directions (lat::job)
    if (!lat::job(L, 4, ty, tz, tt, w)) return;
    const int mu = w.f;
    const long site = w.x;
    const int *x = w.c;
    int xf[4], xb[4], xa[4];
    step_to(xf, x, mu + 1, n);
    step_to(xb, x, -(mu + 1), n);
    M3 sigma, s0, t, p, fwd, bwd;
    set_zero(sigma); set_zero(fwd); set_zero(bwd);
    for (int j = 0; j < 6; ++j) {
        const int b = perpendicular(mu, j);
        load_staple(s0, S, mu, b, x, n, pvol);
        add_scaled(sigma, c_pl, s0);
        if (c_rt != 0.0) {
            load_staple(t, S, mu, b, xf, n, pvol);
            mul_nn(fwd, t, s0, true);
            load_staple(t, S, mu, b, xb, n, pvol);
            mul_nn(bwd, s0, t, true);
        }
    }
    if (c_rt != 0.0) {
        load_step(t, U, xf, mu + 1, n, pvol);
        mul_nn(p, t, fwd, false);
        add_scaled(sigma, c_rt, p);
        load_step(t, U, xb, mu + 1, n, pvol);
        mul_nn(p, bwd, t, false);
        add_scaled(sigma, c_rt, p);
    }
    if (c_rt != 0.0 || c_pg != 0.0) {
        for (int ja = 0; ja < 6; ++ja) {
            const int a = perpendicular(mu, ja);
            step_to(xa, x, a, n);
            M3 side, chairs;
            set_zero(side); set_zero(chairs);
            if (c_rt != 0.0) {
                load_staple(s0, S, mu, a, xa, n, pvol);
                load_step(t, U, xa, -a, n, pvol);
                mul_nn(side, s0, t, false);
            }
            if (c_pg != 0.0) {
                for (int jb = 0; jb < 6; ++jb) {
                    const int b = perpendicular(mu, jb);
                    if (b == a || b == -a) continue;
                    load_staple(s0, S, mu, b, xa, n, pvol);
                    load_staple_signed(t, S, a, b, x, n, pvol);
                    mul_nn(chairs, s0, t, true);
                }
            }
            M3 sum;
            set_zero(sum);
            add_scaled(sum, c_rt, side);
            add_scaled(sum, c_pg, chairs);
            load_step(t, U, xf, a, n, pvol);
            mul_nn(sigma, t, sum, true);
        }
    }
    write_force(F, U, x, mu, site, vol, n, pvol, sigma, scale);
}

// the plaquette-only force: the six staples of each link built in registers, one thread per (interior site, mu)
extern "C" __global__ void gauge_force_plaquette(const double2 *__restrict__ U, double2 *__restrict__ F,
                                                 double c_pl, int nx, int ny, int nz, int nt,
                                                 int px, int py, int pz, int pt, int ox, int oy, int oz, int ot,
                                                 double scale) {
    const long vol = (long)nx * ny * nz * nt, pvol = (long)px * py * pz * pt;
    const int n[4] = {px, py, pz, pt};
    const long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 4 * vol) return;
    const int mu = gid / vol;
    const long site = gid - mu * vol;
    int x[4];
    box_coords(site, x, nx, ny, nz, ox, oy, oz, ot);
    M3 sigma, s;
    set_zero(sigma);
    for (int j = 0; j < 6; ++j) {
        plaquette_staple(s, U, x, mu, perpendicular(mu, j), n, pvol);
        add_scaled(sigma, c_pl, s);
    }
    write_force(F, U, x, mu, site, vol, n, pvol, sigma, scale);
}
