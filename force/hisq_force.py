"""HISQ and asqtad fermion force: the chain rule from the phased fat/long links to the gauge momenta
(docs/conventions.md 1.3-1.5, 3.4; MILC ``fn_fermion_force_multi_hisq_wrapper_mx_cpu``, ``fermion_force_hisq_multi.c``).

Inputs: the outer products
--------------------------
For each Naik epsilon group e, complex fields ``fat_outer[e]`` and ``long_outer[e]``, laid out like the links
(4, nt, nz, ny, nx, 3, 3), define the variation of the action through the *phased* links of that group
(:func:`force.hisq_links.hisq_links_multi`, MILC's ``rephase(ON)`` picture, BC signs included):

    delta S = sum_e sum_{x,mu} Re Tr[ delta fat^e_mu(x) fat_outer[e]_mu(x) + delta long^e_mu(x) long_outer[e]_mu(x) ].

This is docs/conventions.md 3.4's level-0 force, so for the MD action of an RHMC pseudofermion term
``fat_outer[e]_mu(x) = 2 sum_l res_l eps(x) Z_l(x+mu) Z_l(x)^dag`` and ``long_outer[e]_mu(x) = 2 sum_l res_l eps(x)
Z_l(x+3mu) Z_l(x)^dag`` (summed over the terms of that epsilon). In other words an outer product is the *link
derivative* D_M (delta S = Re Tr[delta M D_M]) of the phased link M, i.e. the adjoint of the complex gradient
G_M = dS/dRe M + i dS/dIm M (:mod:`force.smearing_derivative`).

Output: the momentum derivative
-------------------------------
    Pdot_mu(x) = TA[U_mu(x) G_mu(x)^dag] = TA[U_mu(x) D_U mu(x)],   G = dS/dRe U + i dS/dIm U,

the convention of :mod:`force.gauge_action`: along U -> exp(tau Omega) U, dS/dtau = sum_{x,mu} Tr(Pdot Omega).

The chain (HISQ)
----------------
Forward (:mod:`force.hisq_links`): V = F[U; FAT7], W = V (V^dag V)^(-1/2), X_0 = F[W; HISQ_LEVEL2],
L_0 = -1/24 W W W; for group e: fat^e = eta (X_0 + e W/8), long^e = eta_long (1+e) L_0 (eta, eta_long = +-1 KS
phases with BC signs, :mod:`force.phases`). Reverse:

0. phases: D_X^e = eta fat_outer[e], D_L^e = eta_long long_outer[e] (fold eta into the outer products first);
1. level 2, per epsilon group with that group's coefficients (one-link 1 + e/8, Naik -(1+e)/24, rest as e = 0),
   summed. F[W; c] is linear in the coefficients and the p3 table only changes the one-link and Naik terms, so the
   sum is evaluated as D_W = F^T[W; HISQ_LEVEL2](sum_e D_X^e) + (1/8) sum_e e D_X^e + N^T[W; -1/24](sum_e (1+e) D_L^e)
   (one smearing adjoint for all groups; N is the Naik product; the long links are built from W);
2. U(3) projection: D_V from D_W (:func:`force.unitarize_derivative.u3_unitarize_vjp`), with MILC's force filter
   (5e-5) where the smallest eigenvalue of V^dag V is below it; with the SU(3) group (W = Y det(Y)^(-1/3), Y the
   U(3) projection) first D_Y from D_W (:func:`force.unitarize_derivative.su3_projection_vjp`, MILC's
   ``su3_unit_der_spec``), then D_V from D_Y;
3. level 1: D_U = F^T[U; FAT7](D_V) (:func:`force.smearing_derivative.fat_link_vjp`, reverse of the nested staple
   evaluation, both the smeared argument and the staple links);
4. Pdot = TA(U D_U).

Steps 1 and 3 differentiate the smearing as :mod:`force.smearing` computes it: with the Lepage term in the
"S_nu[S_nu[U]] - 6 cL U" form, whose derivative at a unitary W differs from that of MILC's genuine Lepage paths by
terms along non-unitary directions only. D_W therefore differs from MILC's level-2 force in those directions, but
D_V and the momenta do not: W(V) is unitary for every V, so its variations are tangent to U(3), where the two
forms agree identically (likewise U -> exp(tau Omega) U for asqtad).

Asqtad: fat = eta F[U; asqtad(u0)], long = eta_long (-1/(24 u0^2)) U U U; D_U = F^T(eta fat_outer) +
N^T(eta_long long_outer); Pdot = TA(U D_U).

Checks (tests/force/test_hisq_force.py): every step and the full chain against central differences of the
forward code (relative agreement ~1e-10 for Pdot on smooth 4^4 fields and MILC's 6^4 HISQ lattice); the asqtad
force reproduces MILC's ``check_fermion_force`` answer (colormatrix.mom.sample.l8) to its single-precision
storage, with fat_outer_mu(x) = 2 eps(x) Z(x+mu) Z(x)^dag and long_outer_mu(x) = 2 eps(x) Z(x+3mu) Z(x)^dag.
Cost: about 2 s for the HISQ force on 8^4 with NumPy (two smearing adjoints of 48 adjoint staples each).

Everything runs on ``geom.xp`` (NumPy or CuPy) with no site loops.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lattice import su3
from lattice.gauge import GaugeField
from lattice.placement import Placement, implements, local_placement, lookup

from . import hisq_cuda  # noqa: F401  (registers the kernels that lookup() chooses on a GPU)
from . import phases as _phases
from .hisq_links import FermionLinks, _global_min, check_group, hisq_level1
from .smearing import FAT7, HISQ_EPS_CORRECTION, HISQ_LEVEL2, asqtad_coefficients
from .smearing_derivative import fat_link_vjp, naik_link_vjp
from .unitarize_derivative import FORCE_FILTER, FilterInfo, su3_projection_vjp, u3_unitarize_vjp


@dataclass
class HisqForceTerms:
    """The HISQ chain rule, step by step. All link derivatives (D_M: delta S = sum Re Tr[delta M D_M]) are of the
    *unphased* fields and laid out like the links.

    d_w: with respect to W (step 1; includes the eps W/8 one-link term and the Naik term);
    d_v: with respect to V (step 2, after the force filter); d_u: with respect to U (step 3);
    pdot: TA(U d_u), the momentum derivative; filter: what the force filter did (FilterInfo)."""

    d_w: object
    d_v: object
    d_u: object
    pdot: object
    filter: FilterInfo


def _as_groups(outer) -> dict:
    """{eps: field} from a mapping or a single field (eps = 0)."""
    if outer is None:
        return {}
    if isinstance(outer, Mapping):
        return {float(k): v for k, v in outer.items()}
    return {0.0: outer}


def _summed(xp, like, terms):
    acc = None
    for w, f in terms:
        if w == 0.0:
            continue
        acc = w * f if acc is None else acc + w * f
    return xp.zeros_like(like) if acc is None else acc


def momentum_derivative(links, d_u, config=None):
    """Pdot_mu(x) = TA[U_mu(x) D_U mu(x)] (= TA[U G^dag]) for a link derivative D_U (``config``: the run
    configuration that allows the kernel, :func:`force.hisq_cuda.enabled`)."""
    return lookup("hisq.ta_product", local_placement(links), config)(links, d_u)


@implements("hisq.ta_product", Placement.ARRAY)
def _momentum_derivative_array(links, d_u):
    return su3.traceless_antihermitian(links @ d_u)


def add_outer_products(geom, zs, coeffs, fat_acc, long_acc):
    """fat_acc_mu(x) += sum_l c_l z_l(x+mu) z_l(x)^dag and long_acc_mu(x) += sum_l c_l z_l(x+3mu) z_l(x)^dag, in
    place: the outer products of a pseudofermion's MD force (``hmc/rhmc.py``; z_l = X_l on even sites and
    D_oe X_l on odd ones, c_l = 2 res_l; the eps(x) factor is applied afterwards). ``zs``: the colour-vector fields
    (nt, nz, ny, nx, 3); ``coeffs``: the real c_l. One CUDA kernel on one GPU (:func:`force.hisq_cuda.outer_acc`),
    after one halo padding of the vectors on a partitioned lattice of GPUs."""
    lookup("hisq.outer_products", geom, coeffs=coeffs)(geom, zs, coeffs, fat_acc, long_acc)


@implements("hisq.outer_products", Placement.ARRAY)
def _add_outer_products_array(geom, zs, coeffs, fat_acc, long_acc):
    xp = geom.xp
    z = xp.stack(zs, axis=-1)                                               # (nt, nz, ny, nx, 3, n)
    zc = xp.swapaxes(z.conj() * xp.asarray(coeffs), -1, -2)                 # (..., n, 3)
    for mu in range(4):
        fat_acc[mu] += geom.shift(z, mu, 1) @ zc
        long_acc[mu] += geom.shift(z, mu, 3) @ zc


def hisq_level2_vjp(geom, w, fat_outer, long_outer, time_bc: str = "antiperiodic", kept: dict | None = None):
    """Steps 0-1: the link derivative D_W of S with respect to the (unphased) W, from the outer products of the
    phased links of every epsilon group (``fat_outer``, ``long_outer``: {eps: field} or one field for eps = 0).
    ``kept``: the smearing's intermediates (:attr:`force.hisq_links.FermionLinks.kept`) for the chain rule."""
    xp = geom.xp
    fat_g = _as_groups(fat_outer)
    long_g = _as_groups(long_outer)
    d_w = xp.zeros_like(w)
    if fat_g:
        eta = _phases.staggered_phases(geom, time_bc)
        d_x0 = _summed(xp, w, [(1.0, f) for f in fat_g.values()])
        d_w += fat_link_vjp(geom, w, HISQ_LEVEL2, _phases.apply_phases(d_x0, eta), kept)
        if any(e != 0.0 for e in fat_g):
            d_x1 = _summed(xp, w, [(e, f) for e, f in fat_g.items()])
            d_w += HISQ_EPS_CORRECTION.one_link * _phases.apply_phases(d_x1, eta)
    if long_g:
        eta_long = _phases.naik_phases(geom, time_bc)
        d_l0 = _summed(xp, w, [(1.0 + e, f) for e, f in long_g.items()])
        d_w += naik_link_vjp(geom, w, HISQ_LEVEL2.naik, _phases.apply_phases(d_l0, eta_long))
    return d_w


def hisq_force_terms(u: GaugeField, fat_outer, long_outer, time_bc: str = "antiperiodic", *,
                     force_filter: float | None = FORCE_FILTER, links: FermionLinks | None = None,
                     group: str = "u3", **unitarize_options) -> HisqForceTerms:
    """The HISQ fermion force with its intermediates (module docstring).

    u: the unphased gauge field; fat_outer, long_outer: {eps: outer-product field} (or one field for eps = 0);
    force_filter: MILC's 5e-5 (None: exact derivative everywhere); links: FermionLinks of ``u`` (any epsilon)
    whose V, Y and W are reused instead of recomputing level 1 (they fix the group), and whose kept smearing
    intermediates the two chain rules reuse (the same values; docs/perf-notes.md "Kept forward intermediates");
    ``group`` (u3 or su3) and ``unitarize_options`` go to :func:`force.hisq_links.hisq_level1` otherwise."""
    _phases.check_time_bc(time_bc)
    check_group(group)
    geom = u.geom
    kept = None
    if links is not None and links.V is not None and links.W is not None:
        v, w, kept = links.V, links.W, links.kept
        y = links.Y if links.Y is not None else w
        group = "u3" if links.Y is None else "su3"
    else:
        v, y, w, _ = hisq_level1(u, group=group, **unitarize_options)
    d_w = hisq_level2_vjp(geom, w, fat_outer, long_outer, time_bc, kept)
    d_y = d_w if group == "u3" else su3_projection_vjp(y, d_w)
    d_v, info = u3_unitarize_vjp(v, d_y, force_filter, config=geom.config)
    info.n_filtered = int(geom.grid.sum(info.n_filtered))
    info.n = int(geom.grid.sum(info.n))
    info.min_eigenvalue = _global_min(geom, info.min_eigenvalue)
    d_u = fat_link_vjp(geom, u.links, FAT7, d_v, kept)
    return HisqForceTerms(d_w=d_w, d_v=d_v, d_u=d_u, pdot=momentum_derivative(u.links, d_u, geom.config),
                          filter=info)


def hisq_force(u: GaugeField, fat_outer, long_outer, time_bc: str = "antiperiodic", *,
               force_filter: float | None = FORCE_FILTER, links: FermionLinks | None = None, group: str = "u3"):
    """Pdot_mu(x) = TA[U G^dag], shape (4, nt, nz, ny, nx, 3, 3), for
    delta S = sum_e sum Re Tr[delta fat^e fat_outer[e] + delta long^e long_outer[e]] (module docstring)."""
    return hisq_force_terms(u, fat_outer, long_outer, time_bc, force_filter=force_filter, links=links,
                            group=group).pdot


def asqtad_link_derivative(u: GaugeField, u0: float, fat_outer, long_outer, time_bc: str = "antiperiodic"):
    """D_U for delta S = sum Re Tr[delta fat fat_outer + delta long long_outer] through the asqtad links
    (:func:`force.hisq_links.asqtad_links`). The outer products may be given as one field or as {0.0: field}."""
    _phases.check_time_bc(time_bc)
    geom, xp = u.geom, u.xp
    fat_g = _as_groups(fat_outer)
    long_g = _as_groups(long_outer)
    if any(e != 0.0 for e in list(fat_g) + list(long_g)):
        raise ValueError("asqtad links have no Naik epsilon: give the outer products for eps = 0 only")
    c = asqtad_coefficients(u0)
    d_u = xp.zeros_like(u.links)
    if fat_g:
        d_x = _summed(xp, u.links, [(1.0, f) for f in fat_g.values()])
        d_u += fat_link_vjp(geom, u.links, c, _phases.apply_phases(d_x, _phases.staggered_phases(geom, time_bc)))
    if long_g:
        d_l = _summed(xp, u.links, [(1.0, f) for f in long_g.values()])
        d_u += naik_link_vjp(geom, u.links, c.naik, _phases.apply_phases(d_l, _phases.naik_phases(geom, time_bc)))
    return d_u


def asqtad_force(u: GaugeField, u0: float, fat_outer, long_outer, time_bc: str = "antiperiodic"):
    """Pdot = TA[U G^dag] for the asqtad links with MILC's tadpole-improved coefficients (u0)."""
    return momentum_derivative(u.links, asqtad_link_derivative(u, u0, fat_outer, long_outer, time_bc), u.geom.config)
