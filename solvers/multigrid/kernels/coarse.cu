// The multigrid's coarse 9-point stencil (a thread per output, or a warp per output row for one column) and the
// Kahler-Dirac block X^-1. Driver: solvers/multigrid/cuda.py; references: stencil_reference, block_apply_reference.
// A template, compiled once per precision: cuda_source.source substitutes ${SUF} (kernel-name suffix), ${C} (the
// complex type) and ${R} (its real type) from solvers.multigrid.cuda.PRECISIONS.
#include <cupy/complex.cuh>
#include "hmc_common.cuh"
extern "C" __global__ void mg_stencil_${SUF}(const ${C}* __restrict__ Y, const ${C}* __restrict__ v,
                                          const long long* __restrict__ nb, ${C}* __restrict__ out,
                                          long long nsite, int n, int k) {
    const long long total = nsite * n * k;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(idx % k);
        const int i = (int)((idx / k) % n);
        const long long s = idx / ((long long)k * n);
        ${C} acc(0, 0);
        for (int d = 0; d < 9; ++d) {
            const long long t = nb[d * nsite + s];
            const ${C}* yrow = Y + ((d * nsite + s) * n + i) * (long long)n;
            const ${C}* vv = v + t * n * (long long)k + col;
            for (int j = 0; j < n; ++j) acc += yrow[j] * vv[(long long)j * k];
        }
        out[idx] = acc;
    }
}

// One column (the solve phase): one warp per output row, the lanes splitting j, so that a warp reads a row of
// Y_d and the neighbour's vector as contiguous 32-element runs (coalesced), then a shuffle reduction.
extern "C" __global__ void mg_stencil_row_${SUF}(const ${C}* __restrict__ Y, const ${C}* __restrict__ v,
                                              const long long* __restrict__ nb, ${C}* __restrict__ out,
                                              long long nsite, int n) {
    const int lane = threadIdx.x & 31;
    const long long total = nsite * n;
    const long long stride = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; w < total; w += stride) {
        const int i = (int)(w % n);
        const long long s = w / n;
        ${R} re = 0, im = 0;
        for (int d = 0; d < 9; ++d) {
            const long long t = nb[d * nsite + s];
            const ${C}* yrow = Y + ((d * nsite + s) * n + i) * (long long)n;
            const ${C}* vv = v + t * (long long)n;
            for (int j = lane; j < n; j += 32) {
                const ${C} a = yrow[j], b = vv[j];
                re += a.real() * b.real() - a.imag() * b.imag();
                im += a.real() * b.imag() + a.imag() * b.real();
            }
        }
        for (int off = 16; off > 0; off >>= 1) {
            re += __shfl_down_sync(0xffffffffu, re, off);
            im += __shfl_down_sync(0xffffffffu, im, off);
        }
        if (lane == 0) out[w] = ${C}(re, im);
    }
}

extern "C" __global__ void mg_block_apply_${SUF}(const ${C}* __restrict__ X, const ${C}* __restrict__ v,
                                              const long long* __restrict__ hc, ${C}* __restrict__ out,
                                              long long nhc, int k) {
    const long long total = nhc * 48 * k;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(idx % k);
        const int row = (int)((idx / k) % 48);
        const long long h = idx / (48LL * k);
        const ${C}* xrow = X + (h * 48 + row) * 48;
        const long long* sites = hc + h * 16;
        ${C} acc(0, 0);
        for (int r = 0; r < 48; ++r) acc += xrow[r] * v[(sites[r / 3] * 3 + r % 3) * (long long)k + col];
        out[(sites[row / 3] * 3 + row % 3) * (long long)k + col] = acc;
    }
}
