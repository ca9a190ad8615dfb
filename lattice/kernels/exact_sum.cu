// Exact, decomposition-independent reductions on the device: |a|^2 and Re<a, b> of complex fields (and the elements
// of a real float64 array: exact_sum_f64, lattice.geometry's global sums) summed exactly into
// fixed-point accumulators (67 limbs of 32-bit digits from 2^-1074 up, one slot of non-finite flags), and k such
// accumulators (one per rank) added and rounded once to the correctly rounded doubles. The format, the formulas and
// the NumPy twin line by line: comms/superacc.py; why this layout: docs/reductions.md. Compiled with --fmad=false so
// that every product is formed as the NumPy "exact" mode forms it (solvers/operator.py).
// Driver: lattice/exact_sum_cuda.py.
#include "hmc_common.cuh"

#define EXS_NL 67            // limbs of digits (superacc.NLIMBS)
#define EXS_W 68             // int64 per record: the limbs, then the flags (superacc.WIDTH)
#define EXS_WIN 5            // limbs a thread keeps in registers: anchor K .. K + 4, digits of limbs k = K .. K + 2
#define EXS_NAN 1
#define EXS_PINF 2
#define EXS_NINF 4
#define EXS_QMAX 4           // quantities the rounding kernel takes

typedef long long i64;
typedef unsigned long long u64;

// the digits of x: returns the limb k of d0 (d1, d2 go to k + 1, k + 2), or -1 for a zero or non-finite x, whose
// flag bit is ORed into flags (superacc.split)
__device__ __forceinline__ int exs_split(double x, i64 &d0, i64 &d1, i64 &d2, unsigned &flags) {
    const u64 bits = (u64)__double_as_longlong(x);
    const int ex = (int)((bits >> 52) & 0x7FF);
    const u64 frac = bits & 0xFFFFFFFFFFFFFull;
    if (ex == 0x7FF) {
        flags |= frac ? EXS_NAN : ((bits >> 63) ? EXS_NINF : EXS_PINF);
        return -1;
    }
    const u64 m = ex ? (frac | (1ull << 52)) : frac;
    if (m == 0) return -1;
    const int s = (ex ? ex : 1) - 1;           // x = +-m 2^(s - 1074), s in 0..2045
    const int r = s & 31;
    const u64 lo = m << r;                      // m 2^r mod 2^64
    const u64 hi = (m >> 32) >> (32 - r);       // m 2^r >> 64, no shift by 64 when r = 0
    d0 = (i64)(lo & 0xFFFFFFFFull);
    d1 = (i64)(lo >> 32);
    d2 = (i64)hi;
    if (bits >> 63) { d0 = -d0; d1 = -d1; d2 = -d2; }
    return s >> 5;
}

// adds x to a thread's register window w (limbs K .. K + 4), or to the block's shared limbs when its digits fall
// outside the window
__device__ __forceinline__ void exs_add(double x, int K, i64 *w, u64 *sh, unsigned &flags) {
    i64 d0 = 0, d1 = 0, d2 = 0;
    const int k = exs_split(x, d0, d1, d2, flags);
    if (k < 0) return;
    const int j = k - K;
    if (j >= 0 && j <= EXS_WIN - 3) {
#pragma unroll
        for (int t = 0; t < EXS_WIN; ++t)
            w[t] += (t == j ? d0 : 0) + (t == j + 1 ? d1 : 0) + (t == j + 2 ? d2 : 0);
    } else {
        atomicAdd(&sh[k], (u64)d0);             // two's complement: the signed sum, mod 2^64
        atomicAdd(&sh[k + 1], (u64)d1);
        atomicAdd(&sh[k + 2], (u64)d2);
    }
}

// the warp-uniform anchor of the register windows: two limbs below the largest limb of the warp's first values
__device__ __forceinline__ int exs_anchor(double x) {
    i64 d0, d1, d2;
    unsigned f = 0;
    const int k = exs_split(x, d0, d1, d2, f);
    const int kmax = (int)__reduce_max_sync(0xffffffffu, (unsigned)(k < 0 ? 0 : k));
    return kmax >= 2 ? kmax - 2 : 0;
}

// carries propagated: digits 0..65 in [0, 2^32), the top limb signed (superacc.normalise)
__device__ void exs_normalise(i64 *L) {
    i64 c = 0;
    for (int i = 0; i < EXS_NL - 1; ++i) {
        const i64 v = L[i] + c;
        L[i] = v & 0xFFFFFFFFll;
        c = v >> 32;                            // arithmetic shift: floor
    }
    L[EXS_NL - 1] += c;
}

// the bits of the non-negative double nearest to sum_i L_i 2^(32 i - 1074), normalised digits (superacc._round_bits)
__device__ u64 exs_round_bits(const i64 *L) {
    int h = EXS_NL - 1;
    while (h >= 0 && L[h] == 0) --h;
    if (h < 0) return 0;
    const u64 low = h >= 1 ? (((u64)L[1] << 32) | (u64)L[0]) : (u64)L[0];
    if (h <= 1 && low < (1ull << 53)) return low;   // subnormal or below 2^-1021: exact, bits = N
    const u64 x = (u64)L[h];
    const int lz = __clz((unsigned)x);
    const int p = 32 * h + 31 - lz;                 // the leading bit of N
    if (p > 2097) return 0x7FF0000000000000ull;
    const u64 l1 = (u64)L[h - 1];
    const u64 l2 = h >= 2 ? (u64)L[h - 2] : 0;
    const u64 t = (((x << 32) | l1) << lz) | (lz ? (l2 >> (32 - lz)) : 0);
    bool sticky = (t & 0x3FF) != 0 || (l2 & ((1ull << (32 - lz)) - 1)) != 0;
    for (int i = 0; i < h - 2; ++i) sticky |= L[i] != 0;
    const u64 q = t >> 11;
    const u64 up = ((t >> 10) & 1) && (sticky || (q & 1));   // round half to even
    const u64 b = ((u64)(p - 52) << 52) + q + up;            // a carry out of q moves into the exponent
    return b < 0x7FF0000000000000ull ? b : 0x7FF0000000000000ull;
}

// the correctly rounded double of a normalised record (limbs, then flags) (superacc.to_float); uses L as scratch
__device__ double exs_round(i64 *L) {
    const unsigned f = (unsigned)L[EXS_NL];
    if (f) {
        if ((f & EXS_NAN) || (f & (EXS_PINF | EXS_NINF)) == (EXS_PINF | EXS_NINF))
            return __longlong_as_double(0x7FF8000000000000ll);
        return __longlong_as_double((f & EXS_PINF) ? 0x7FF0000000000000ll : (i64)0xFFF0000000000000ull);
    }
    const bool neg = L[EXS_NL - 1] < 0;
    if (neg) {
        for (int i = 0; i < EXS_NL; ++i) L[i] = -L[i];
        exs_normalise(L);
    }
    return __longlong_as_double((i64)(exs_round_bits(L) | ((u64)neg << 63)));
}

// the per-element products, formed as solvers/operator.py's exact mode forms them (in the field's precision R)
template <typename R> struct Pair {
    typedef typename C2<R>::T T;
    static __device__ __forceinline__ double first(T a) { const R p = a.x * a.x + a.y * a.y; return (double)p; }
    static __device__ __forceinline__ double second(T a, T b) { const R p = a.x * b.x + a.y * b.y; return (double)p; }
};
// the elements themselves of a real float64 array (lattice.geometry's global sums on the device)
struct Plain {
    typedef double T;
    static __device__ __forceinline__ double first(double a) { return a; }
    static __device__ __forceinline__ double second(double, double) { return 0.0; }
};

// the last block's work: read and clear the scratch limbs (atomicExch: L2's values), normalise each quantity's
// record into out, and round it into result when result is given
template <int Q> __device__ void exs_finish(u64 *sh, u64 *scratch, i64 *out, double *result) {
    for (int i = threadIdx.x; i < Q * EXS_W; i += blockDim.x) sh[i] = atomicExch(&scratch[i], 0ull);
    __syncthreads();
    if (threadIdx.x < Q) exs_normalise((i64 *)sh + threadIdx.x * EXS_W);
    __syncthreads();
    for (int i = threadIdx.x; i < Q * EXS_W; i += blockDim.x) out[i] = (i64)sh[i];
    __syncthreads();
    if (result != 0 && threadIdx.x < Q) result[threadIdx.x] = exs_round((i64 *)sh + threadIdx.x * EXS_W);
}

// Q = 1: out[0] = the record of the sum of V::first(a_i) (|a_i|^2, or a_i itself); Q = 2: out[0], out[1] = the
// records of |a|^2 and Re<a, b>, over n elements. scratch (Q x 68 u64) and counter are zero before the launch and
// are left zero by its last block.
template <typename V, int Q>
__device__ void exs_reduce(const typename V::T *a, const typename V::T *b, long long n, u64 *scratch,
                           unsigned *counter, i64 *out, double *result) {
    typedef typename V::T T;
    __shared__ u64 sh[Q * EXS_W];
    __shared__ bool last;
    for (int i = threadIdx.x; i < Q * EXS_W; i += blockDim.x) sh[i] = 0;
    __syncthreads();
    const long long stride = (long long)blockDim.x * gridDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    double x[Q];
    {
        const T ai = i < n ? a[i] : T();
        x[0] = i < n ? V::first(ai) : 0.0;
        if (Q == 2) x[Q - 1] = i < n ? V::second(ai, b[i]) : 0.0;
    }
    int K[Q];
    i64 w[Q][EXS_WIN];
    unsigned flags[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        K[q] = exs_anchor(x[q]);
        flags[q] = 0;
#pragma unroll
        for (int t = 0; t < EXS_WIN; ++t) w[q][t] = 0;
        exs_add(x[q], K[q], w[q], sh + q * EXS_W, flags[q]);
    }
    for (i += stride; i < n; i += stride) {
        const T ai = a[i];
        exs_add(V::first(ai), K[0], w[0], sh, flags[0]);
        if (Q == 2) exs_add(V::second(ai, b[i]), K[Q - 1], w[Q - 1], sh + (Q - 1) * EXS_W, flags[Q - 1]);
    }
#pragma unroll
    for (int q = 0; q < Q; ++q) {              // the warp's windows share their anchor: add them lane by lane
#pragma unroll
        for (int t = 0; t < EXS_WIN; ++t)
            for (int o = 16; o > 0; o >>= 1) w[q][t] += __shfl_xor_sync(0xffffffffu, w[q][t], o);
        const unsigned f = __reduce_or_sync(0xffffffffu, flags[q]);
        if ((threadIdx.x & 31) == 0) {
            for (int t = 0; t < EXS_WIN; ++t)
                if (w[q][t]) atomicAdd(&sh[q * EXS_W + K[q] + t], (u64)w[q][t]);
            if (f) atomicOr(&sh[q * EXS_W + EXS_NL], (u64)f);
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < Q * EXS_W; j += blockDim.x) {
        if (sh[j] == 0) continue;
        if (j % EXS_W == EXS_NL) atomicOr(&scratch[j], sh[j]);
        else atomicAdd(&scratch[j], sh[j]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicInc(counter, gridDim.x - 1) == gridDim.x - 1;   // wraps the counter to 0
    __syncthreads();
    if (last) exs_finish<Q>(sh, scratch, out, result);
}

extern "C" __global__ void exact_norm2_f64(const double2 *a, long long n, u64 *scratch, unsigned *counter, i64 *out,
                                           double *result) {
    exs_reduce<Pair<double>, 1>(a, a, n, scratch, counter, out, result);
}
extern "C" __global__ void exact_norm2_f32(const float2 *a, long long n, u64 *scratch, unsigned *counter, i64 *out,
                                           double *result) {
    exs_reduce<Pair<float>, 1>(a, a, n, scratch, counter, out, result);
}
extern "C" __global__ void exact_sum_f64(const double *a, long long n, u64 *scratch, unsigned *counter, i64 *out,
                                         double *result) {
    exs_reduce<Plain, 1>(a, a, n, scratch, counter, out, result);
}
extern "C" __global__ void exact_norm2_redot_f64(const double2 *a, const double2 *b, long long n, u64 *scratch,
                                                 unsigned *counter, i64 *out, double *result) {
    exs_reduce<Pair<double>, 2>(a, b, n, scratch, counter, out, result);
}
extern "C" __global__ void exact_norm2_redot_f32(const float2 *a, const float2 *b, long long n, u64 *scratch,
                                                 unsigned *counter, i64 *out, double *result) {
    exs_reduce<Pair<float>, 2>(a, b, n, scratch, counter, out, result);
}

// result[q] = the correctly rounded sum of the k records accs[r][q] (accs: k x nq x 68 int64, normalised, nq <= 4);
// total (nq x 68, or null) receives the normalised sum. One block; a thread per record slot adds the k ranks in
// rank order (integers: any order gives the same), then a thread per quantity normalises and rounds.
extern "C" __global__ void exact_round(const i64 *accs, int k, int nq, double *result, i64 *total) {
    __shared__ i64 sh[EXS_QMAX * EXS_W];
    for (int j = threadIdx.x; j < nq * EXS_W; j += blockDim.x) {
        i64 s = 0;
        if (j % EXS_W == EXS_NL) {
            for (int r = 0; r < k; ++r) s |= accs[(long long)r * nq * EXS_W + j];
        } else {
            for (int r = 0; r < k; ++r) s += accs[(long long)r * nq * EXS_W + j];
        }
        sh[j] = s;
    }
    __syncthreads();
    if (threadIdx.x < nq) exs_normalise(sh + threadIdx.x * EXS_W);
    __syncthreads();
    if (total != 0)
        for (int j = threadIdx.x; j < nq * EXS_W; j += blockDim.x) total[j] = sh[j];
    __syncthreads();
    if (threadIdx.x < nq) result[threadIdx.x] = exs_round(sh + threadIdx.x * EXS_W);
}

// One-step rank sums (comms/cuda/peersum.py): out[r * words + i] = table[r][i] for the k ranks' partials (fast pairs
// or exact records), read where their owners left them (the own area and the peers' mapped areas), into one
// contiguous (k, ...) buffer in rank order, which rank_sum or exact_round then sums. One thread a 64-bit word.
extern "C" __global__ void gather_u64(const unsigned long long *const *table, int k, long long words,
                                      unsigned long long *out) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)k * words) return;
    const int r = (int)(i / words);
    out[i] = table[r][i - (long long)r * words];
}

// The fast pairs of the one-step rank sums summed where they lie: dst = sum over r of table[r][0..1], left to right in
// rank order (the same operations as gather_u64 then rank_sum of fused_blas.cu: one kernel instead of two).
extern "C" __global__ void peer_pair_sum(const double *const *table, int k, double *dst) {
    double a = table[0][0], b = table[0][1];
    for (int r = 1; r < k; ++r) { a += table[r][0]; b += table[r][1]; }
    dst[0] = a;
    dst[1] = b;
}
