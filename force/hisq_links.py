"""HISQ and asqtad fermion links: fat and long (Naik) links with MILC's phases and BCs folded in
(docs/conventions.md 1.2-1.5).

HISQ (``generic_ks/imp_actions/hisq/hisq_u3_action.h``, ``fermion_links_hisq_load_milc.c: load_hisq_fn_links``;
Follana et al., PRD 75 054502), from the unphased gauge links U:

* level 1 (fat7):      V = F[U; c1=1/8, c3=1/16, c5=1/64, c7=1/384, cL=0]             (:data:`smearing.FAT7`)
* U(3) projection:     W = V (V^dag V)^(-1/2)                                          (:func:`unitarize.u3_unitarize`)
  (``group="su3"``, MILC's ``hisq/hisq_su3_action.h``, the su3_rhmc_hisq_su3 build: Y = V (V^dag V)^(-1/2), then
  W = Y det(Y)^(-1/3), :func:`unitarize.su3_project`)
* level 2, eps = 0:    X_0 = F[W; c1=1, c3=1/16, c5=1/64, c7=1/384, cL=-1/8]          (:data:`smearing.HISQ_LEVEL2`)
* epsilon (charm):     X_eps = X_0 + eps X_p3,  X_p3 = W/8  (table p3 = {one-link 1/8, Naik -1/24} on W)
* Naik, from W:        L_eps(x) = -(1+eps)/24 W_mu(x) W_mu(x+mu) W_mu(x+2mu)

Asqtad (one level, ``generic_ks/imp_actions/asqtad_action.h`` with ``TADPOLE_IMPROVE``):

* X = F[U; c1=5/8, c3=1/(16u0^2), c5=1/(64u0^4), c7=1/(384u0^6), cL=-1/(16u0^4)],
  L = -1/(24u0^2) U_mu(x) U_mu(x+mu) U_mu(x+2mu)                                (:func:`smearing.asqtad_coefficients`)

Phases (docs/conventions.md 1.3, "smear unphased links and apply the phases afterwards"): the stored fat link is
X_mu(x) eta_mu(x) and the long link L_mu(x) eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu), both with the antiperiodic
time-BC signs included (``time_bc="antiperiodic"``, MILC's default) or without them (``"periodic"``). This is
how MILC keeps them (``rephase(ON)``), and what the Dirac operator uses:

    D psi(x) = sum_mu [ fat_mu(x) psi(x+mu) - fat_mu(x-mu)^dag psi(x-mu) + long_mu(x) psi(x+3mu)
                        - long_mu(x-3mu)^dag psi(x-3mu) ].

The links are smeared with the phases removed (GaugeField.links are unphased, as everywhere in this project).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lattice.gauge import GaugeField

from . import phases as _phases
from .smearing import (FAT7, HISQ_EPS_CORRECTION, HISQ_LEVEL2, PathCoefficients, asqtad_coefficients, fat_link,
                       hisq_level2_coefficients, smear)
from .unitarize import SVD_ABS_ERROR, SVD_REL_ERROR, UNITARIZATION_GROUPS, UnitarizeInfo, su3_project, u3_unitarize


@dataclass
class FermionLinks:
    """Fat and long links of one staggered action, phases and BCs folded in (MILC's ``rephase(ON)`` picture).

    fat, long: arrays like ``GaugeField.links`` (4, nt, nz, ny, nx, 3, 3): fat_mu(x) = eta_mu(x) X_mu(x),
    long_mu(x) = eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu) L_mu(x), BC signs included.
    eta, eta_long: the phase fields (4, nt, nz, ny, nx) that were multiplied in (+-1).
    coefficients: the level-2 (HISQ) or only (asqtad) path coefficients, unphased sign convention, Naik included.
    V, W: HISQ only: the level-1 fat7 link and its U(3) projection, *unphased*, kept for the force chain rule
    (shared, not copied, between the links of several epsilons). unitarize: diagnostics of the projection.
    Y: HISQ with the SU(3) group only: the U(3) projection of V, of which W is the SU(3) projection (None when W
    is the U(3) projection itself).
    kept: HISQ only: the forward intermediates of the two smearing levels, ``{FAT7: ..., HISQ_LEVEL2: ...}``, where
    the staged kernels built them (:func:`force.smearing.fat_link`'s ``keep``; empty otherwise), shared like V and
    W; the force's chain rule of these links reuses them (:func:`force.hisq_force.hisq_force_terms`).
    """

    fat: object
    long: object
    geom: object
    action: str
    time_bc: str
    coefficients: PathCoefficients
    eta: object
    eta_long: object
    eps: float = 0.0
    u0: float | None = None
    V: object = None
    W: object = None
    unitarize: UnitarizeInfo | None = None
    extra: dict = field(default_factory=dict)
    Y: object = None
    kept: dict = field(default_factory=dict)

    def unphased_fat(self):
        """X_mu(x), the fat link with the phases and BC signs removed."""
        return _phases.apply_phases(self.fat, self.eta)

    def unphased_long(self):
        """L_mu(x), the long link with the phases and BC signs removed."""
        return _phases.apply_phases(self.long, self.eta_long)


def _global_min(geom, value: float) -> float:
    comm = geom.grid.comm
    if comm.size == 1:
        return value
    from mpi4py import MPI

    return comm.allreduce(value, op=MPI.MIN)


def check_group(group: str) -> None:
    if group not in UNITARIZATION_GROUPS:
        raise ValueError(f"unitarization group {group!r}: use u3 (MILC's hisq_u3_action.h) or su3 "
                         "(hisq_su3_action.h, the su3_rhmc_hisq_su3 build)")


def hisq_level1(u: GaugeField, *, group: str = "u3", allow_svd: bool = True, svd_rel_error: float = SVD_REL_ERROR,
                svd_abs_error: float = SVD_ABS_ERROR, keep: dict | None = None):
    """(V, Y, W, UnitarizeInfo): the fat7 link V = F[U; FAT7], its U(3) projection Y and the link W the second level
    smears: W = Y (``group="u3"``) or W = Y det(Y)^(-1/3) (``"su3"``); all unphased. The info's n_svd and
    min_eigenvalue are global (summed / minimized over ranks). ``keep``: as for :func:`force.smearing.fat_link`."""
    check_group(group)
    geom = u.geom
    v = fat_link(geom, u.links, FAT7, keep)
    y, info = u3_unitarize(v, allow_svd=allow_svd, svd_rel_error=svd_rel_error, svd_abs_error=svd_abs_error,
                           config=geom.config)
    info.n_svd = int(geom.grid.sum(info.n_svd))
    info.n = int(geom.grid.sum(info.n))
    info.min_eigenvalue = _global_min(geom, info.min_eigenvalue)
    w = y if group == "u3" else su3_project(y)[0]
    return v, y, w, info


def hisq_links_multi(u: GaugeField, eps_list=(0.0,), time_bc: str = "antiperiodic", group: str = "u3",
                     **unitarize_options) -> list[FermionLinks]:
    """HISQ links for several Naik epsilons (one per distinct epsilon of the rational functions), sharing V and W.

    Level 1 and the eps = 0 level-2 smearing are done once: X_eps = X_0 + eps W/8 and L_eps = (1+eps) L_0, as
    MILC does (``load_hisq_fn_links``: X_0 + eps X_p3). ``group``: the unitarization group, u3 or su3 (module
    docstring). ``unitarize_options``: allow_svd, svd_rel_error, svd_abs_error (see :func:`unitarize.u3_unitarize`)."""
    _phases.check_time_bc(time_bc)
    geom = u.geom
    eps_list = [float(e) for e in eps_list]
    kept = {}                              # the staged kernels' intermediates of both levels, for the force
    v, y, w, info = hisq_level1(u, group=group, keep=kept, **unitarize_options)
    x0, l0 = smear(geom, w, HISQ_LEVEL2, kept)   # L_0 = -1/24 W W W; W padded once for both on a GPU grid
    eta = _phases.staggered_phases(geom, time_bc)
    eta_long = _phases.naik_phases(geom, time_bc)
    out = []
    for eps in eps_list:
        if eps == 0.0:
            x, l = x0, l0
        else:
            x = x0 + eps * HISQ_EPS_CORRECTION.one_link * w
            l = (1.0 + eps) * l0  # -(1+eps)/24 W W W: the p3 Naik coefficient is eps * (-1/24)
        out.append(FermionLinks(fat=_phases.apply_phases(x, eta), long=_phases.apply_phases(l, eta_long),
                                geom=geom, action="hisq", time_bc=time_bc,
                                coefficients=hisq_level2_coefficients(eps), eta=eta, eta_long=eta_long, eps=eps,
                                V=v, W=w, unitarize=info, Y=None if group == "u3" else y, kept=kept))
    return out


def hisq_links(u: GaugeField, eps: float = 0.0, time_bc: str = "antiperiodic", group: str = "u3",
               **unitarize_options) -> FermionLinks:
    """HISQ fat and long links for one Naik epsilon (module docstring); ``u`` holds the unphased links.

    fat_mu(x) = eta_mu(x) [X_0 + eps W/8]_mu(x),   long_mu(x) = eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu)
    (-(1+eps)/24) W_mu(x) W_mu(x+mu) W_mu(x+2mu),  W = U(3) projection of fat7(U)."""
    return hisq_links_multi(u, [eps], time_bc, group, **unitarize_options)[0]


def asqtad_links(u: GaugeField, u0: float, time_bc: str = "antiperiodic") -> FermionLinks:
    """Asqtad fat and long links with MILC's tadpole-improved coefficients (module docstring); ``u`` unphased.

    fat_mu(x) = eta_mu(x) F[U; asqtad(u0)]_mu(x),  long_mu(x) = eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu)
    (-1/(24 u0^2)) U_mu(x) U_mu(x+mu) U_mu(x+2mu)."""
    _phases.check_time_bc(time_bc)
    geom = u.geom
    c = asqtad_coefficients(u0)
    x, l = smear(geom, u.links, c)
    eta = _phases.staggered_phases(geom, time_bc)
    eta_long = _phases.naik_phases(geom, time_bc)
    return FermionLinks(fat=_phases.apply_phases(x, eta), long=_phases.apply_phases(l, eta_long), geom=geom,
                        action="asqtad", time_bc=time_bc, coefficients=c, eta=eta, eta_long=eta_long,
                        u0=float(u0))
