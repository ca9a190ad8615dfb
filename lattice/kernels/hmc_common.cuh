// The declarations every kernel file of the project shares (each .cu file starts with #include "hmc_common.cuh";
// lattice/cuda_source.py puts this text in place of that line before compiling, so nvrtc needs no include path and
// CuPy's compile cache sees every byte that is compiled). Only helpers that were written out identically in
// several kernel sources live here; a file's own variants (other loads, products with another summation order)
// stay in it, so that every kernel's arithmetic is exactly what it was.
#ifndef HMC_COMMON_CUH
#define HMC_COMMON_CUH

// the complex type of a real precision R: C2<double>::T = double2, C2<float>::T = float2
template <typename R> struct C2;
template <> struct C2<double> { typedef double2 T; };
template <> struct C2<float> { typedef float2 T; };

// a 3x3 complex matrix, row-major (e[3 i + j] = M_ij), as the (..., 3, 3) link arrays store it
struct M3 { double2 e[9]; };

// double-precision complex arithmetic on double2 (x: real part, y: imaginary part)
__device__ __forceinline__ double2 cadd(double2 a, double2 b) { return make_double2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ double2 cmul(double2 a, double2 b) {
    return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ double2 cmulc(double2 a, double2 b) {  // a * conj(b)
    return make_double2(a.x * b.x + a.y * b.y, a.y * b.x - a.x * b.y);
}
__device__ __forceinline__ double2 ccmul(double2 a, double2 b) {  // conj(a) * b
    return make_double2(a.x * b.x + a.y * b.y, a.x * b.y - a.y * b.x);
}

#endif  // HMC_COMMON_CUH
