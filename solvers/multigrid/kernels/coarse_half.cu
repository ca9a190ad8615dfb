// The coarse 9-point stencil with its links in half precision (solvers/multigrid/half.py): Y stored as 16-bit
// integers, one float scale per (direction, site) block, decoded in float32 as y = scale * (float)q; the vectors and
// the sums are float32 (complex64, interleaved re, im). Reference: half.stencil_reference (the same decoding).
// Layout: Yq (9, nsite, n [column j], n [row i], 2 [re, im]) -- each block stored column-major, so that the threads
// of consecutive rows i read consecutive 4-byte (re, im) pairs at every j (coalesced for one column, the solve
// phase); scale (9, nsite); v and out (rows, n, k) of complex64; nb as solvers/multigrid/cuda.neighbour_table.
// One thread per output (site, row, column), column fastest; no grid-stride loop (the host shim of the CPU tests,
// tests/force/cuda_host.py, runs one thread per block index).
#include "hmc_common.cuh"
extern "C" __global__ void mg_stencil_half(const short* __restrict__ Yq, const float* __restrict__ scale,
                                           const float* __restrict__ v, const long long* __restrict__ nb,
                                           float* __restrict__ out, long long nsite, int n, int k) {
    const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long total = nsite * n * k;
    if (idx >= total) return;
    const int col = (int)(idx % k);
    const int i = (int)((idx / k) % n);
    const long long s = idx / ((long long)k * n);
    float re = 0.f, im = 0.f;
    for (int d = 0; d < 9; ++d) {
        const long long b = d * nsite + s;
        const long long t = nb[b];
        const float sc = scale[b];
        const short* y = Yq + (b * n * (long long)n + i) * 2;          // element (i, j) at y[2 j n]
        const float* x = v + (t * n * (long long)k + col) * 2;         // component j at x[2 j k]
        for (int j = 0; j < n; ++j) {
            const float yr = sc * (float)y[2LL * j * n], yi = sc * (float)y[2LL * j * n + 1];
            const float xr = x[2LL * j * k], xi = x[2LL * j * k + 1];
            re += yr * xr - yi * xi;
            im += yr * xi + yi * xr;
        }
    }
    out[2 * idx] = re;
    out[2 * idx + 1] = im;
}

// The warp-per-row variant (half.py's ``rows`` layout, for the small coarse lattices where one thread per row leaves
// the device nearly empty): Yq here stored row by row, (9, nsite, n [row i], n [column j], 2), so that a group of
// `lanes` consecutive threads (a warp: lanes = 32) per output row splits the sum over j and its lanes read
// consecutive 4-byte (re, im) pairs of the row (coalesced), then a shuffle reduction; lane 0 writes. A group serves
// HALF_TILE columns of the row at once (the batched solve's k columns: the row of Y is read once per tile, not once
// per column; half.py's TILE). Per direction the partial sum is taken over the integers and scaled once:
// sum_j y_ij x_j = scale * sum_j q_ij x_j. Threads: (site, row, tile) x lanes, a whole number of warps per block,
// so a warp leaves together.
#define HALF_TILE 4
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
// The host build of the CPU tests (tests/force/cuda_host.py, g++) runs one thread after another: lanes = 1 there,
// and the reduction loop below never runs (nvcc and nvrtc define __CUDACC__ / __CUDACC_RTC__: the intrinsic).
static inline float __shfl_down_sync(unsigned, float v, int) { return v; }
#endif
extern "C" __global__ void mg_stencil_half_rows(const short* __restrict__ Yq, const float* __restrict__ scale,
                                                const float* __restrict__ v, const long long* __restrict__ nb,
                                                float* __restrict__ out, long long nsite, int n, int k, int lanes) {
    const long long gid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long w = gid / lanes;
    const int lane = (int)(gid % lanes);
    const int tiles = (k + HALF_TILE - 1) / HALF_TILE;
    if (w >= nsite * n * tiles) return;
    const int c0 = (int)(w % tiles) * HALF_TILE;
    const int i = (int)((w / tiles) % n);
    const long long s = w / ((long long)tiles * n);
    const int nc = k - c0 < HALF_TILE ? k - c0 : HALF_TILE;
    float re[HALF_TILE], im[HALF_TILE];
    for (int c = 0; c < HALF_TILE; ++c) re[c] = im[c] = 0.f;
    for (int d = 0; d < 9; ++d) {
        const long long b = d * nsite + s;
        const long long t = nb[b];
        const short* y = Yq + (b * n + i) * (long long)n * 2;           // row i: element j at y[2 j]
        const float* x = v + (t * n * (long long)k + c0) * 2;          // component j, column c0 + c at x[2 (j k + c)]
        float pr[HALF_TILE], pi[HALF_TILE];
        for (int c = 0; c < HALF_TILE; ++c) pr[c] = pi[c] = 0.f;
        for (int j = lane; j < n; j += lanes) {
            const float yr = (float)y[2 * j], yi = (float)y[2 * j + 1];
            const float* xj = x + 2LL * j * k;
            for (int c = 0; c < HALF_TILE; ++c) {
                if (c < nc) {
                    const float xr = xj[2 * c], xi = xj[2 * c + 1];
                    pr[c] += yr * xr - yi * xi;
                    pi[c] += yr * xi + yi * xr;
                }
            }
        }
        const float sc = scale[b];
        for (int c = 0; c < HALF_TILE; ++c) {
            re[c] += sc * pr[c];
            im[c] += sc * pi[c];
        }
    }
    for (int off = lanes >> 1; off > 0; off >>= 1) {
        for (int c = 0; c < HALF_TILE; ++c) {
            re[c] += __shfl_down_sync(0xffffffffu, re[c], off);
            im[c] += __shfl_down_sync(0xffffffffu, im[c], off);
        }
    }
    if (lane == 0) {
        float* o = out + ((s * n + i) * (long long)k + c0) * 2;
        for (int c = 0; c < nc; ++c) {
            o[2 * c] = re[c];
            o[2 * c + 1] = im[c];
        }
    }
}
