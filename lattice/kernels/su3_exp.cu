// The link update U <- exp(dt P) U, Cayley-Hamilton form (Morningstar & Peardon, PRD 69 054501), one thread per
// link. Driver: lattice/su3_cuda.py exp_update; NumPy twin: su3.expm_su3(dt * P) @ U.
#include "hmc_common.cuh"
#include <cuComplex.h>
typedef cuDoubleComplex cplx;
__device__ __forceinline__ cplx cm(cplx a, cplx b) { return cuCmul(a, b); }
__device__ __forceinline__ cplx ca(cplx a, cplx b) { return cuCadd(a, b); }
__device__ __forceinline__ cplx cs(double s, cplx a) { return make_cuDoubleComplex(s * a.x, s * a.y); }
__device__ __forceinline__ cplx cexp_i(double t) { double s, c; sincos(t, &s, &c); return make_cuDoubleComplex(c, s); }

extern "C" __global__ void exp_update(const cplx *__restrict__ P, cplx *__restrict__ U, double dt, long nlinks) {
    long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= nlinks) return;
    const cplx *p = P + 9 * l;
    cplx *u = U + 9 * l;
    cplx q[9], q2[9], e[9], a[9];
    // Q = -i dt P (Hermitian, traceless)
    for (int i = 0; i < 9; ++i) { cplx t = p[i]; q[i] = make_cuDoubleComplex(dt * t.y, -dt * t.x); a[i] = u[i]; }
    for (int i = 0; i < 3; ++i) for (int k = 0; k < 3; ++k) {
        cplx s = make_cuDoubleComplex(0, 0);
        for (int j = 0; j < 3; ++j) s = ca(s, cm(q[3 * i + j], q[3 * j + k]));
        q2[3 * i + k] = s;
    }
    double c1 = 0.5 * (q2[0].x + q2[4].x + q2[8].x);
    double c0 = 0.0;  // Tr Q^3 / 3
    for (int i = 0; i < 3; ++i) for (int j = 0; j < 3; ++j) c0 += cm(q[3 * i + j], q2[3 * j + i]).x;
    c0 /= 3.0;
    cplx f0, f1, f2;
    if (c1 < 1e-12) {  // Q ~ 0: series, exp(iQ) = 1 + iQ - Q^2/2 - i Q^3/6 (Q^3 = c1 Q + c0 for traceless Q)
        f0 = make_cuDoubleComplex(1.0, -c0 / 6.0);
        f1 = make_cuDoubleComplex(0.0, 1.0 - c1 / 6.0);
        f2 = make_cuDoubleComplex(-0.5, 0.0);
    } else {
        bool neg = c0 < 0;
        double c0a = fabs(c0);
        double c0max = 2.0 * pow(c1 / 3.0, 1.5);
        double ratio = fmin(fmax(c0a / c0max, -1.0), 1.0);
        double theta = acos(ratio);
        double uu = sqrt(c1 / 3.0) * cos(theta / 3.0);
        double w = sqrt(c1) * sin(theta / 3.0);
        double w2 = w * w, u2 = uu * uu;
        double xi0 = fabs(w) < 0.05 ? 1.0 - w2 / 6.0 * (1.0 - w2 / 20.0 * (1.0 - w2 / 42.0)) : sin(w) / w;
        cplx e2iu = cexp_i(2.0 * uu), emiu = cexp_i(-uu);
        double cw = cos(w);
        cplx h0 = ca(cs(u2 - w2, e2iu), cm(emiu, make_cuDoubleComplex(8.0 * u2 * cw, 2.0 * uu * (3.0 * u2 + w2) * xi0)));
        cplx h1 = cuCsub(cs(2.0 * uu, e2iu), cm(emiu, make_cuDoubleComplex(2.0 * uu * cw, -(3.0 * u2 - w2) * xi0)));
        cplx h2 = cuCsub(e2iu, cm(emiu, make_cuDoubleComplex(cw, 3.0 * uu * xi0)));
        double den = 1.0 / (9.0 * u2 - w2);
        f0 = cs(den, h0); f1 = cs(den, h1); f2 = cs(den, h2);
        if (neg) { f0 = cuConj(f0); f1 = cs(-1.0, cuConj(f1)); f2 = cuConj(f2); }
    }
    for (int i = 0; i < 9; ++i) e[i] = ca(cm(f1, q[i]), cm(f2, q2[i]));
    e[0] = ca(e[0], f0); e[4] = ca(e[4], f0); e[8] = ca(e[8], f0);
    for (int i = 0; i < 3; ++i) for (int k = 0; k < 3; ++k) {
        cplx s = make_cuDoubleComplex(0, 0);
        for (int j = 0; j < 3; ++j) s = ca(s, cm(e[3 * i + j], a[3 * j + k]));
        u[3 * i + k] = s;
    }
}
