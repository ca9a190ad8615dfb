"""Fused CUDA kernels for the link update U <- exp(dt P) U (NumPy twins: ``su3.expm_su3(dt * P) @ U`` and, for
MILC's 8th-order series, ``su3.expm_taylor(dt * P) @ U``).

The exponential is the Cayley-Hamilton form of :func:`lattice.su3.expm_su3` (Morningstar & Peardon,
PRD 69 054501), evaluated per link in registers: one read of P and U, one write of U.
"""
from __future__ import annotations

import numpy as np

_SOURCE = r"""
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
"""


_TAYLOR_SOURCE = r"""
struct M3 { double2 e[9]; };
__device__ __forceinline__ double2 cmul(double2 a, double2 b) {
    return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ M3 mul_nn(const M3 &a, const M3 &b) {
    M3 c;
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = make_double2(0.0, 0.0);
            #pragma unroll
            for (int j = 0; j < 3; ++j) { double2 t = cmul(a.e[3 * i + j], b.e[3 * j + k]); s.x += t.x; s.y += t.y; }
            c.e[3 * i + k] = s;
        }
    return c;
}
// U <- [sum_{n=0}^{order} (dt P)^n / n!] U, the terms built as term_n = term_{n-1} (dt P) / n (su3._taylor_exp)
extern "C" __global__ void taylor_update(const double2 *__restrict__ P, double2 *U, double dt, int order, long n) {
    long l = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (l >= n) return;
    M3 a, term, out, u;
    #pragma unroll
    for (int i = 0; i < 9; ++i) {
        const double2 p = P[9 * l + i];
        a.e[i] = make_double2(dt * p.x, dt * p.y);
        term.e[i] = make_double2(i % 4 == 0 ? 1.0 : 0.0, 0.0);
        out.e[i] = term.e[i];
        u.e[i] = U[9 * l + i];
    }
    for (int k = 1; k <= order; ++k) {
        term = mul_nn(term, a);
        #pragma unroll
        for (int i = 0; i < 9; ++i) {
            term.e[i].x /= k; term.e[i].y /= k;
            out.e[i].x += term.e[i].x; out.e[i].y += term.e[i].y;
        }
    }
    const M3 r = mul_nn(out, u);
    #pragma unroll
    for (int i = 0; i < 9; ++i) U[9 * l + i] = r.e[i];
}
"""


def taylor_update(backend, p, links, dt: float, order: int = 8):
    """links <- expm_taylor(dt p, order) links, in place, on the GPU (twin: ``su3.expm_taylor(dt * p) @ links``)."""
    cp = backend.xp
    kern = backend.kernel(("taylor_update",), lambda: cp.RawModule(code=_TAYLOR_SOURCE).get_function("taylor_update"))
    n = links.size // 9
    block = 128
    kern(((n + block - 1) // block,), (block,), (p, links, np.float64(dt), np.int32(order), np.int64(n)))
    return links


def exp_update(backend, p, links, dt: float):
    """links <- exp(dt p) links, in place, on the GPU."""
    cp = backend.xp
    kern = backend.kernel(("exp_update",), lambda: cp.RawModule(code=_SOURCE).get_function("exp_update"))
    n = links.size // 9
    block = 128
    kern(((n + block - 1) // block,), (block,), (p, links, np.float64(dt), np.int64(n)))
    return links
