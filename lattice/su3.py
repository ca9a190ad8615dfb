"""SU(3) and su(3) algebra on batches of 3x3 complex matrices (trailing two axes), for NumPy and CuPy alike.

Conventions are MILC's (docs/conventions.md 3.3, 3.4): momenta are traceless anti-Hermitian, P = (i/sqrt2) sum_a w_a
lambda_a with Gell-Mann matrices lambda_a, so that 1/2 Tr(P^dag P) = 1/2 sum_a w_a^2.
"""
from __future__ import annotations

import numpy as np

from .backend import array_module


def dagger(a):
    return a.conj().swapaxes(-1, -2)


def mul(a, b):
    return a @ b


def mul_na(a, b):
    """a b^dag."""
    return a @ dagger(b)


def mul_an(a, b):
    """a^dag b."""
    return dagger(a) @ b


def trace(a):
    return a.diagonal(axis1=-2, axis2=-1).sum(-1)


def retrace(a):
    return trace(a).real


def identity_like(shape, xp=np, dtype=np.complex128):
    out = xp.zeros(tuple(shape) + (3, 3), dtype=dtype)
    idx = xp.arange(3)
    out[..., idx, idx] = 1
    return out


def traceless_antihermitian(m):
    """TA(M) = (M - M^dag)/2 - Tr(M - M^dag)/6, MILC's ``make_anti_hermitian`` projection."""
    xp = array_module(m)
    a = 0.5 * (m - dagger(m))
    tr = trace(a) / 3.0
    idx = xp.arange(3)
    a[..., idx, idx] -= tr[..., None]
    return a


def gell_mann(xp=np):
    """The eight Gell-Mann matrices, shape (8, 3, 3)."""
    lam = np.zeros((8, 3, 3), dtype=np.complex128)
    lam[0, 0, 1] = lam[0, 1, 0] = 1
    lam[1, 0, 1], lam[1, 1, 0] = -1j, 1j
    lam[2, 0, 0], lam[2, 1, 1] = 1, -1
    lam[3, 0, 2] = lam[3, 2, 0] = 1
    lam[4, 0, 2], lam[4, 2, 0] = -1j, 1j
    lam[5, 1, 2] = lam[5, 2, 1] = 1
    lam[6, 1, 2], lam[6, 2, 1] = -1j, 1j
    lam[7] = np.diag([1, 1, -2]) / np.sqrt(3)
    return xp.asarray(lam)


def algebra_from_coefficients(w):
    """P = (i/sqrt2) sum_a w[..., a] lambda_a: a traceless anti-Hermitian matrix for each row of ``w``.

    With w ~ N(0,1) this is MILC's Gaussian momentum distribution (``rand_ahmat``): off-diagonal elements are
    complex Gaussians with <|z|^2> = 1.
    """
    xp = array_module(w)
    lam = gell_mann(xp)
    return (1j / np.sqrt(2.0)) * xp.tensordot(w, lam, axes=([-1], [0]))


def algebra_coefficients(p):
    """Inverse of :func:`algebra_from_coefficients`: w_a = -i sqrt2 Tr(P lambda_a)/2 (real)."""
    xp = array_module(p)
    lam = gell_mann(xp)
    tr = xp.einsum("...ij,aji->...a", p, lam)
    return (-1j * np.sqrt(2.0) / 2.0 * tr).real


def _taylor_exp(a, order=12):
    xp = array_module(a)
    out = identity_like(a.shape[:-2], xp, a.dtype)
    term = out.copy()
    for n in range(1, order + 1):
        term = term @ a / n
        out = out + term
    return out


def expm_su3(a):
    """exp(A) for traceless anti-Hermitian A, exactly, by the Cayley-Hamilton method.

    Morningstar & Peardon, PRD 69 (2004) 054501, eqs. (19)-(34): with Q = -iA Hermitian and traceless,
    exp(iQ) = f0 + f1 Q + f2 Q^2, where f_j follow from c0 = det Q, c1 = Tr Q^2 / 2. The formulas lose no accuracy
    as Q -> 0 (errors in f1, f2 are multiplied by Q and Q^2); only Q = 0 itself needs the series.
    """
    xp = array_module(a)
    q = -1j * a
    q2 = q @ q
    c0 = trace(q @ q2).real / 3.0
    c1 = trace(q2).real / 2.0
    tiny = c1 < 1e-12
    c1s = xp.where(tiny, 1.0, c1)
    sign = xp.where(c0 < 0, -1.0, 1.0)
    c0a = xp.abs(c0)
    c0max = 2.0 * (c1s / 3.0) ** 1.5
    theta = xp.arccos(xp.clip(c0a / c0max, -1.0, 1.0))
    u = xp.sqrt(c1s / 3.0) * xp.cos(theta / 3.0)
    w = xp.sqrt(c1s) * xp.sin(theta / 3.0)
    w2 = w * w
    xi0 = xp.where(xp.abs(w) < 0.05, 1.0 - w2 / 6.0 * (1.0 - w2 / 20.0 * (1.0 - w2 / 42.0)),
                   xp.sin(w) / xp.where(w == 0, 1.0, w))
    e2iu = xp.exp(2j * u)
    emiu = xp.exp(-1j * u)
    cosw = xp.cos(w)
    u2 = u * u
    h0 = (u2 - w2) * e2iu + emiu * (8.0 * u2 * cosw + 2j * u * (3.0 * u2 + w2) * xi0)
    h1 = 2.0 * u * e2iu - emiu * (2.0 * u * cosw - 1j * (3.0 * u2 - w2) * xi0)
    h2 = e2iu - emiu * (cosw + 3j * u * xi0)
    den = 9.0 * u2 - w2
    f0, f1, f2 = h0 / den, h1 / den, h2 / den
    # c0 < 0: f_j(-c0) = (-1)^j conj(f_j(c0))
    neg = sign < 0
    f0 = xp.where(neg, f0.conj(), f0)
    f1 = xp.where(neg, -f1.conj(), f1)
    f2 = xp.where(neg, f2.conj(), f2)
    idx = xp.arange(3)
    out = f1[..., None, None] * q + f2[..., None, None] * q2
    out[..., idx, idx] += f0[..., None]
    if bool(xp.any(tiny)):
        out = xp.where(tiny[..., None, None], _taylor_exp(a), out)
    return out


def exp_update(links, p, dt: float, backend=None, expm=None):
    """links <- expm(dt P) links: MILC's link update, with the exact exponential (``expm`` None or
    :func:`expm_su3`) or MILC's 8th-order series (:func:`expm_taylor`). On a GPU each is one fused CUDA kernel
    (:mod:`lattice.su3_cuda`) whose twin is the line below."""
    taylor = expm is expm_taylor
    if expm is not None and expm is not expm_su3 and not taylor:
        raise ValueError("exp_update knows expm_su3 and expm_taylor: apply another exponential as expm(dt * p) @ links")
    if backend is not None and backend.is_gpu:
        from . import su3_cuda

        if taylor:
            return su3_cuda.taylor_update(backend, p, links, dt)
        return su3_cuda.exp_update(backend, p, links, dt)
    return (expm_taylor if taylor else expm_su3)(dt * p) @ links


def expm_taylor(a, order=8):
    """MILC's link-update exponential (``update_u.c``): the Taylor series to ``order``."""
    return _taylor_exp(a, order)


def reunitarize(u):
    """MILC's ``reunit_su3`` (generic/reunitarize2.c): normalize row 0, Gram-Schmidt row 1,
    row 2 = conj(row0 x row1). The result is in SU(3)."""
    xp = array_module(u)
    r0 = u[..., 0, :]
    r1 = u[..., 1, :]
    r0 = r0 / xp.sqrt((r0.conj() * r0).real.sum(-1))[..., None]
    r1 = r1 - (r0.conj() * r1).sum(-1)[..., None] * r0
    r1 = r1 / xp.sqrt((r1.conj() * r1).real.sum(-1))[..., None]
    r2 = xp.cross(r0, r1).conj()
    return xp.stack([r0, r1, r2], axis=-2)


def unitarity_violation(u):
    """max |U U^dag - 1| and max |det U - 1| over the batch."""
    xp = array_module(u)
    eye = identity_like((), xp, u.dtype)
    d1 = float(xp.abs(u @ dagger(u) - eye).max())
    d2 = float(xp.abs(xp.linalg.det(u) - 1).max())
    return max(d1, d2)
