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
