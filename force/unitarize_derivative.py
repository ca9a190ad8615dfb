"""Derivative of the U(3) projection W = V (V^dag V)^(-1/2), with MILC's HISQ force filter (docs/conventions.md 1.5).

This is the chain-rule step of MILC's ``u3_unit_der_analytic`` (``generic_ks/su3_mat_op.c``), which builds the
tensors dW/dV and dW^dag/dV from Q^(-1/2) = f0 + f1 Q + f2 Q^2 and the derivatives of f_i with respect to the
invariants of Q. Here the same derivative is computed in reverse mode from the eigen-decomposition of Q
(Daleckii-Krein), which is exact, vectorized (``xp.linalg.eigh`` is batched in NumPy and CuPy) and stable for
(nearly) degenerate eigenvalues:

    Q = V^dag V = E diag(g) E^dag,  s_k = sqrt(g_k),  K = Q^(-1/2) = E diag(1/s) E^dag,
    d K = E [ (E^dag dQ E) o Gamma ] E^dag,   Gamma_ij = (g_i^-1/2 - g_j^-1/2)/(g_i - g_j) = -1 / (s_i s_j (s_i + s_j))

(the divided difference of g^-1/2 in closed form: no cancellation, and Gamma_ii = -1/(2 s_i^3), the derivative,
is its limit). With link derivatives (delta S = Re Tr[delta W D_W], see :mod:`force.smearing_derivative`):

    H = D_W V,   D_Q = E [ Gamma o (E^dag H E) ] E^dag,   D_V = K D_W + (D_Q + D_Q^dag) V^dag.

The derivative is that of the map V -> V (V^dag V)^(-1/2) for every invertible V, so it does not matter whether
the forward W came from the analytic formula or from MILC's SVD fallback (W = A B^dag is the same polar factor).

Force filter (``-DHISQ_FORCE_FILTER=5.0e-5``): at every matrix whose smallest eigenvalue of Q is below the filter,
MILC adds the filter to all eigenvalues g_k and to Q (and Q^2) *in the derivative only*; everything downstream
(f_i, Q^(-1/2), the b_ij = df_i/dc_j and the building blocks of dW/dV) uses the shifted Q. That is exactly the
derivative, at V, of the regularized map V -> V (V^dag V + filter)^(-1/2): here g_k -> g_k + filter in K and in
Gamma, the eigenvectors being unchanged. The force is then no longer the derivative of the action. The filter is
decided per matrix on the eigenvalues from ``eigh`` (MILC uses its trigonometric ones, or sigma^2 after an SVD;
they agree to rounding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lattice import su3
from lattice.backend import array_module, backend_of
from lattice.placement import Placement, implements, local_placement, lookup

from . import hisq_cuda as _cuda

#: MILC's ``HISQ_FORCE_FILTER`` of the HISQ RHMC builds (``ks_imp_rhmc/Make_template``).
FORCE_FILTER = 5.0e-5


@dataclass
class FilterInfo:
    """n_filtered: how many matrices had the filter applied; n: how many matrices; min_eigenvalue: the smallest
    eigenvalue of V^dag V (before the filter); mask: boolean array over the matrices, True where filtered (None when
    the filter is off)."""

    n_filtered: int
    n: int
    min_eigenvalue: float
    mask: object = field(default=None, repr=False)


def u3_unitarize_vjp(v, d_w, force_filter: float | None = FORCE_FILTER, config=None):
    """(D_V, FilterInfo): the link derivative with respect to V of S(W(V)), W = V (V^dag V)^(-1/2), given D_W.

    ``v``, ``d_w``: arrays of 3x3 matrices with the same leading shape. ``force_filter``: MILC's filter threshold
    (5e-5); None or 0 gives the exact derivative everywhere (module docstring). ``config``: the run configuration
    that allows the kernel (:func:`force.hisq_cuda.enabled`)."""
    return lookup("hisq.u3_unitarize_vjp", local_placement(v), config)(v, d_w, force_filter)


@implements("hisq.u3_unitarize_vjp", Placement.WHOLE, switch=_cuda.SWITCH)
def _u3_unitarize_vjp_gpu(v, d_w, force_filter):
    """All of it per link in one kernel (:func:`force.hisq_cuda.u3_vjp`)."""
    d_v, mask, gmin = _cuda.u3_vjp(backend_of(v), v, d_w, force_filter)
    n = int(math.prod(v.shape[:-2]))
    return d_v, FilterInfo(n_filtered=int(mask.sum()) if force_filter else 0, n=n,
                           min_eigenvalue=float(gmin.min()) if n else math.inf,
                           mask=mask if force_filter else None)


@implements("hisq.u3_unitarize_vjp", Placement.ARRAY)
def _u3_unitarize_vjp_array(v, d_w, force_filter):
    xp = array_module(v)
    vd = su3.dagger(v)
    g, e = xp.linalg.eigh(vd @ v)
    gmin = g.min(axis=-1)
    mask = None
    n_filtered = 0
    if force_filter:
        mask = gmin < force_filter
        n_filtered = int(mask.sum())
        if n_filtered:
            g = g + xp.where(mask, force_filter, 0.0)[..., None]
    s = xp.sqrt(g)
    ed = su3.dagger(e)
    k = (e * (1.0 / s)[..., None, :]) @ ed
    gamma = -1.0 / (s[..., :, None] * s[..., None, :] * (s[..., :, None] + s[..., None, :]))
    h = ed @ (d_w @ v) @ e
    d_q = e @ (gamma * h) @ ed
    d_v = k @ d_w + (d_q + su3.dagger(d_q)) @ vd
    n = int(math.prod(v.shape[:-2]))
    info = FilterInfo(n_filtered=n_filtered, n=n, min_eigenvalue=float(gmin.min()) if n else math.inf, mask=mask)
    return d_v, info


def u3_unitarize_regularized(v, delta: float):
    """V (V^dag V + delta)^(-1/2) by eigen-decomposition: the map whose exact derivative the filtered derivative is
    (reference for tests; delta = 0 gives W itself)."""
    xp = array_module(v)
    g, e = xp.linalg.eigh(su3.dagger(v) @ v)
    return v @ ((e * (1.0 / xp.sqrt(g + delta))[..., None, :]) @ su3.dagger(e))


def su3_projection_vjp(y, d_w):
    """D_Y for S(W(Y)) with W = Y c, c = det(Y)^(-1/3) (:func:`force.unitarize.su3_project`), given D_W (delta S =
    Re Tr[delta W D_W]). c is holomorphic in Y off the branch cut, dc = -(c/3) Tr(Y^-1 dY), hence

        D_Y = c [D_W - (1/3) Tr(Y D_W) Y^-1],

    MILC's ``su3_unit_der_spec`` (dW/dY = c [dY - (1/3) Tr(Y^-1 dY) Y]) in reverse mode; Y^-1 = Y^dag for the
    unitary Y of the HISQ chain, as MILC takes it."""
    from .unitarize import su3_project

    _, c = su3_project(y)
    yinv = su3.dagger(y)
    tr = su3.trace(y @ d_w)
    return c[..., None, None] * (d_w - (tr / 3.0)[..., None, None] * yinv)
