// The HISQ smearing kernels and their chain rule (staples, Naik, U(3) projection and its derivative, TA products,
// outer products). Driver: force/hisq_cuda.py (its docstring lists them); NumPy twins: force.smearing,
// force.smearing_derivative, force.unitarize, force.unitarize_derivative, force.hisq_force.
#include "hmc_common.cuh"
// the 3x3 algebra, the walk on the box (lat::Box: region, box and origin) and S_nu[X]_mu with its adjoint: the
// shared header's (lattice/kernels/hmc_common.cuh)
using namespace m3;
// o = (acc ? o : 0) + k m
__device__ __forceinline__ void update(double2 *__restrict__ p, long site, const M3 &m, double k, int acc) {
    double2 *q = p + 9 * site;
    #pragma unroll
    for (int i = 0; i < 9; ++i) {
        double2 v = make_double2(k * m.e[i].x, k * m.e[i].y);
        q[i] = acc ? cadd(q[i], v) : v;
    }
}
// out(x) = [b1 B1(x) + b2 B2(x)] + S_nu[a1 A1 + a2 A2]_mu(x) at the region's sites; U: the four link directions,
// the rest one-direction fields, all on the box. out may be B1 or B2 (read and written at x only), never A1 or A2.
extern "C" __global__ void staple_fwd(const double2 *__restrict__ U, const double2 *A1, double a1,
                                      const double2 *A2, double a2, int has_a2,
                                      const double2 *B1, double b1, int has_b1,
                                      const double2 *B2, double b2, int has_b2,
                                      double2 *out, int nu, int mu, int nx, int ny, int nz, int nt,
                                      int px, int py, int pz, int pt, int ox, int oy, int oz, int ot) {
    const lat::Box L = lat::box(nx, ny, nz, nt, px, py, pz, pt, ox, oy, oz, ot);
    long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= L.vol) return;
    int c[4];
    lat::coords(L, t, c);
    const long x = lat::index(L, c);
    M3 r = staple::fwd(L, c, x, U + 9 * (long)nu * L.pvol, nu, mu, staple::arg(A1, a1, A2, a2, has_a2));
    if (has_b1) axpy(r, b1, load(B1, x));
    if (has_b2) axpy(r, b2, load(B2, x));
    store(out, x, r);
}

// The adjoint of T = S_nu[A]_mu, A = a1 A1 + a2 A2, given DT: O_k(x) = (acc_k ? O_k(x) : 0) + k_k D_A(x) for
// the outputs present (has_k), and DU_nu(x) += the staple-link derivative (DU: four directions, in place), at the
// region's sites; every field on the box. No output may be DT, A1 or A2; DU must not hold them either.
extern "C" __global__ void staple_vjp(const double2 *__restrict__ U, const double2 *A1, double a1,
                                      const double2 *A2, double a2, int has_a2, const double2 *DT,
                                      double2 *DU, double2 *O1, double k1, int acc1,
                                      double2 *O2, double k2, int acc2, int has2,
                                      double2 *O3, double k3, int acc3, int has3,
                                      int nu, int mu, int nx, int ny, int nz, int nt,
                                      int px, int py, int pz, int pt, int ox, int oy, int oz, int ot) {
    const lat::Box L = lat::box(nx, ny, nz, nt, px, py, pz, pt, ox, oy, oz, ot);
    long t = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (t >= L.vol) return;
    int c[4];
    lat::coords(L, t, c);
    const long x = lat::index(L, c);
    const double2 *Un = U + 9 * (long)nu * L.pvol;
    const long xpn = lat::hop(L, c, nu, 1, mu, 0), xpm = lat::hop(L, c, mu, 1, nu, 0);
    const long xmm = lat::hop(L, c, mu, -1, nu, 0), xmmpn = lat::hop(L, c, mu, -1, nu, 1);
    const M3 u_xpm = load(Un, xpm), u_xmm = load(Un, xmm);
    const M3 dt_x = load(DT, x), dt_xpn = load(DT, xpn);
    // D_A(x) = S_nu^T[D_T](x) = U_nu(x-nu+mu)^dag D_T(x-nu) U_nu(x-nu) + U_nu(x+mu) D_T(x+nu) U_nu(x)^dag
    const M3 da = staple::adj(L, c, x, Un, nu, mu, DT);
    update(O1, x, da, k1, acc1);
    if (has2) update(O2, x, da, k2, acc2);
    if (has3) update(O3, x, da, k3, acc3);
    // D_U_nu(x) += A(x+nu) U_nu(x+mu)^dag D_T(x) + [A(x) U_nu(x+mu) D_T(x+nu)]^dag
    //            + [D_T(x-mu) U_nu(x-mu) A(x-mu+nu)]^dag + D_T(x-mu+nu) U_nu(x-mu)^dag A(x-mu)
    const staple::Arg A = staple::arg(A1, a1, A2, a2, has_a2);
    M3 g = nn(staple::at(A, xpn), dn(u_xpm, dt_x));
    M3 h = nn(staple::at(A, x), nn(u_xpm, dt_xpn));
    add(h, nn(load(DT, xmm), nn(u_xmm, staple::at(A, xmmpn))));
    add(g, dag(h));
    add(g, nn(load(DT, xmmpn), dn(u_xmm, staple::at(A, xmm))));
    update(DU + 9 * (long)nu * L.pvol, x, g, 1.0, 1);
}

// out_mu(x) = (acc ? out_mu(x) : 0) + coef W_mu(x) W_mu(x+mu) W_mu(x+2mu), one thread per link of the region; W
// and out on the box
extern "C" __global__ void naik_fwd(const double2 *__restrict__ W, double2 *out, double coef, int acc,
                                    int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                    int ox, int oy, int oz, int ot) {
    const lat::Box L = lat::box(nx, ny, nz, nt, px, py, pz, pt, ox, oy, oz, ot);
    long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 4 * L.vol) return;
    const int mu = gid / L.vol;
    const long t = gid - mu * L.vol;
    int c[4];
    lat::coords(L, t, c);
    const long x = lat::index(L, c);
    const double2 *Wm = W + 9 * (long)mu * L.pvol;
    M3 r = nn(nn(load(Wm, x), load(Wm, lat::hop(L, c, mu, 1, mu, 0))), load(Wm, lat::hop(L, c, mu, 2, mu, 0)));
    update(out + 9 * (long)mu * L.pvol, x, r, coef, acc);
}

// out_mu(x) = (acc ? out_mu(x) : 0) + coef [W(x+mu) W(x+2mu) D(x) + W(x+mu) D(x-mu) W(x-mu)
//                                           + D(x-2mu) W(x-2mu) W(x-mu)]  (all along mu); out is not D; W, D and
// out on the box, one thread per link of the region
extern "C" __global__ void naik_vjp(const double2 *__restrict__ W, const double2 *__restrict__ D, double2 *out,
                                    double coef, int acc, int nx, int ny, int nz, int nt,
                                    int px, int py, int pz, int pt, int ox, int oy, int oz, int ot) {
    const lat::Box L = lat::box(nx, ny, nz, nt, px, py, pz, pt, ox, oy, oz, ot);
    long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 4 * L.vol) return;
    const int mu = gid / L.vol;
    const long t = gid - mu * L.vol;
    int c[4];
    lat::coords(L, t, c);
    const long x = lat::index(L, c);
    const long off = 9 * (long)mu * L.pvol;
    const double2 *Wm = W + off, *Dm = D + off;
    const long p1 = lat::hop(L, c, mu, 1, mu, 0), p2 = lat::hop(L, c, mu, 2, mu, 0);
    const long m1 = lat::hop(L, c, mu, -1, mu, 0), m2 = lat::hop(L, c, mu, -2, mu, 0);
    const M3 w_p1 = load(Wm, p1), w_m1 = load(Wm, m1);
    M3 r = nn(nn(w_p1, load(Wm, p2)), load(Dm, x));
    add(r, nn(w_p1, nn(load(Dm, m1), w_m1)));
    add(r, nn(load(Dm, m2), nn(load(Wm, m2), w_m1)));
    update(out + off, x, r, coef, acc);
}

// P(x) = scale * TA(U(x) D(x)), TA(M) = (M - M^dag)/2 - Tr(M - M^dag)/6, one thread per matrix
extern "C" __global__ void ta_product(const double2 *__restrict__ U, const double2 *__restrict__ D, double2 *P,
                                      double scale, long n) {
    long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= n) return;
    const M3 m = nn(load(U, l), load(D, l));
    M3 o;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            double2 a = m.e[3 * i + j], b = m.e[3 * j + i];
            o.e[3 * i + j] = make_double2(0.5 * (a.x - b.x), 0.5 * (a.y + b.y));
        }
    const double tr = (o.e[0].y + o.e[4].y + o.e[8].y) / 3.0;
    o.e[0].y -= tr; o.e[4].y -= tr; o.e[8].y -= tr;
    store(P, l, o);
    #pragma unroll
    for (int i = 0; i < 9; ++i) { P[9 * l + i].x *= scale; P[9 * l + i].y *= scale; }
}

// MILC's analytic U(3) projection (force/unitarize.py: u3_unitarize): W = V (f0 + f1 Q + f2 Q^2), Q = V^dag V;
// svd[l] = 1 where the twin's SVD-fallback test fires (W is then left for the caller), gmin[l] = min_k g_k.
extern "C" __global__ void u3_unitarize(const double2 *__restrict__ V, double2 *W, unsigned char *svd, double *gmin,
                                        int allow_svd, double rel_err, double abs_err, double analytic_eps, long n) {
    long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= n) return;
    const M3 v = load(V, l);
    const M3 q = dn(v, v);
    const M3 q2 = nn(q, q);
    const double c0 = q.e[0].x + q.e[4].x + q.e[8].x;
    const double c1 = (q2.e[0].x + q2.e[4].x + q2.e[8].x) / 2;
    double t = 0.0;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) t += cmul(q2.e[3 * i + j], q.e[3 * j + i]).x;
    const double c2 = t / 3;
    const double s = c1 / 3 - c0 * (c0 / 18);
    const bool degenerate = fabs(s) < analytic_eps;
    const double s_safe = degenerate ? 1.0 : fabs(s);
    const double r = c2 / 2 - c0 * (c1 / 3) + c0 * c0 * (c0 / 27);
    const double sq = sqrt(s_safe);
    const double ros = r / (sq * sq * sq);
    const double pi = 3.141592653589793;
    const double theta = fabs(ros) < 1.0 ? acos(ros) : (r > 0 ? 0.0 : pi);
    const double theta3 = theta / 3;
    const double pi23 = 2 * pi / 3;
    double g[3];
    #pragma unroll
    for (int k = 0; k < 3; ++k) g[k] = degenerate ? c0 / 3 : c0 / 3 + 2 * sq * cos(theta3 + k * pi23);
    bool use_svd = false;
    if (allow_svd) {
        // det by cofactors along row 0
        const double2 a1 = make_double2(cmul(v.e[4], v.e[8]).x - cmul(v.e[5], v.e[7]).x,
                                        cmul(v.e[4], v.e[8]).y - cmul(v.e[5], v.e[7]).y);
        const double2 a2 = make_double2(cmul(v.e[3], v.e[8]).x - cmul(v.e[5], v.e[6]).x,
                                        cmul(v.e[3], v.e[8]).y - cmul(v.e[5], v.e[6]).y);
        const double2 a3 = make_double2(cmul(v.e[3], v.e[7]).x - cmul(v.e[4], v.e[6]).x,
                                        cmul(v.e[3], v.e[7]).y - cmul(v.e[4], v.e[6]).y);
        const double2 t1 = cmul(v.e[0], a1), t2 = cmul(v.e[1], a2), t3 = cmul(v.e[2], a3);
        const double2 det = make_double2(t1.x - t2.x + t3.x, t1.y - t2.y + t3.y);
        const double det_check = det.x * det.x + det.y * det.y;
        const double prod = g[0] * g[1] * g[2];
        const bool nonzero = det_check != 0;
        const double rel = fabs(det_check - prod) / (nonzero ? det_check : 1.0);
        use_svd = (nonzero && rel > rel_err) || det_check < abs_err;
        #pragma unroll
        for (int k = 0; k < 3; ++k) use_svd = use_svd || !(isfinite(g[k]) && g[k] > 0);
    }
    svd[l] = use_svd ? 1 : 0;
    gmin[l] = fmin(fmin(g[0], g[1]), g[2]);
    if (use_svd) return;
    const double gs0 = sqrt(g[0]), gs1 = sqrt(g[1]), gs2 = sqrt(g[2]);
    double us = gs1 + gs2;
    double ws = gs1 * gs2;
    const double vs = gs0 * us + ws;
    us = us + gs0;
    ws = ws * gs0;
    const double den = ws * (us * vs - ws);
    const double f0 = (us * vs * vs - ws * (us * us + vs)) / den;
    const double f1 = (2 * us * vs - ws - us * us * us) / den;
    const double f2 = us / den;
    M3 qi;
    #pragma unroll
    for (int i = 0; i < 9; ++i)
        qi.e[i] = make_double2(f1 * q.e[i].x + f2 * q2.e[i].x, f1 * q.e[i].y + f2 * q2.e[i].y);
    qi.e[0].x += f0; qi.e[4].x += f0; qi.e[8].x += f0;
    store(W, l, nn(v, qi));
}

// Eigen-decomposition of a Hermitian 3x3 matrix A = E diag(g) E^dag by cyclic complex Jacobi rotations: for the
// pair (p, q) with A_pq = |b| e^{i phi}, J = diag(1, e^{-i phi})_(p,q) R(theta) makes the (p, q) block real and
// diagonalizes it (Numerical Recipes' rotation, t = tan theta = sign(tau)/(|tau| + sqrt(1 + tau^2)),
// tau = (A_qq - A_pp)/(2|b|)); A <- J^dag A J, E <- E J, until the off-diagonal part is below 1e-16 of the diagonal.
__device__ void eig_herm3(M3 a, double g[3], M3 &e) {
    #pragma unroll
    for (int i = 0; i < 9; ++i) e.e[i] = make_double2(i % 4 == 0 ? 1.0 : 0.0, 0.0);
    for (int sweep = 0; sweep < 12; ++sweep) {
        const double off = a.e[1].x * a.e[1].x + a.e[1].y * a.e[1].y + a.e[2].x * a.e[2].x + a.e[2].y * a.e[2].y
                         + a.e[5].x * a.e[5].x + a.e[5].y * a.e[5].y;
        const double diag = a.e[0].x * a.e[0].x + a.e[4].x * a.e[4].x + a.e[8].x * a.e[8].x;
        if (off <= 1e-34 * diag || off == 0.0) break;
        #pragma unroll
        for (int pair = 0; pair < 3; ++pair) {
            const int p = pair == 2 ? 1 : 0, q = pair == 0 ? 1 : 2;
            const double2 b = a.e[3 * p + q];
            const double ab = sqrt(b.x * b.x + b.y * b.y);
            if (ab == 0.0) continue;
            const double tau = (a.e[4 * q].x - a.e[4 * p].x) / (2.0 * ab);
            const double t = (tau >= 0 ? 1.0 : -1.0) / (fabs(tau) + sqrt(1.0 + tau * tau));
            const double c = 1.0 / sqrt(1.0 + t * t), s = t * c;
            const double2 ph = make_double2(b.x / ab, -b.y / ab);  // e^{-i phi}
            M3 j;
            #pragma unroll
            for (int i = 0; i < 9; ++i) j.e[i] = make_double2(i % 4 == 0 ? 1.0 : 0.0, 0.0);
            // J = P R: P = 1 with e^{-i phi} at (q, q); R_pp = R_qq = c, R_pq = s, R_qp = -s
            j.e[4 * p] = make_double2(c, 0.0);
            j.e[3 * p + q] = make_double2(s, 0.0);
            j.e[3 * q + p] = make_double2(-s * ph.x, -s * ph.y);
            j.e[4 * q] = make_double2(c * ph.x, c * ph.y);
            a = nn(dn(j, a), j);
            a.e[3 * p + q] = make_double2(0.0, 0.0);
            a.e[3 * q + p] = make_double2(0.0, 0.0);
            e = nn(e, j);
        }
    }
    g[0] = a.e[0].x; g[1] = a.e[4].x; g[2] = a.e[8].x;
}

// D_V of the U(3) projection (force/unitarize_derivative.py) from the eigen-decomposition Q = V^dag V =
// E diag(g) E^dag (eig_herm3): gmin[l] = min g; filtered (g += filter) where min g < filter (mask[l] = 1);
// K = E diag(1/s) E^dag, Gamma_ij = -1/(s_i s_j (s_i+s_j)), H = E^dag D_W V E, D_Q = E (Gamma o H) E^dag,
// D_V = K D_W + (D_Q + D_Q^dag) V^dag.
extern "C" __global__ void u3_vjp(const double2 *__restrict__ V, const double2 *__restrict__ DW, double2 *DV,
                                  unsigned char *mask, double *gmin, double filter, long n) {
    long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= n) return;
    const M3 v = load(V, l), dw = load(DW, l);
    double g[3];
    M3 e;
    eig_herm3(dn(v, v), g, e);
    const double gm = fmin(fmin(g[0], g[1]), g[2]);
    gmin[l] = gm;
    const bool filt = filter > 0 && gm < filter;
    mask[l] = filt ? 1 : 0;
    const double sh = filt ? filter : 0.0;
    const double s[3] = {sqrt(g[0] + sh), sqrt(g[1] + sh), sqrt(g[2] + sh)};
    M3 es;  // E diag(1/s)
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) es.e[3 * i + k] = make_double2(e.e[3 * i + k].x / s[k], e.e[3 * i + k].y / s[k]);
    const M3 k = nd(es, e);
    M3 h = nn(dn(e, nn(dw, v)), e);
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            const double gam = -1.0 / (s[i] * s[j] * (s[i] + s[j]));
            h.e[3 * i + j].x *= gam; h.e[3 * i + j].y *= gam;
        }
    const M3 dq = nd(nn(e, h), e);
    M3 dv = nn(k, dw);
    M3 dq_h = dq;
    add(dq_h, dag(dq));
    add(dv, nd(dq_h, v));
    store(DV, l, dv);
}

// test hook: the eigen-decomposition alone (G: 3 doubles, E: 3x3 per matrix)
extern "C" __global__ void eig_herm(const double2 *__restrict__ A, double *G, double2 *E, long n) {
    long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= n) return;
    double g[3];
    M3 e;
    eig_herm3(load(A, l), g, e);
    G[3 * l] = g[0]; G[3 * l + 1] = g[1]; G[3 * l + 2] = g[2];
    store(E, l, e);
}

// The fermion-force outer products (hmc/rhmc.py): F_mu(x) += sum_l c_l z_l(x+mu) z_l(x)^dag and
// L_mu(x) += sum_l c_l z_l(x+3mu) z_l(x)^dag, z_l: colour vectors (Z: n fields of pvol x 3, on the box), one thread
// per link of the region in the order of lat::job; F and Lg hold the region only (region site t; the box itself
// on one GPU)
extern "C" __global__ void outer_acc(const double2 *__restrict__ Z, const double *__restrict__ C, double2 *F,
                                     double2 *Lg, int n, int nx, int ny, int nz, int nt,
                                     int px, int py, int pz, int pt, int ox, int oy, int oz, int ot) {
    const lat::Box L = lat::box(nx, ny, nz, nt, px, py, pz, pt, ox, oy, oz, ot);
    lat::Job w;                      // 32 sites x their 4 directions, the sites in tiles: z_l(x) read once for all 4
    if (!lat::job(L, 4, w)) return;
    const int mu = w.f;
    const long t = w.x;
    const int *c = w.c;
    const long x = lat::index(L, c);
    const long x1 = lat::hop(L, c, mu, 1, mu, 0), x3 = lat::hop(L, c, mu, 3, mu, 0);
    M3 f, g;
    #pragma unroll
    for (int i = 0; i < 9; ++i) { f.e[i] = make_double2(0.0, 0.0); g.e[i] = f.e[i]; }
    for (int l = 0; l < n; ++l) {
        const double2 *z = Z + 3 * (long)l * L.pvol;
        const double cl = C[l];
        double2 b[3], a1[3], a3[3];
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            const double2 zx = __ldg(z + 3 * x + j);
            b[j] = make_double2(cl * zx.x, -cl * zx.y);
            a1[j] = __ldg(z + 3 * x1 + j);
            a3[j] = __ldg(z + 3 * x3 + j);
        }
        #pragma unroll
        for (int i = 0; i < 3; ++i)
            #pragma unroll
            for (int j = 0; j < 3; ++j) {
                f.e[3 * i + j] = cadd(f.e[3 * i + j], cmul(a1[i], b[j]));
                g.e[3 * i + j] = cadd(g.e[3 * i + j], cmul(a3[i], b[j]));
            }
    }
    const long off = 9 * (long)mu * L.vol;
    update(F + off, t, f, 1.0, 1);
    update(Lg + off, t, g, 1.0, 1);
}
