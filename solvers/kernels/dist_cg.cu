// Device-resident CG scalars and deterministic reductions (fixed block trees) of DeviceCG, double precision.
// Driver: DeviceCG of solvers/staggered_dist_cuda.py.
#include "hmc_common.cuh"
#define RB 256
__device__ void block_finish(double v, double *part, unsigned *counter, double *res) {
    __shared__ double sh[RB];
    __shared__ bool last;
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = RB / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        part[blockIdx.x] = sh[0];
        __threadfence();
        last = (atomicInc(counter, gridDim.x) == gridDim.x - 1);
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
        double t = 0.0;
        for (unsigned b = 0; b < gridDim.x; ++b) t += ((volatile double *)part)[b];
        *res = t;
        *counter = 0;
    }
}
// res = Re<u, v> over n complex elements (deterministic: fixed block trees, partials added in block order)
extern "C" __global__ void redot(const double2 *u, const double2 *v, long long n, double *part, unsigned *counter,
                                 double *res) {
    double acc = 0.0;
    for (long long i = blockIdx.x * (long long)RB + threadIdx.x; i < n; i += (long long)RB * gridDim.x) {
        const double2 a = u[i], b = v[i];
        acc += a.x * b.x + a.y * b.y;
    }
    block_finish(acc, part, counter, res);
}
// x += alpha p; r -= alpha ap (alpha = sc[2]); res = |r|^2
extern "C" __global__ void update_xr(double2 *x, double2 *r, const double2 *p, const double2 *ap, const double *sc,
                                     long long n, double *part, unsigned *counter, double *res) {
    const double alpha = sc[2];
    double acc = 0.0;
    for (long long i = blockIdx.x * (long long)RB + threadIdx.x; i < n; i += (long long)RB * gridDim.x) {
        double2 xi = x[i], ri = r[i];
        const double2 pi = p[i], qi = ap[i];
        xi.x += alpha * pi.x; xi.y += alpha * pi.y;
        ri.x -= alpha * qi.x; ri.y -= alpha * qi.y;
        x[i] = xi; r[i] = ri;
        acc += ri.x * ri.x + ri.y * ri.y;
    }
    block_finish(acc, part, counter, res);
}
// p = r + beta p (beta = sc[4])
extern "C" __global__ void xpay(double2 *p, const double2 *r, const double *sc, long long n) {
    const double beta = sc[4];
    for (long long i = blockIdx.x * (long long)RB + threadIdx.x; i < n; i += (long long)RB * gridDim.x) {
        double2 pi = p[i];
        const double2 ri = r[i];
        pi.x = ri.x + beta * pi.x; pi.y = ri.y + beta * pi.y;
        p[i] = pi;
    }
}
// s = vals[0] + ... + vals[P-1] in order; mode 0: *dst = s; 1: pAp -> alpha; 2: rr_new -> beta, rr
// sc: [0] rr, [1] pAp, [2] alpha, [3] rr_new, [4] beta
extern "C" __global__ void combine(const double *vals, int P, double *dst, double *sc, int mode) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = vals[0];
    for (int k = 1; k < P; ++k) s += vals[k];
    if (mode == 0) { *dst = s; }
    else if (mode == 1) { sc[1] = s; sc[2] = sc[0] / s; }
    else { sc[3] = s; sc[4] = s / sc[0]; sc[0] = s; }
}
