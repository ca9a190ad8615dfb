// The fused vector updates and reductions of the CG solvers, in double and single precision. Compiled without
// FMA contraction (--fmad=false: lattice/cuda_source.py OPTIONS) so that the updates are bitwise the NumPy ones.
// Driver: solvers/blas_cuda.py (CudaBlas); twin: solvers.blas_cuda.BlasTwin.
#include "hmc_common.cuh"

#define BLOCK 256

/* lattice index of checkerboard site j of parity p (p < 0: all sites, j itself) */
__device__ __forceinline__ long long site_of(long long j, int parity, int nx, int ny, int nz) {
    if (parity < 0) return j;
    const int half = nx >> 1;
    const long long row = j / half;
    const int k = (int)(j - row * half);
    const int y = (int)(row % ny);
    const long long zt = row / ny;
    const int z = (int)(zt % nz);
    const int t = (int)(zt / nz);
    return row * nx + 2 * k + ((parity + y + z + t) & 1);
}

#define SITE_LOOP(n) for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < (n); \
                          j += (long long)gridDim.x * blockDim.x)

/* Sum v[0..1] over the grid: shared-memory tree per block, block partials to global memory, and the last block
   to finish adds the partials in block order and writes result[0..1] (then resets the counter). Deterministic. */
__device__ void reduce2(double v0, double v1, double *partial, unsigned int *counter, double *result) {
    __shared__ double sh0[BLOCK];
    __shared__ double sh1[BLOCK];
    __shared__ bool last;
    const int tid = threadIdx.x;
    sh0[tid] = v0;
    sh1[tid] = v1;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (tid < w) { sh0[tid] += sh0[tid + w]; sh1[tid] += sh1[tid + w]; }
        __syncthreads();
    }
    if (tid == 0) {
        partial[blockIdx.x] = sh0[0];
        partial[gridDim.x + blockIdx.x] = sh1[0];
        __threadfence();
        last = (atomicAdd(counter, 1u) == gridDim.x - 1);
    }
    __syncthreads();
    if (!last) return;
    double a0 = 0.0, a1 = 0.0;
    for (unsigned int b = tid; b < gridDim.x; b += BLOCK) {
        a0 += __ldcg(partial + b);
        a1 += __ldcg(partial + gridDim.x + b);
    }
    sh0[tid] = a0;
    sh1[tid] = a1;
    __syncthreads();
    for (int w = BLOCK / 2; w > 0; w >>= 1) {
        if (tid < w) { sh0[tid] += sh0[tid + w]; sh1[tid] += sh1[tid + w]; }
        __syncthreads();
    }
    if (tid == 0) {
        result[0] = sh0[0];
        result[1] = sh1[0];
        *counter = 0u;
    }
}

/* p = r + beta p (or r when fresh); s = w + beta s (or w); x += alpha p; r -= alpha s */
template <typename R>
__device__ void cg_update(typename C2<R>::T *p, typename C2<R>::T *s, typename C2<R>::T *x,
                          typename C2<R>::T *r, const typename C2<R>::T *w, R alpha, R beta, int fresh,
                          long long n, int parity, int nx, int ny, int nz) {
    typedef typename C2<R>::T T;
    SITE_LOOP(n) {
        const long long o = 3 * site_of(j, parity, nx, ny, nz);
        #pragma unroll
        for (int c = 0; c < 3; ++c) {
            T rv = r[o + c];
            const T wv = w[o + c];
            T pv, sv;
            if (fresh) {
                pv = rv;
                sv = wv;
            } else {
                pv = p[o + c];
                sv = s[o + c];
                pv.x = beta * pv.x + rv.x; pv.y = beta * pv.y + rv.y;
                sv.x = beta * sv.x + wv.x; sv.y = beta * sv.y + wv.y;
            }
            p[o + c] = pv;
            s[o + c] = sv;
            T xv = x[o + c];
            xv.x = xv.x + alpha * pv.x; xv.y = xv.y + alpha * pv.y;
            x[o + c] = xv;
            rv.x = rv.x - alpha * sv.x; rv.y = rv.y - alpha * sv.y;
            r[o + c] = rv;
        }
    }
}

/* p = r + beta p (or r when fresh) */
template <typename R>
__device__ void xpay(typename C2<R>::T *p, const typename C2<R>::T *r, R beta, int fresh,
                     long long n, int parity, int nx, int ny, int nz) {
    typedef typename C2<R>::T T;
    SITE_LOOP(n) {
        const long long o = 3 * site_of(j, parity, nx, ny, nz);
        #pragma unroll
        for (int c = 0; c < 3; ++c) {
            const T rv = r[o + c];
            T pv;
            if (fresh) {
                pv = rv;
            } else {
                pv = p[o + c];
                pv.x = beta * pv.x + rv.x; pv.y = beta * pv.y + rv.y;
            }
            p[o + c] = pv;
        }
    }
}

/* (with do_shift: w += shift r first) result = (|a|^2, Re<a, w>), products in R, sums in double */
template <typename R>
__device__ void norm2_redot(const typename C2<R>::T *a, typename C2<R>::T *w, R shift, int do_shift,
                            double *partial, unsigned int *counter, double *result,
                            long long n, int parity, int nx, int ny, int nz) {
    typedef typename C2<R>::T T;
    double s0 = 0.0, s1 = 0.0;
    SITE_LOOP(n) {
        const long long o = 3 * site_of(j, parity, nx, ny, nz);
        #pragma unroll
        for (int c = 0; c < 3; ++c) {
            const T av = a[o + c];
            T wv = w[o + c];
            if (do_shift) {
                wv.x = wv.x + shift * av.x; wv.y = wv.y + shift * av.y;
                w[o + c] = wv;
            }
            const R aa = av.x * av.x + av.y * av.y;
            const R aw = av.x * wv.x + av.y * wv.y;
            s0 += (double)aa;
            s1 += (double)aw;
        }
    }
    reduce2(s0, s1, partial, counter, result);
}

/* x += alpha p; r -= alpha s; result = (|r|^2, 0) */
template <typename R>
__device__ void axpy2_norm2(const typename C2<R>::T *p, const typename C2<R>::T *s, typename C2<R>::T *x,
                            typename C2<R>::T *r, R alpha, double *partial, unsigned int *counter, double *result,
                            long long n, int parity, int nx, int ny, int nz) {
    typedef typename C2<R>::T T;
    double s0 = 0.0;
    SITE_LOOP(n) {
        const long long o = 3 * site_of(j, parity, nx, ny, nz);
        #pragma unroll
        for (int c = 0; c < 3; ++c) {
            const T pv = p[o + c], sv = s[o + c];
            T xv = x[o + c], rv = r[o + c];
            xv.x = xv.x + alpha * pv.x; xv.y = xv.y + alpha * pv.y;
            rv.x = rv.x - alpha * sv.x; rv.y = rv.y - alpha * sv.y;
            x[o + c] = xv;
            r[o + c] = rv;
            const R rr = rv.x * rv.x + rv.y * rv.y;
            s0 += (double)rr;
        }
    }
    reduce2(s0, 0.0, partial, counter, result);
}

/* multishift: s = w + beta s (or w); for each active shift i (coef[4i+3] != 0), with z, a, b = coef[4i..4i+2]:
   p_i = z r + b p_i (or z r when fresh), x_i += a p_i; then r -= alpha s.
   One thread per complex number (site, colour), not per site: a warp then reads and writes each of the 2 + 2 x
   shifts fields in consecutive 16-byte words (a site loop walking the 2 x shifts fields colour by colour had each
   field's sectors fetched up to three times: 1.6 ms at 32^4 with 9 shifts, 3.4 times the operator). The arithmetic
   of every number is unchanged.
   The shifts go in chunks of MS_CHUNK: the chunk's p_i and x_i are all loaded before any of them is stored (the
   fields are distinct), so a thread has up to 2 MS_CHUNK loads in flight where a load after each store (which the
   compiler must keep in order, not knowing that the fields do not alias) left it one at a time; s and r are stored
   last for the same reason. Loaded x_i are held in RX (a value in R widened exactly, narrowed back exactly).
   s, r, w and the p_i are in R, the coefficients in RC: R = RX = RC, or (the mixed-precision multishift,
   solvers/multishift.py) R float, RX = RC double: z and b rounded to float for p_i as the single kernel's buffer
   rounds them; an x_i whose address in xp carries the tag bit 1 (solvers.blas_cuda.CudaBlas.pointer_table) is in
   RX, x_i += a p_i in double with a unrounded and p_i widened (NumPy: x += a * p.astype(complex128)), the others
   in R with a rounded to R (the single kernel's arithmetic). */
#define MS_CHUNK 4
template <typename R, typename RX, typename RC>
__device__ void ms_update(typename C2<R>::T *s, typename C2<R>::T *r, const typename C2<R>::T *w,
                          const unsigned long long *pp, const unsigned long long *xp, const RC *coef, int nshift,
                          R alpha, R beta, int fresh, long long n, int parity, int nx, int ny, int nz) {
    typedef typename C2<R>::T T;
    typedef typename C2<RX>::T TX;
    SITE_LOOP(3 * n) {
        const long long site = j / 3;
        const long long o = 3 * site_of(site, parity, nx, ny, nz) + (j - 3 * site);
        T rv = r[o];
        const T wv = w[o];
        T sv;
        if (fresh) {
            sv = wv;
        } else {
            sv = s[o];
            sv.x = beta * sv.x + wv.x; sv.y = beta * sv.y + wv.y;
        }
        for (int i0 = 0; i0 < nshift; i0 += MS_CHUNK) {
            T pl[MS_CHUNK];
            TX xl[MS_CHUNK];
            #pragma unroll
            for (int c = 0; c < MS_CHUNK; ++c) {          /* the chunk's loads */
                const int i = i0 + c;
                if (i >= nshift || coef[4 * i + 3] == (RC)0) continue;
                if (!fresh) pl[c] = ((const T *)pp[i])[o];
                const unsigned long long xa = xp[i];
                if (sizeof(RX) != sizeof(R) && (xa & 1ull)) {
                    xl[c] = ((const TX *)(xa & ~1ull))[o];
                } else {
                    const T xv = ((const T *)xa)[o];
                    xl[c].x = (RX)xv.x; xl[c].y = (RX)xv.y;
                }
            }
            #pragma unroll
            for (int c = 0; c < MS_CHUNK; ++c) {          /* the arithmetic and the stores */
                const int i = i0 + c;
                if (i >= nshift || coef[4 * i + 3] == (RC)0) continue;
                const R zi = (R)coef[4 * i], bi = (R)coef[4 * i + 2];
                T pv;
                if (fresh) {
                    pv.x = zi * rv.x; pv.y = zi * rv.y;
                } else {
                    pv = pl[c];
                    pv.x = bi * pv.x + zi * rv.x; pv.y = bi * pv.y + zi * rv.y;
                }
                ((T *)pp[i])[o] = pv;
                const unsigned long long xa = xp[i];
                if (sizeof(RX) != sizeof(R) && (xa & 1ull)) {     /* a tagged address: this x_i is in RX */
                    const RX ai = (RX)coef[4 * i + 1];
                    TX xv = xl[c];
                    xv.x = xv.x + ai * (RX)pv.x; xv.y = xv.y + ai * (RX)pv.y;
                    ((TX *)(xa & ~1ull))[o] = xv;
                } else {
                    const R ai = (R)coef[4 * i + 1];
                    T xv;
                    xv.x = (R)xl[c].x; xv.y = (R)xl[c].y;
                    xv.x = xv.x + ai * pv.x; xv.y = xv.y + ai * pv.y;
                    ((T *)xa)[o] = xv;
                }
            }
        }
        s[o] = sv;
        rv.x = rv.x - alpha * sv.x; rv.y = rv.y - alpha * sv.y;
        r[o] = rv;
    }
}


// ------------------------------------------------------------------------------------------------------------------
// The device-resident iterations (solvers/krylov_graph.py): the scalar recurrences of the Krylov loops and the
// vector updates that read their coefficients from device memory, so that whole iterations can be captured in a CUDA
// graph with no host in the loop. Every scalar is computed with the operations, in the order, of the host code it
// replaces (solvers/cg.py _CGRun, solvers/multishift.py _MultishiftRun), so the device iterates are bitwise those of
// the host-driven fused path on one rank. tests/solvers/test_krylov_graph_host.py runs the scalar kernels on the CPU.

// the state vector of one solve: solvers.krylov_graph.SLOT names the same offsets
#define S_G 0            // |r|^2
#define S_D 1            // Re<r, A r>
#define S_G_OLD 2
#define S_ALPHA_OLD 3
#define S_BETA 4
#define S_ALPHA 5
#define S_K 6            // iterations done
#define S_FRESH 7        // the next direction is p = r (CG after a restart)
#define S_STEP_FRESH 8   // the current step's update takes p = r
#define S_STOP 9         // tol^2 |b|^2
#define S_DELTA2 10      // reliable-update threshold (mixed precision), else 0
#define S_RMAX2 11
#define S_MAXITER 12
#define S_STATUS 13      // 0 iterating; 1 stop condition met; 2 breakdown (p^dag A p); 3 non-finite residual
#define S_PAP 14
#define S_RES 16         // 16, 17: the reduction's (|r|^2, Re<r, A r>): the global sum lands here
#define S_SHIFT_STOP 18  // multishift: a shift stops once zeta_i^2 |r|^2 <= this (0: never; _MultishiftRun.shift_stop)

#define FROZEN(st) ((st)[S_STATUS] != 0.0)

/* CG, Chronopoulos-Gear: beta = g / g_old, p^dag A p = d - beta g / alpha_old (d when fresh), alpha = g / pAp */
extern "C" __global__ void cg_direction(double *st) {
    if (FROZEN(st)) return;
    const int fresh = st[S_FRESH] != 0.0;
    const double g = st[S_G];
    double beta = st[S_BETA];
    if (!fresh) beta = g / st[S_G_OLD];
    const double pap = fresh ? st[S_D] : st[S_D] - beta * g / st[S_ALPHA_OLD];
    st[S_BETA] = beta;
    st[S_PAP] = pap;
    if (!(pap > 0.0) || !isfinite(pap)) { st[S_STATUS] = 2.0; return; }
    st[S_ALPHA] = g / pap;
    st[S_STEP_FRESH] = fresh ? 1.0 : 0.0;
    st[S_FRESH] = 0.0;
}

/* after the reduction: the next g, d; the stop test of _CGRun.true_residual_due */
/* what every iteration's close does: count it, keep g and alpha as the old ones, take the reduction's pair;
   false (status 3) when the new |r|^2 is not finite */
__device__ bool close_step(double *st) {
    st[S_K] += 1.0;
    st[S_G_OLD] = st[S_G];
    st[S_ALPHA_OLD] = st[S_ALPHA];
    st[S_G] = st[S_RES];
    st[S_D] = st[S_RES + 1];
    if (!isfinite(st[S_G])) { st[S_STATUS] = 3.0; return false; }
    return true;
}

extern "C" __global__ void cg_close(double *st) {
    if (FROZEN(st) || !close_step(st)) return;
    const double g = st[S_G];
    st[S_RMAX2] = fmax(st[S_RMAX2], g);
    if (g <= st[S_STOP] || g < st[S_DELTA2] * st[S_RMAX2] || st[S_K] >= st[S_MAXITER]) st[S_STATUS] = 1.0;
}

/* multishift: the base system's beta, pAp, alpha and Jegerlehner's zeta_{k+1}, alpha_i, beta_i of every shift
   (_MultishiftRun.iterate and _shift_updates); coef[4 i ..]: (zeta_i, alpha_i, beta_i, active) in the field
   precision, as the host path rounds them into its coefficient buffer; a shift whose zeta_i^2 |r|^2 is at most
   st[S_SHIFT_STOP] stops (zeta 0, inactive) with (|r_i|^2, iteration) in fin[2 i ..] */
template <typename R>
__device__ void ms_direction(double *st, double *z, double *zp, const double *rel, R *coef, double *fin, int n) {
    if (FROZEN(st)) return;
    const double g = st[S_G];
    const int k = (int)st[S_K];
    double beta = 0.0, pap = st[S_D];
    if (k > 0) {
        beta = g / st[S_G_OLD];
        pap = st[S_D] - beta * g / st[S_ALPHA_OLD];
    }
    st[S_PAP] = pap;
    if (!(pap > 0.0) || !isfinite(pap)) { st[S_STATUS] = 2.0; return; }
    const double alpha = g / pap, aprev = st[S_ALPHA_OLD];
    st[S_ALPHA] = alpha;
    st[S_BETA] = beta;
    const double shift_stop = st[S_SHIFT_STOP];
    for (int i = 0; i < n; ++i) {
        double zi = z[i];
        const double zpi = zp[i];
        if (zi != 0.0 && zi * zi * g <= shift_stop) {      /* (never the base shift: there g > stop) */
            fin[2 * i] = zi * zi * g;
            fin[2 * i + 1] = (double)k;
            zi = 0.0;
        }
        if (zi == 0.0) {
            zp[i] = 0.0; z[i] = 0.0;
            coef[4 * i] = coef[4 * i + 1] = coef[4 * i + 2] = coef[4 * i + 3] = (R)0;
            continue;
        }
        const double den = alpha * beta * (zpi - zi) + zpi * aprev * (1.0 + rel[i] * alpha);
        const double zn = den != 0.0 ? zi * zpi * aprev / den : 0.0;
        const double ai = alpha * zn / zi;
        const double q = zi / zpi;
        const double bi = k > 0 ? beta * (q * q) : 0.0;
        coef[4 * i] = (R)zi; coef[4 * i + 1] = (R)ai; coef[4 * i + 2] = (R)bi; coef[4 * i + 3] = (R)1;
        zp[i] = zi;
        z[i] = zn;
    }
}

extern "C" __global__ void ms_direction_double(double *st, double *z, double *zp, const double *rel, double *coef,
                                               double *fin, int n) {
    ms_direction<double>(st, z, zp, rel, coef, fin, n);
}
extern "C" __global__ void ms_direction_single(double *st, double *z, double *zp, const double *rel, float *coef,
                                               double *fin, int n) {
    ms_direction<float>(st, z, zp, rel, coef, fin, n);
}

/* after the reduction: the next g, d; the loop test of MultishiftInverse._solve (g > stop and k < maxiter) and the
   reliable-update test of _MultishiftRun.reliable_due (g < delta^2 max g since the last update; delta2 0: never) */
extern "C" __global__ void ms_close(double *st) {
    if (FROZEN(st) || !close_step(st)) return;
    const double g = st[S_G];
    st[S_RMAX2] = fmax(st[S_RMAX2], g);
    if (!(g > st[S_STOP] && st[S_K] < st[S_MAXITER]) || g < st[S_DELTA2] * st[S_RMAX2]) st[S_STATUS] = 1.0;
}

/* dst[0..1] = the pairs vals[2 k], vals[2 k + 1] summed over k = 0 .. P-1 in order (the ranks along one grid
   dimension, in coordinate order) */
extern "C" __global__ void rank_sum(const double *vals, int P, double *dst) {
    double a = vals[0], b = vals[1];
    for (int k = 1; k < P; ++k) { a += vals[2 * k]; b += vals[2 * k + 1]; }
    dst[0] = a;
    dst[1] = b;
}

#define LAT long long n, int parity, int nx, int ny, int nz
#define LATA n, parity, nx, ny, nz
#define RED double *partial, unsigned int *counter, double *result
#define REDA partial, counter, result

#define INSTANTIATE(R, T, SUF)                                                                                     \
extern "C" __global__ void __launch_bounds__(BLOCK) cg_update_##SUF(T *p, T *s, T *x, T *r, const T *w, R alpha, \
                                                                    R beta, int fresh, LAT) {                      \
    cg_update<R>(p, s, x, r, w, alpha, beta, fresh, LATA);                                                        \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) xpay_##SUF(T *p, const T *r, R beta, int fresh, LAT) {       \
    xpay<R>(p, r, beta, fresh, LATA);                                                                             \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) norm2_redot_##SUF(const T *a, T *w, R shift, int do_shift,   \
                                                                      RED, LAT) {                                  \
    norm2_redot<R>(a, w, shift, do_shift, REDA, LATA);                                                            \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) norm2_redot_dev_##SUF(const T *a, T *w, R shift,           \
                                                                          int do_shift, RED, const double *st,    \
                                                                          LAT) {                                   \
    if (FROZEN(st)) return;                                                                                        \
    norm2_redot<R>(a, w, shift, do_shift, REDA, LATA);                                                            \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) axpy2_norm2_##SUF(const T *p, const T *s, T *x, T *r,        \
                                                                      R alpha, RED, LAT) {                         \
    axpy2_norm2<R>(p, s, x, r, alpha, REDA, LATA);                                                                \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) ms_update_##SUF(T *s, T *r, const T *w,                      \
                                                                    const unsigned long long *pp,                  \
                                                                    const unsigned long long *xp, const R *coef,  \
                                                                    int nshift, R alpha, R beta, int fresh, LAT) { \
    ms_update<R, R, R>(s, r, w, pp, xp, coef, nshift, alpha, beta, fresh, LATA);                                  \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) cg_update_dev_##SUF(T *p, T *s, T *x, T *r, const T *w,     \
                                                                        const double *st, LAT) {                   \
    if (FROZEN(st)) return;                                                                                        \
    const int fresh = st[S_STEP_FRESH] != 0.0;                                                                     \
    cg_update<R>(p, s, x, r, w, (R)st[S_ALPHA], fresh ? (R)0 : (R)st[S_BETA], fresh, LATA);                       \
}                                                                                                                  \
extern "C" __global__ void __launch_bounds__(BLOCK) ms_update_dev_##SUF(T *s, T *r, const T *w,                  \
                                                                        const unsigned long long *pp,              \
                                                                        const unsigned long long *xp,              \
                                                                        const R *coef, int nshift,                 \
                                                                        const double *st, LAT) {                   \
    if (FROZEN(st)) return;                                                                                        \
    const int fresh = st[S_K] == 0.0;                                                                              \
    ms_update<R, R, R>(s, r, w, pp, xp, coef, nshift, (R)st[S_ALPHA], fresh ? (R)0 : (R)st[S_BETA], fresh, LATA); \
}

INSTANTIATE(double, double2, double)
INSTANTIATE(float, float2, single)

/* the mixed-precision multishift's update: Krylov vectors float2, solutions double2, coefficients double (as
   ms_direction_double writes them on the device) */
extern "C" __global__ void __launch_bounds__(BLOCK) ms_update_mixed(float2 *s, float2 *r, const float2 *w,
                                                                    const unsigned long long *pp,
                                                                    const unsigned long long *xp,
                                                                    const double *coef, int nshift, float alpha,
                                                                    float beta, int fresh, LAT) {
    ms_update<float, double, double>(s, r, w, pp, xp, coef, nshift, alpha, beta, fresh, LATA);
}
extern "C" __global__ void __launch_bounds__(BLOCK) ms_update_dev_mixed(float2 *s, float2 *r, const float2 *w,
                                                                        const unsigned long long *pp,
                                                                        const unsigned long long *xp,
                                                                        const double *coef, int nshift,
                                                                        const double *st, LAT) {
    if (FROZEN(st)) return;
    const int fresh = st[S_K] == 0.0;
    ms_update<float, double, double>(s, r, w, pp, xp, coef, nshift, (float)st[S_ALPHA],
                                     fresh ? 0.0f : (float)st[S_BETA], fresh, LATA);
}
