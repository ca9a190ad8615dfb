// Stacks of small dense products of the multigrid on the device, by hand: C_b = A_b B_b, A (batch, n, m),
// B (batch, m, k), C (batch, n, k), all row-major (solvers/multigrid/lattice.py, batched_matmul). What the captured
// steps of the deepest K-cycle (solvers/multigrid/graph.py) run for their restriction, prolongation and the coarsest
// dense inverse (a stack of one), because CuPy refuses cuBLAS inside a CUDA-graph capture. Two passes, one thread
// per output number each, so that the sum's order is fixed (the same bits every call) and the host build of the
// CPU tests (one thread after another) runs them as they are: bmm_partial, the partial sum over the q-th chunk of j,
// part[((q batch + b) n + i) k + c]; chunk_sum, the chunks added in chunk order.
#include "hmc_common.cuh"

template <typename R>
__device__ void bmm_partial(const typename C2<R>::T *__restrict__ A, const typename C2<R>::T *__restrict__ B,
                            typename C2<R>::T *__restrict__ part, int batch, int n, int m, int k, int nchunk) {
    typedef typename C2<R>::T T;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)batch * n * k * nchunk) return;
    const int i = (int)(t % n);
    long long rest = t / n;
    const int c = (int)(rest % k);
    rest /= k;
    const int q = (int)(rest % nchunk), b = (int)(rest / nchunk);
    const int len = (m + nchunk - 1) / nchunk;
    const int j0 = q * len, j1 = j0 + len < m ? j0 + len : m;
    const T *a = A + ((long long)b * n + i) * m;
    const T *v = B + (long long)b * m * k + c;
    R sr = 0, si = 0;
    for (int j = j0; j < j1; ++j) {
        const T x = a[j], y = v[(long long)j * k];
        sr += x.x * y.x - x.y * y.y;
        si += x.x * y.y + x.y * y.x;
    }
    T out;
    out.x = sr; out.y = si;
    part[(((long long)q * batch + b) * n + i) * k + c] = out;
}

template <typename R>
__device__ void chunk_sum(const typename C2<R>::T *__restrict__ part, typename C2<R>::T *__restrict__ y,
                          long long size, int nchunk) {
    typedef typename C2<R>::T T;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= size) return;
    T acc = part[t];
    for (int q = 1; q < nchunk; ++q) {
        const T p = part[q * size + t];
        acc.x += p.x; acc.y += p.y;
    }
    y[t] = acc;
}

extern "C" __global__ void bmm_partial_double(const double2 *A, const double2 *B, double2 *part, int batch, int n,
                                              int m, int k, int nchunk) {
    bmm_partial<double>(A, B, part, batch, n, m, k, nchunk);
}
extern "C" __global__ void bmm_partial_single(const float2 *A, const float2 *B, float2 *part, int batch, int n,
                                              int m, int k, int nchunk) {
    bmm_partial<float>(A, B, part, batch, n, m, k, nchunk);
}
extern "C" __global__ void chunk_sum_double(const double2 *part, double2 *y, long long size, int nchunk) {
    chunk_sum<double>(part, y, size, nchunk);
}
extern "C" __global__ void chunk_sum_single(const float2 *part, float2 *y, long long size, int nchunk) {
    chunk_sum<float>(part, y, size, nchunk);
}
