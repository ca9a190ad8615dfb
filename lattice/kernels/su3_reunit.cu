// MILC's reunitarization (generic/reunitarize2.c reunit_su3), one thread per link: row 0 normalized, row 1 made
// orthogonal to it and normalized, row 2 = conj(row 0 x row 1). Driver: lattice/su3_cuda.py reunitarize; twin:
// lattice.su3.reunitarize, whose array operations these are in the same order (the same numbers to rounding: NumPy's
// own complex products may use fused multiply-adds).
#include "hmc_common.cuh"

// sum_k |r_k|^2 in the order k = 0, 1, 2
__device__ __forceinline__ double norm2_row(const double2 *r) {
    double s = r[0].x * r[0].x + r[0].y * r[0].y;
    s += r[1].x * r[1].x + r[1].y * r[1].y;
    s += r[2].x * r[2].x + r[2].y * r[2].y;
    return s;
}

extern "C" __global__ void reunitarize_links(const double2 *__restrict__ U, double2 *__restrict__ out, long nlinks) {
    const long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= nlinks) return;
    const double2 *u = U + 9 * l;
    double2 r0[3], r1[3];
    for (int k = 0; k < 3; ++k) { r0[k] = u[k]; r1[k] = u[3 + k]; }
    // z / n as NumPy divides a complex by a real (Smith's form with a zero imaginary part: z times 1 / n)
    const double s0 = 1.0 / sqrt(norm2_row(r0));
    for (int k = 0; k < 3; ++k) r0[k] = make_double2(r0[k].x * s0, r0[k].y * s0);
    double2 d = ccmul(r0[0], r1[0]);                     // <r0, r1> = sum_k conj(r0_k) r1_k
    d = cadd(d, ccmul(r0[1], r1[1]));
    d = cadd(d, ccmul(r0[2], r1[2]));
    for (int k = 0; k < 3; ++k) {
        const double2 t = cmul(d, r0[k]);
        r1[k] = make_double2(r1[k].x - t.x, r1[k].y - t.y);
    }
    const double s1 = 1.0 / sqrt(norm2_row(r1));
    for (int k = 0; k < 3; ++k) r1[k] = make_double2(r1[k].x * s1, r1[k].y * s1);
    double2 *o = out + 9 * l;
    for (int k = 0; k < 3; ++k) { o[k] = r0[k]; o[3 + k] = r1[k]; }
    for (int k = 0; k < 3; ++k) {                        // (r0 x r1)_k = r0_{k+1} r1_{k+2} - r0_{k+2} r1_{k+1}
        const int a = (k + 1) % 3, b = (k + 2) % 3;
        const double2 p = cmul(r0[a], r1[b]), q = cmul(r0[b], r1[a]);
        o[6 + k] = make_double2(p.x - q.x, -(p.y - q.y));
    }
}
