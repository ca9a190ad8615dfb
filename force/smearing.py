"""Asqtad-type link smearing F[U; c1, c3, c5, c7, cL] and the Naik term (docs/conventions.md 1.3, 1.4).

The two-sided staple operator, for nu != +-mu and any matrix field A living on mu-links:

    S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu)

and the smeared ("fat") link

    F_mu = (c1 - 6 cL) U_mu + sum_{nu != mu} { c3 S_nu[U_mu] + cL S_nu[S_nu[U_mu]]
             + sum_{rho != mu,nu} ( c5 S_rho[S_nu[U_mu]] + sum_{sigma != mu,nu,rho} c7 S_sigma[S_rho[S_nu[U_mu]]] ) }

with nu, rho, sigma running over unsigned directions (both orientations are inside S): 6 paths of length 3, 24 of
length 5, 48 of length 7 and 6 Lepage paths. S_nu[S_nu[U]] also holds, for each nu, two retraced paths
U_nu U_nu^dag U_mu (and the backward twin) that equal U_mu for unitary links; "-6 cL" removes them, as QUDA's
host reference does (``tests/utils/llfat_utils.cpp``: one_link = c[0] - 6 c[5]). MILC's path table lists the
genuine Lepage paths instead; the two are identical for unitary links (U, and the U(3) projection W).

Coefficients are given in the *unphased* ("physical") sign convention: smear the links with the staggered phases
removed and multiply the result by the phases afterwards (:mod:`force.phases`). MILC's printed "path
coefficients" apply to phased links; they differ by the sign of the 3- and 7-staples, whose phase products are
-eta_mu(x) (:meth:`PathCoefficients.milc_signed`).

Evaluation. S is linear in A, so the sum is evaluated from the inside out (Horner form),

    F_mu = (c1 - 6cL) U_mu + sum_nu S_nu[ c3 U_mu + cL A_nu + sum_{rho} S_rho[ c5 U_mu + c7 A_sigma(nu,rho) ] ],
    A_nu = S_nu[U_mu],

where sigma(nu, rho) is the one direction left; the inner and outer sums cover the same ordered direction
triples as the formula above. Per direction mu that is 3 + 6 + 3 = 12 staple operators (4 matrix products each)
instead of the 18 of the outside-in nesting of MILC/QUDA's fat7 (which recompute the 3-staple inside every
5-staple branch); the 7-staple sum costs nothing beyond the 5-staple one. Shifted links U_nu(x+mu) and their
adjoints are computed once per (nu, mu).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from lattice import su3
from lattice.placement import Placement, implements, lookup

from . import hisq_cuda, hisq_staged  # noqa: F401  (register the kernels that lookup() chooses on a GPU)


@dataclass(frozen=True)
class PathCoefficients:
    """Coefficients of the asqtad/HISQ path table, unphased sign convention (docs/conventions.md 1.3)."""

    one_link: float
    naik: float = 0.0
    three_staple: float = 0.0
    five_staple: float = 0.0
    seven_staple: float = 0.0
    lepage: float = 0.0

    def __add__(self, other: "PathCoefficients") -> "PathCoefficients":
        return PathCoefficients(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __mul__(self, s: float) -> "PathCoefficients":
        return PathCoefficients(*(s * getattr(self, f.name) for f in fields(self)))

    __rmul__ = __mul__

    def as_tuple(self) -> tuple:
        """(one_link, naik, three_staple, five_staple, seven_staple, lepage): MILC's path-table order."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def milc_signed(self) -> tuple:
        """The coefficients MILC prints and applies to *phased* links ("path coefficients", same order as
        :meth:`as_tuple`): the 3- and 7-staples change sign because their phase product is -eta_mu(x)."""
        c = self.as_tuple()
        return (c[0], c[1], -c[2], c[3], -c[4], c[5])

    def free_field_value(self) -> float:
        """F_mu for unit links: c1 + 6 c3 + 24 c5 + 48 c7 + 6 cL (the Naik term is not part of F)."""
        return self.one_link + 6 * self.three_staple + 24 * self.five_staple + 48 * self.seven_staple \
            + 6 * self.lepage


#: HISQ level 1, V = F[U; FAT7] (``hisq_u3_action.h``, first path table; MILC prints 0.125, -0.0625, 0.015625,
#: -0.002604167 for its phased links).
FAT7 = PathCoefficients(one_link=1 / 8, three_staple=1 / 16, five_staple=1 / 64, seven_staple=1 / 384)

#: HISQ level 2 on W for epsilon = 0 ("Fat7 + 2xLepage"): one-link 1 = 1/8 + 2*3/8 + 1/8, Naik -1/24, Lepage -1/8.
HISQ_LEVEL2 = PathCoefficients(one_link=1.0, naik=-1 / 24, three_staple=1 / 16, five_staple=1 / 64,
                               seven_staple=1 / 384, lepage=-1 / 8)

#: The epsilon (charm) correction table p3 ("1-link + Naik"): X_eps = X_0 + eps X_p3, built on W.
HISQ_EPS_CORRECTION = PathCoefficients(one_link=1 / 8, naik=-1 / 24)


def hisq_level2_coefficients(eps: float = 0.0) -> PathCoefficients:
    """HISQ level 2 with the Naik epsilon: one-link 1 + eps/8, Naik -(1+eps)/24, the rest as for eps = 0."""
    return HISQ_LEVEL2 + float(eps) * HISQ_EPS_CORRECTION


def asqtad_coefficients(u0: float) -> PathCoefficients:
    """MILC's tadpole-improved asqtad coefficients (``generic_ks/imp_actions/asqtad_action.h``, scaled in
    ``ks_action_paths.c: make_path_table`` by 1/u0 per link beyond the first, ``TADPOLE_IMPROVE``):

    one-link 1/8 + 6/16 + 1/8 = 5/8, Naik -1/(24 u0^2), 3-staple 1/(16 u0^2) (MILC: -1/16 for phased links),
    5-staple 1/(64 u0^4), 7-staple 1/(384 u0^6) (MILC: -1/384), Lepage -1/(16 u0^4)."""
    u0 = float(u0)
    if not u0 > 0:
        raise ValueError(f"u0 = {u0} must be positive")
    return PathCoefficients(one_link=5 / 8, naik=-1 / (24 * u0 ** 2), three_staple=1 / (16 * u0 ** 2),
                            five_staple=1 / (64 * u0 ** 4), seven_staple=1 / (384 * u0 ** 6),
                            lepage=-1 / (16 * u0 ** 4))


class StapleOperator:
    """S_nu[A]_mu for one link field, with the shifted links U_nu(x+mu) and adjoints cached per (nu, mu)."""

    def __init__(self, geom, links):
        self.geom = geom
        self.links = links
        self._dag = {}
        self._fwd = {}

    def _u_dag(self, nu):
        m = self._dag.get(nu)
        if m is None:
            m = self._dag[nu] = su3.dagger(self.links[nu])
        return m

    def _u_shifted(self, nu, mu):
        """(U_nu(x+mu), U_nu(x+mu)^dag)."""
        key = (nu, mu)
        m = self._fwd.get(key)
        if m is None:
            s = self.geom.shift(self.links[nu], mu, +1)
            m = self._fwd[key] = (s, su3.dagger(s))
        return m

    def __call__(self, nu: int, mu: int, a):
        """U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu)."""
        if nu == mu:
            raise ValueError("the staple direction nu must differ from the link direction mu")
        geom = self.geom
        u_mu_shift, u_mu_shift_dag = self._u_shifted(nu, mu)
        up = self.links[nu] @ geom.shift(a, nu, +1) @ u_mu_shift_dag
        down = self._u_dag(nu) @ a @ u_mu_shift
        return up + geom.shift(down, nu, -1)


def fat_link(geom, links, c: PathCoefficients, keep: dict | None = None):
    """F[U; c1, c3, c5, c7, cL] for all four directions: an array like ``links`` (4, nt, nz, ny, nx, 3, 3).

    ``links`` are unphased (phases removed); the Naik coefficient of ``c`` is ignored (see :func:`naik_link`).
    On one GPU this is :func:`force.hisq_staged.fat_link` (three launches over all directions) or
    :func:`force.hisq_cuda.fat_link` (same sums, one kernel per staple); on GPUs sharing a partitioned lattice the
    per-staple kernels run on links halo-padded by :func:`force.hisq_cuda.fat_depth` sites
    (:func:`force.hisq_cuda.pad`: one exchange per partitioned dimension instead of the staples' shifts).
    ``keep``: a dict into which an implementation whose chain rule can reuse its intermediates puts them
    (``keep[c]``: the staged kernels, :class:`force.hisq_staged.Kept`); give it to
    :func:`force.smearing_derivative.fat_link_vjp` of the same links as ``kept``. The others leave it alone."""
    return lookup("hisq.fat_link", geom, c=c)(geom, links, c, keep)


@implements("hisq.fat_link", Placement.ARRAY)
def _fat_link_array(geom, links, c: PathCoefficients, keep=None):
    xp = geom.xp
    s = StapleOperator(geom, links)
    out = xp.empty_like(links)
    c1, c3, c5, c7, cl = c.one_link, c.three_staple, c.five_staple, c.seven_staple, c.lepage
    for mu in range(4):
        u = links[mu]
        others = [d for d in range(4) if d != mu]
        acc = (c1 - 6.0 * cl) * u
        need_a = c7 != 0.0 or cl != 0.0
        a = {nu: s(nu, mu, u) for nu in others} if need_a else {}
        for nu in others:
            inner = c3 * u
            if cl != 0.0:
                inner = inner + cl * a[nu]
            if c5 != 0.0 or c7 != 0.0:
                for rho in others:
                    if rho == nu:
                        continue
                    (sigma,) = [d for d in others if d not in (nu, rho)]
                    arg = c5 * u
                    if c7 != 0.0:
                        arg = arg + c7 * a[sigma]
                    inner = inner + s(rho, mu, arg)
            if c3 != 0.0 or cl != 0.0 or c5 != 0.0 or c7 != 0.0:
                acc = acc + s(nu, mu, inner)
        out[mu] = acc
    return out


def naik_link(geom, links, coeff: float):
    """coeff * U_mu(x) U_mu(x+mu) U_mu(x+2mu) for all four directions (unphased); one kernel on one GPU, on links
    halo-padded by 2 (:func:`force.hisq_cuda.naik_depth`) on a partitioned lattice of GPUs."""
    return lookup("hisq.naik_link", geom)(geom, links, coeff)


@implements("hisq.naik_link", Placement.ARRAY)
def _naik_link_array(geom, links, coeff: float):
    xp = geom.xp
    out = xp.empty_like(links)
    for mu in range(4):
        u = links[mu]
        two = u @ geom.shift(u, mu, +1)
        out[mu] = coeff * (two @ geom.shift(u, mu, +2))
    return out


def smear(geom, links, c: PathCoefficients, keep: dict | None = None):
    """(fat, long) = (F[U; c], c.naik U U U), both unphased. On a partitioned lattice of GPUs the links are
    halo-padded once, to the deeper of the two levels' depths, for both kernels. ``keep``: as for :func:`fat_link`."""
    return lookup("hisq.smear", geom, c=c)(geom, links, c, keep)


@implements("hisq.smear", Placement.ARRAY)
def _smear_apart(geom, links, c: PathCoefficients, keep=None):
    """Each level on its own (each choosing its kernel)."""
    return fat_link(geom, links, c, keep), naik_link(geom, links, c.naik)
