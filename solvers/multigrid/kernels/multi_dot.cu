// Several inner products of coarse fields in two launches (solvers/multigrid/krylov.py, local_dots): out[p] =
// sum_e conj(v_{a_p}[e]) v_{b_p}[e] for the pairs p < npairs of up to NVEC fields v_0 .. v_{NVEC-1} of n complex
// numbers each. The GCR smoother's Gram matrix and right-hand side (14 products for 4 steps) and the K-cycle GCR's
// Gram-Schmidt coefficients were one (product, sum, copy) chain of kernels each: on the 4^4 x 96 level of a 32^4
// hierarchy about half of a captured step's graph nodes (runs/multigrid/README.md).
//
// Pass 1 (mg_multi_dot_{double,float}): block b of `nblocks` (a grid-stride loop over the elements) sums its threads'
// products in double, in shared memory by a fixed tree, into partial[b * MAXPAIR + p]. Pass 2 (mg_multi_dot_finish):
// thread p adds the blocks' partials in block order. Fixed launch shape, fixed order: the same bits every call.
// The pair indices come packed 4 bits each (pair p: bits 4p .. 4p+3 of `a` and `b`); fields and indices are kernel
// arguments, so a CUDA graph of a step bakes them in as values (no table copied from the host during a capture).
// Plain C++ in the arithmetic (no warp shuffles), so that the CPU tests compile it for the host with one thread a
// block (tests/force/cuda_host.py) and compare it with NumPy.
#include "hmc_common.cuh"
#define NVEC 9
#define MAXPAIR 15
#define DOT_THREADS 128

template <typename C>
__device__ __forceinline__ void multi_dot_blocks(const C *v0, const C *v1, const C *v2, const C *v3, const C *v4,
                                                 const C *v5, const C *v6, const C *v7, const C *v8, long long a,
                                                 long long b, int npairs, long n, int nblocks, double2 *partial) {
    __shared__ double2 sh[DOT_THREADS];
    const C *v[NVEC] = {v0, v1, v2, v3, v4, v5, v6, v7, v8};
    double2 acc[MAXPAIR];
    #pragma unroll
    for (int p = 0; p < MAXPAIR; ++p) acc[p] = make_double2(0.0, 0.0);
    const long stride = (long)nblocks * blockDim.x;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < n; e += stride) {
        #pragma unroll
        for (int p = 0; p < MAXPAIR; ++p) {
            if (p < npairs) {
                const C x = v[(a >> (4 * p)) & 15][e], y = v[(b >> (4 * p)) & 15][e];
                const double xr = x.x, xi = x.y, yr = y.x, yi = y.y;
                acc[p].x += xr * yr + xi * yi;
                acc[p].y += xr * yi - xi * yr;
            }
        }
    }
    for (int p = 0; p < npairs; ++p) {
        sh[threadIdx.x] = acc[p];
        __syncthreads();
        for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                sh[threadIdx.x].x += sh[threadIdx.x + s].x;
                sh[threadIdx.x].y += sh[threadIdx.x + s].y;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) partial[blockIdx.x * MAXPAIR + p] = sh[0];
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(DOT_THREADS) mg_multi_dot_double(
        const double2 *v0, const double2 *v1, const double2 *v2, const double2 *v3, const double2 *v4,
        const double2 *v5, const double2 *v6, const double2 *v7, const double2 *v8, long long a, long long b,
        int npairs, long n, int nblocks, double2 *partial) {
    multi_dot_blocks<double2>(v0, v1, v2, v3, v4, v5, v6, v7, v8, a, b, npairs, n, nblocks, partial);
}

extern "C" __global__ void __launch_bounds__(DOT_THREADS) mg_multi_dot_float(
        const float2 *v0, const float2 *v1, const float2 *v2, const float2 *v3, const float2 *v4,
        const float2 *v5, const float2 *v6, const float2 *v7, const float2 *v8, long long a, long long b,
        int npairs, long n, int nblocks, double2 *partial) {
    multi_dot_blocks<float2>(v0, v1, v2, v3, v4, v5, v6, v7, v8, a, b, npairs, n, nblocks, partial);
}

// out[p] = sum over the blocks b = 0, 1, ... of partial[b * MAXPAIR + p]; one thread per pair
extern "C" __global__ void mg_multi_dot_finish(const double2 *partial, int nblocks, int npairs, double2 *out) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= npairs) return;
    double2 s = partial[p];
    for (int k = 1; k < nblocks; ++k) {
        s.x += partial[k * MAXPAIR + p].x;
        s.y += partial[k * MAXPAIR + p].y;
    }
    out[p] = s;
}
