// Dense products of the multigrid on the device, by hand (CuPy refuses cuBLAS inside a CUDA-graph capture, and the
// multigrid captures the deepest K-cycle's steps, solvers/multigrid/graph.py). Two passes each, one thread per
// output number, so that the sum's order is fixed and the host build of the CPU tests (one thread after another)
// runs them as they are.
//
// 1. The coarsest level's dense inverse applied on the device (solvers/multigrid/precision.py, DenseInverse): y = A x
// for k right-hand sides, x and y (n, k) row-major, A given transposed (AT[j n + i] = A_ij) so that consecutive
// threads (consecutive rows i) read consecutive words. Written by hand instead of cuBLAS's gemm because CuPy refuses
// cuBLAS inside a CUDA-graph capture, and the multigrid captures the steps that contain this solve
// (solvers/multigrid/graph.py). Two passes, one thread per output number each, so that the sum's order is fixed
// (the same bits every call) and the host build of the CPU tests (one thread after another) runs it as is:
// dense_partial: the partial sum over the q-th chunk of the columns j, part[(q n + i) k + c]; dense_sum: the chunks'
// partials added in chunk order. The traffic is one read of A (n^2 numbers); nchunk spreads it over enough threads.
#include "hmc_common.cuh"

template <typename R>
__device__ void dense_partial(const typename C2<R>::T *__restrict__ AT, const typename C2<R>::T *__restrict__ x,
                              typename C2<R>::T *__restrict__ part, int n, int k, int nchunk) {
    typedef typename C2<R>::T T;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * k * nchunk) return;
    const int i = (int)(t % n);
    const long long rest = t / n;
    const int c = (int)(rest % k), q = (int)(rest / k);
    const int len = (n + nchunk - 1) / nchunk;
    const int j0 = q * len, j1 = j0 + len < n ? j0 + len : n;
    R sr = 0, si = 0;
    for (int j = j0; j < j1; ++j) {
        const T a = AT[(long long)j * n + i];
        const T v = x[(long long)j * k + c];
        sr += a.x * v.x - a.y * v.y;
        si += a.x * v.y + a.y * v.x;
    }
    T out;
    out.x = sr; out.y = si;
    part[((long long)q * n + i) * k + c] = out;
}

template <typename R>
__device__ void dense_sum(const typename C2<R>::T *__restrict__ part, typename C2<R>::T *__restrict__ y, int n,
                          int k, int nchunk) {
    typedef typename C2<R>::T T;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long nk = (long long)n * k;
    if (t >= nk) return;
    T acc = part[t];
    for (int q = 1; q < nchunk; ++q) {
        const T p = part[q * nk + t];
        acc.x += p.x; acc.y += p.y;
    }
    y[t] = acc;
}

extern "C" __global__ void dense_partial_double(const double2 *AT, const double2 *x, double2 *part, int n, int k,
                                                int nchunk) {
    dense_partial<double>(AT, x, part, n, k, nchunk);
}
extern "C" __global__ void dense_partial_single(const float2 *AT, const float2 *x, float2 *part, int n, int k,
                                                int nchunk) {
    dense_partial<float>(AT, x, part, n, k, nchunk);
}
extern "C" __global__ void dense_sum_double(const double2 *part, double2 *y, int n, int k, int nchunk) {
    dense_sum<double>(part, y, n, k, nchunk);
}
extern "C" __global__ void dense_sum_single(const float2 *part, float2 *y, int n, int k, int nchunk) {
    dense_sum<float>(part, y, n, k, nchunk);
}

// 2. Stacks of small products inside a capture (solvers/multigrid/lattice.py, bmm: the restriction and
// prolongation of the captured step): C_b = A_b B_b, A (batch, n, m), B (batch, m, k), C (batch, n, k), all
// row-major. bmm_partial: the partial sum over the q-th chunk of j, part[((q batch + b) n + i) k + c]; bmm_sum:
// the chunks added in chunk order.
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

extern "C" __global__ void bmm_partial_double(const double2 *A, const double2 *B, double2 *part, int batch, int n,
                                              int m, int k, int nchunk) {
    bmm_partial<double>(A, B, part, batch, n, m, k, nchunk);
}
extern "C" __global__ void bmm_partial_single(const float2 *A, const float2 *B, float2 *part, int batch, int n,
                                              int m, int k, int nchunk) {
    bmm_partial<float>(A, B, part, batch, n, m, k, nchunk);
}
