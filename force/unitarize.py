"""U(3) projection W = V (V^dag V)^(-1/2), MILC's ``u3_unitarize_analytic`` (docs/conventions.md 1.5).

Source: ``generic_ks/su3_mat_op.c: u3_unitarize_analytic`` (double precision, ``-DHISQ_REUNIT_ALLOW_SVD
-DHISQ_REUNIT_SVD_REL_ERROR=1e-8 -DHISQ_REUNIT_SVD_ABS_ERROR=1e-8`` from ``ks_imp_rhmc/Make_template``), after
Hasenfratz, Hoffmann, Schaefer, JHEP 05 (2007) 029:

1. Q = V^dag V; c0 = Tr Q, c1 = Tr Q^2 / 2, c2 = Tr Q^3 / 3.
2. S = c1/3 - c0^2/18. If |S| < 1e-14 (``U3_UNIT_ANALYTIC_EPS``, double), g0 = g1 = g2 = c0/3.
3. Otherwise R = c2/2 - c0 c1/3 + c0^3/27, theta = acos(R / S^(3/2)) (theta = 0 if R > 0 and pi otherwise when
   |R/S^(3/2)| >= 1), and g_k = c0/3 + 2 sqrt(S) cos(theta/3 + 2 pi k/3), k = 0, 1, 2: the eigenvalues of Q.
4. u = sum sqrt(g_k), v = sum_{i<j} sqrt(g_i g_j), w = prod sqrt(g_k), den = w (u v - w);
   f0 = (u v^2 - w (u^2 + v))/den, f1 = (2 u v - w - u^3)/den, f2 = u/den; Q^(-1/2) = f0 + f1 Q + f2 Q^2.
5. SVD fallback, per site: when |det V|^2 < svd_abs_error, or (|det V|^2 != 0 and)
   | |det V|^2 - g0 g1 g2 | / |det V|^2 > svd_rel_error, V = A Sigma B^dag and W = A B^dag.

The result is in U(3), not SU(3) (no division by det^(1/3)). Everything is vectorized over the leading (site)
axes with the array module of the input (NumPy or CuPy); the fallback sites are selected with a mask and
replaced by masked assignment, the others keep the analytic result bit for bit. One safety condition is added to
MILC's: a site whose analytic eigenvalues are not all positive and finite also goes to the SVD (MILC would
produce NaN there; it cannot happen when MILC's own conditions pass).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lattice import su3
from lattice.backend import array_module, backend_of
from lattice.placement import Placement, implements, local_placement, lookup

from . import hisq_cuda as _cuda

#: ``U3_UNIT_ANALYTIC_EPS`` in double precision (``include/su3_mat_op.h``).
ANALYTIC_EPS = 1e-14
#: ``HISQ_REUNIT_SVD_REL_ERROR`` and ``HISQ_REUNIT_SVD_ABS_ERROR`` of MILC's HISQ builds.
SVD_REL_ERROR = 1e-8
SVD_ABS_ERROR = 1e-8


@dataclass
class UnitarizeInfo:
    """Diagnostics of one projection (over the matrices given, i.e. this rank's sites).

    n_svd: how many matrices took the SVD fallback; n: how many matrices were projected; min_eigenvalue: the
    smallest eigenvalue of V^dag V (the analytic g_k, or sigma^2 where the SVD was used) — the HISQ force filter
    (5e-5) acts only when it falls below that; svd_mask: boolean array over the sites, True where the SVD was
    used."""

    n_svd: int
    n: int
    min_eigenvalue: float
    svd_mask: object = field(default=None, repr=False)


def det3(m):
    """Determinant of each 3x3 matrix, by cofactors along row 0 (as MILC's ``det_check``)."""
    a1 = m[..., 1, 1] * m[..., 2, 2] - m[..., 1, 2] * m[..., 2, 1]
    a2 = m[..., 1, 0] * m[..., 2, 2] - m[..., 1, 2] * m[..., 2, 0]
    a3 = m[..., 1, 0] * m[..., 2, 1] - m[..., 1, 1] * m[..., 2, 0]
    return m[..., 0, 0] * a1 - m[..., 0, 1] * a2 + m[..., 0, 2] * a3


def eigenvalues_analytic(q, analytic_eps: float = ANALYTIC_EPS):
    """The eigenvalues (g0, g1, g2) of Hermitian 3x3 matrices Q by MILC's trigonometric formula, and (Q^2).

    Returns (g, q2) with g of shape q.shape[:-2] + (3,)."""
    xp = array_module(q)
    q2 = q @ q
    c0 = su3.trace(q).real
    c1 = su3.trace(q2).real / 2
    c2 = (q2 * q.swapaxes(-1, -2)).real.sum(axis=(-2, -1)) / 3  # Tr(Q^2 Q) / 3
    s = c1 / 3 - c0 * (c0 / 18)
    degenerate = xp.abs(s) < analytic_eps
    s_safe = xp.where(degenerate, 1.0, xp.abs(s))
    r = c2 / 2 - c0 * (c1 / 3) + c0 * c0 * (c0 / 27)
    sq = xp.sqrt(s_safe)
    ros = r / (sq * sq * sq)
    inside = xp.abs(ros) < 1.0
    theta = xp.where(inside, xp.arccos(xp.where(inside, ros, 0.0)), xp.where(r > 0, 0.0, math.pi))
    theta3 = theta / 3
    pi23 = 2 * math.pi / 3
    g = xp.stack([c0 / 3 + 2 * sq * xp.cos(theta3 + k * pi23) for k in range(3)], axis=-1)
    g = xp.where(degenerate[..., None], (c0 / 3)[..., None], g)
    return g, q2


def u3_unitarize(v, *, allow_svd: bool = True, svd_rel_error: float = SVD_REL_ERROR,
                 svd_abs_error: float = SVD_ABS_ERROR, analytic_eps: float = ANALYTIC_EPS, config=None):
    """W = V (V^dag V)^(-1/2) for every 3x3 matrix of ``v`` (any leading shape): (W, UnitarizeInfo).

    MILC's ``u3_unitarize_analytic`` with its SVD fallback (module docstring). ``allow_svd=False`` gives the
    analytic formula everywhere (MILC without ``HISQ_REUNIT_ALLOW_SVD``). On a GPU the analytic part is one
    kernel per link (:func:`force.hisq_cuda.u3_unitarize`), the fallback links the same masked SVD, where ``config``
    (the run configuration, :func:`force.hisq_cuda.enabled`) allows it."""
    return lookup("hisq.u3_unitarize", local_placement(v), config)(v, allow_svd, svd_rel_error, svd_abs_error,
                                                                    analytic_eps)


@implements("hisq.u3_unitarize", Placement.ARRAY)
def _u3_unitarize_array(v, allow_svd, svd_rel_error, svd_abs_error, analytic_eps):
    xp = array_module(v)
    q = su3.dagger(v) @ v
    g, q2 = eigenvalues_analytic(q, analytic_eps)

    use_svd = None
    if allow_svd:
        det = det3(v)
        det_check = (det.real * det.real + det.imag * det.imag)
        prod = g[..., 0] * g[..., 1] * g[..., 2]
        nonzero = det_check != 0
        rel = xp.abs(det_check - prod) / xp.where(nonzero, det_check, 1.0)
        use_svd = (nonzero & (rel > svd_rel_error)) | (det_check < svd_abs_error)
        use_svd = use_svd | ~xp.all(xp.isfinite(g) & (g > 0), axis=-1)
        g_safe = xp.where(use_svd[..., None], 1.0, g)
    else:
        g_safe = g

    gs = xp.sqrt(g_safe)
    us = gs[..., 1] + gs[..., 2]
    ws = gs[..., 1] * gs[..., 2]
    vs = gs[..., 0] * us + ws
    us = us + gs[..., 0]
    ws = ws * gs[..., 0]
    den = ws * (us * vs - ws)
    f0 = (us * vs * vs - ws * (us * us + vs)) / den
    f1 = (2 * us * vs - ws - us * us * us) / den
    f2 = us / den
    qinv = f1[..., None, None] * q + f2[..., None, None] * q2
    idx = xp.arange(3)
    qinv[..., idx, idx] += f0[..., None]
    w = v @ qinv

    gmin = g.min(axis=-1)
    n_svd = 0
    if use_svd is not None:
        n_svd = int(use_svd.sum())
        if n_svd:
            a, sigma, bh = xp.linalg.svd(v[use_svd])
            w[use_svd] = a @ bh
            gmin = gmin.copy()
            gmin[use_svd] = (sigma * sigma).min(axis=-1)
    n = int(math.prod(v.shape[:-2]))
    info = UnitarizeInfo(n_svd=n_svd, n=n, min_eigenvalue=float(gmin.min()) if n else math.inf,
                         svd_mask=use_svd)
    return w, info


@implements("hisq.u3_unitarize", Placement.WHOLE, switch=_cuda.SWITCH)
def _u3_unitarize_gpu(v, allow_svd, svd_rel_error, svd_abs_error, analytic_eps):
    """:func:`u3_unitarize` with the analytic formula and the fallback test in one CUDA kernel."""
    be = backend_of(v)
    xp = be.xp
    w, use_svd, gmin = _cuda.u3_unitarize(be, v, allow_svd, svd_rel_error, svd_abs_error, analytic_eps)
    w = w.reshape(v.shape)
    n_svd = int(use_svd.sum()) if allow_svd else 0
    if n_svd:
        a, sigma, bh = xp.linalg.svd(v[use_svd])
        w[use_svd] = a @ bh
        gmin[use_svd] = (sigma * sigma).min(axis=-1)
    n = int(math.prod(v.shape[:-2]))
    return w, UnitarizeInfo(n_svd=n_svd, n=n, min_eigenvalue=float(gmin.min()) if n else math.inf,
                            svd_mask=use_svd if allow_svd else None)


def u3_project_svd(v):
    """W = A B^dag from V = A Sigma B^dag for every matrix (the fallback alone; reference and tests)."""
    xp = array_module(v)
    a, _, bh = xp.linalg.svd(v)
    return a @ bh


UNITARIZATION_GROUPS = ("u3", "su3")


def su3_project(y):
    """W = Y det(Y)^(-1/3) for every 3x3 matrix of ``y`` (any leading shape), the cube root on the principal branch
    (arg det / 3 in (-pi/3, pi/3]): MILC's ``su3_spec_unitarize`` (``generic_ks/su3_mat_op.c``), which the HISQ
    builds with ``UNITARIZATION_GROUP UNITARIZE_SU3`` (``hisq/hisq_su3_action.h``: su3_rhmc_hisq_su3) apply to the
    U(3)-projected fat7 link Y before the second smearing level. Returns (W, c) with c = det(Y)^(-1/3)."""
    xp = array_module(y)
    det = det3(y)
    c = xp.exp(-xp.log(xp.abs(det)) / 3.0 - 1j * xp.angle(det) / 3.0)
    return y * c[..., None, None], c
