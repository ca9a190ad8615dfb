"""Conjugate momenta: MILC's Gaussian distribution and kinetic energy (docs/conventions.md 3.3)."""
from __future__ import annotations

from lattice import su3


def random_momenta(geom, rng, stream: str = "momenta"):
    """P_mu(x) = (i/sqrt2) sum_a w_a lambda_a, w_a ~ N(0,1), drawn per global site (8 per direction)."""
    xp = geom.xp
    w = rng.gaussian(stream, geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    return xp.ascontiguousarray(xp.moveaxis(su3.algebra_from_coefficients(w), -3, 0))


def kinetic_energy(geom, p) -> float:
    """MILC's ``hmom_action``: h = sum_{x,mu} [1/2 Tr(P^dag P) - 4]; the -4 (1/2 per real degree of freedom)
    only keeps the number small."""
    half_tr = 0.5 * (p.real * p.real + p.imag * p.imag).sum(axis=(-1, -2))
    return geom.sum(half_tr - 4.0)
