"""Reverse-mode derivatives (adjoints) of the asqtad-type smearing and of the Naik term (:mod:`force.smearing`).

Convention: a *link derivative* of a real function S of a matrix field M_mu(x) is the field D_M with

    delta S = sum_{x,mu} Re Tr[ delta M_mu(x) D_M mu(x) ]          for every complex variation delta M.

It is the adjoint of the complex gradient G = dS/dRe M + i dS/dIm M (D_M = G^dag), and it is the form of the
fermion-force "outer products" (docs/conventions.md 3.4: D_fat = 2 sum_l res_l eps(x) Z_l(x+mu) Z_l(x)^dag). The
rules used everywhere below: for M = A B, D_A = B D_M and D_B = D_M A; for M = A^dag, D_A = D_M^dag; for
M(x) = A(x+nu), D_A(x) = D_M(x-nu). For gauge links, Pdot = TA[U G^dag] = TA[U D_U].

Each function here is the exact derivative of the corresponding forward function of :mod:`force.smearing`, for
arbitrary complex (not necessarily unitary) link fields, including the dependence through the staple links.

The staple operator S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu) is
linear in A and depends on the links U_nu. Given D_T for T = S_nu[A]_mu, its adjoint returns

    D_A(x)   = U_nu(x-nu+mu)^dag D_T(x-nu) U_nu(x-nu) + U_nu(x+mu) D_T(x+nu) U_nu(x)^dag

and adds to the link derivative of U_nu

    D_U_nu(x)     += A(x+nu) U_nu(x+mu)^dag D_T(x) + [A(x) U_nu(x+mu) D_T(x+nu)]^dag
    D_U_nu(x+mu)  += [D_T(x) U_nu(x) A(x+nu)]^dag + D_T(x+nu) U_nu(x)^dag A(x)

(10 matrix products against 4 for the forward application). The link contributions are collected in buckets by
(direction, shift) and shifted once at the end, as :meth:`force.gauge_action.GaugeAction.loop_derivative` does.

:func:`fat_link_vjp` reverses the nested (Horner) evaluation of :func:`force.smearing.fat_link` step by step:

    forward (per mu):   a_nu = S_nu[U_mu];  arg_{nu,rho} = c5 U_mu + c7 a_sigma;
                        inner_nu = c3 U_mu + cL a_nu + sum_rho S_rho[arg_{nu,rho}];
                        F_mu = (c1 - 6 cL) U_mu + sum_nu S_nu[inner_nu]
    reverse:            D_inner_nu = S_nu^T D_F;  D_arg = S_rho^T D_inner_nu;  D_a_nu = cL D_inner_nu + c7 sum D_arg;
                        D_U_mu += (c1 - 6cL) D_F + c3 D_inner + c5 D_arg + S_nu^T D_a_nu

storing a_nu, arg and inner of the forward pass: 12 adjoint staples per direction, like the forward's 12 staples.
"""
from __future__ import annotations

from lattice import su3
from lattice.placement import Placement, implements, lookup

from . import hisq_cuda  # noqa: F401  (registers the kernels that lookup() chooses on a GPU)
from . import hisq_staged_vjp  # noqa: F401  (the staged chain rule, ahead of hisq_cuda's on one GPU)
from .smearing import PathCoefficients, StapleOperator


def _acc(bucket: dict, key, value):
    if key in bucket:
        bucket[key] += value
    else:
        bucket[key] = value


class StapleAdjoint(StapleOperator):
    """The staple operator S_nu[A]_mu for one link field (forward: :class:`force.smearing.StapleOperator`, whose
    cached U_nu^dag and U_nu(x+mu) it shares) and its adjoint with respect to both arguments (:meth:`vjp`): D_A is
    returned, the link derivative of U_nu is accumulated and handed out by :meth:`link_derivative`."""

    def __init__(self, geom, links):
        super().__init__(geom, links)
        self._direct = {}       # nu -> sum of contributions to D_U_nu(x)
        self._direct_dag = {}   # nu -> sum of [contributions]^dag to D_U_nu(x)
        self._shift = {}        # (nu, mu) -> contributions to D_U_nu(x+mu), kept at x
        self._shift_dag = {}    # (nu, mu) -> their adjoints

    def vjp(self, nu: int, mu: int, a, d_t):
        """D_A for T = S_nu[A]_mu given D_T (module docstring); the U_nu part is accumulated internally."""
        if nu == mu:
            raise ValueError("the staple direction nu must differ from the link direction mu")
        geom = self.geom
        u = self.links[nu]
        ud = self._u_dag(nu)
        us, usd = self._u_shifted(nu, mu)
        a_up = geom.shift(a, nu, +1)
        d_up = geom.shift(d_t, nu, +1)
        q1 = d_t @ u            # D_T(x) U_nu(x)
        r2 = d_up @ ud          # D_T(x+nu) U_nu(x)^dag
        d_a = geom.shift(usd @ q1, nu, -1) + us @ r2
        _acc(self._direct, nu, a_up @ (usd @ d_t))
        _acc(self._direct_dag, nu, a @ (us @ d_up))
        _acc(self._shift, (nu, mu), r2 @ a)
        _acc(self._shift_dag, (nu, mu), q1 @ a_up)
        return d_a

    def link_derivative(self, out=None):
        """Add the accumulated link derivative of the staple links to ``out`` (a field like ``links``; a new zero
        field when None) and return it; the buckets are emptied."""
        geom, xp = self.geom, self.geom.xp
        if out is None:
            out = xp.zeros_like(self.links)
        for nu, m in self._direct.items():
            out[nu] += m
        for nu, m in self._direct_dag.items():
            out[nu] += su3.dagger(m)
        keys = set(self._shift) | set(self._shift_dag)
        for nu, mu in keys:
            m = self._shift.get((nu, mu))
            md = self._shift_dag.get((nu, mu))
            if md is not None:
                md = su3.dagger(md)
                m = md if m is None else m + md
            out[nu] += geom.shift(m, mu, -1)
        self._direct, self._direct_dag, self._shift, self._shift_dag = {}, {}, {}, {}
        return out


def fat_link_vjp(geom, links, c: PathCoefficients, d_fat, kept: dict | None = None):
    """The link derivative of S through F[U; c] = :func:`force.smearing.fat_link`: given D_F (like ``links``),
    return D_U with delta S = sum Re Tr[delta F D_F] = sum Re Tr[delta U D_U] (the Naik coefficient of ``c`` is
    ignored, as in the forward function). Exact for any complex link field. On one GPU this is
    :func:`force.hisq_cuda.fat_link_vjp` (the same reverse pass, one kernel per adjoint staple), or with
    ``hisq_staged_vjp`` on, :func:`force.hisq_staged_vjp.fat_link_vjp` (five launches over all directions); on
    GPUs sharing a partitioned lattice the per-direction kernels run on links and D_F halo-padded by
    :data:`force.hisq_cuda.VJP_DEPTH`. ``kept``: the ``keep`` dict of :func:`force.smearing.fat_link` of the same
    links, whose intermediates the staged kernels then reuse (the others ignore it); the result is the same."""
    return lookup("hisq.fat_link_vjp", geom, c=c)(geom, links, c, d_fat, kept)


@implements("hisq.fat_link_vjp", Placement.ARRAY)
def _fat_link_vjp_array(geom, links, c: PathCoefficients, d_fat, kept=None):
    xp = geom.xp
    s = StapleAdjoint(geom, links)
    out = xp.zeros_like(links)
    c1, c3, c5, c7, cl = c.one_link, c.three_staple, c.five_staple, c.seven_staple, c.lepage
    need_a = c7 != 0.0 or cl != 0.0
    need_rho = c5 != 0.0 or c7 != 0.0
    any_staple = c3 != 0.0 or cl != 0.0 or c5 != 0.0 or c7 != 0.0
    for mu in range(4):
        u = links[mu]
        others = [d for d in range(4) if d != mu]
        # forward pass, keeping the intermediates
        a = {nu: s(nu, mu, u) for nu in others} if need_a else {}
        args, inners = {}, {}
        if any_staple:
            for nu in others:
                inner = c3 * u
                if cl != 0.0:
                    inner = inner + cl * a[nu]
                if need_rho:
                    for rho in others:
                        if rho == nu:
                            continue
                        (sigma,) = [d for d in others if d not in (nu, rho)]
                        arg = c5 * u
                        if c7 != 0.0:
                            arg = arg + c7 * a[sigma]
                        args[(nu, rho)] = arg
                        inner = inner + s(rho, mu, arg)
                inners[nu] = inner
        # reverse pass
        d_f = d_fat[mu]
        d_u = (c1 - 6.0 * cl) * d_f
        d_a = {}
        if any_staple:
            for nu in others:
                d_inner = s.vjp(nu, mu, inners[nu], d_f)
                d_u = d_u + c3 * d_inner
                if cl != 0.0:
                    _acc(d_a, nu, cl * d_inner)
                if need_rho:
                    for rho in others:
                        if rho == nu:
                            continue
                        (sigma,) = [d for d in others if d not in (nu, rho)]
                        d_arg = s.vjp(rho, mu, args[(nu, rho)], d_inner)
                        d_u = d_u + c5 * d_arg
                        if c7 != 0.0:
                            _acc(d_a, sigma, c7 * d_arg)
        for nu, d in d_a.items():
            d_u = d_u + s.vjp(nu, mu, u, d)
        out[mu] += d_u
    return s.link_derivative(out)


def naik_link_vjp(geom, links, coeff: float, d_long):
    """The link derivative through L_mu(x) = coeff U_mu(x) U_mu(x+mu) U_mu(x+2mu) (:func:`force.smearing.naik_link`):

        D_U_mu(x) += coeff [ U1 U2 D(x) ](x) + coeff [ U2 D U0 ](x-mu) + coeff [ D U0 U1 ](x-2mu),

    with Uk = U_mu(x+k mu), D = D_L mu(x). One kernel on one GPU, on links halo-padded by 2 on a partitioned one."""
    return lookup("hisq.naik_link_vjp", geom)(geom, links, coeff, d_long)


@implements("hisq.naik_link_vjp", Placement.ARRAY)
def _naik_link_vjp_array(geom, links, coeff: float, d_long):
    xp = geom.xp
    out = xp.zeros_like(links)
    for mu in range(4):
        w0 = links[mu]
        w1 = geom.shift(w0, mu, +1)
        w2 = geom.shift(w0, mu, +2)
        d = coeff * d_long[mu]
        out[mu] = (w1 @ w2) @ d + geom.shift(w2 @ (d @ w0), mu, -1) + geom.shift(d @ (w0 @ w1), mu, -2)
    return out


def smear_vjp(geom, links, c: PathCoefficients, d_fat, d_long):
    """The link derivative through (fat, long) = :func:`force.smearing.smear` (both unphased)."""
    return fat_link_vjp(geom, links, c, d_fat) + naik_link_vjp(geom, links, c.naik, d_long)
