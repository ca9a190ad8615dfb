"""The gauge field and its basic observables, in MILC's normalization (docs/conventions.md 1.1, 2).

Layout: ``links[mu]`` is the site array of 3x3 matrices U_mu(x), shape (4, nt, nz, ny, nx, 3, 3), complex128.
Each direction is one contiguous site-major block (a GPU thread per site reads one link from each block), and x
runs fastest, as in MILC's files, so file I/O is a transpose of the first axis only.
"""
from __future__ import annotations

import numpy as np

from . import su3
from .geometry import Geometry
from .placement import Placement, implements, lookup


class GaugeField:
    def __init__(self, geom: Geometry, links):
        self.geom = geom
        self.links = links

    @property
    def xp(self):
        return self.geom.xp

    def copy(self) -> "GaugeField":
        return GaugeField(self.geom, self.links.copy())

    # constructors -------------------------------------------------------------------------------------------
    @classmethod
    def unit(cls, geom: Geometry) -> "GaugeField":
        return cls(geom, su3.identity_like((4,) + geom.shape, geom.xp))

    @classmethod
    def random(cls, geom: Geometry, rng, stream: str = "hot_start") -> "GaugeField":
        """Haar-random SU(3) links: Gram-Schmidt (MILC's reunitarization) of complex Gaussian matrices."""
        g = rng.gaussian(stream, geom.site_ids(), 4 * 18)
        m = (g[..., 0::2] + 1j * g[..., 1::2]).reshape(geom.shape + (4, 3, 3))
        return cls.from_site_major(geom, su3.reunitarize(m))

    @classmethod
    def from_site_major(cls, geom: Geometry, a) -> "GaugeField":
        """From MILC's in-file order: an array (nt, nz, ny, nx, 4, 3, 3) of this rank's sites."""
        xp = geom.xp
        return cls(geom, xp.ascontiguousarray(xp.moveaxis(xp.asarray(a, dtype=xp.complex128), 4, 0)))

    def site_major(self):
        """This rank's links in MILC's in-file order (nt, nz, ny, nx, 4, 3, 3)."""
        return self.xp.ascontiguousarray(self.xp.moveaxis(self.links, 0, 4))

    # operations ----------------------------------------------------------------------------------------------
    def reunitarize(self) -> "GaugeField":
        """MILC's reunit_su3 of every link: on a GPU one kernel (``su3_cuda.reunitarize``), else the twin
        ``su3.reunitarize``."""
        self.links = lookup("gauge.reunitarize", self.geom)(self)
        return self

    def gauge_transform(self, g) -> "GaugeField":
        """U_mu(x) -> g(x) U_mu(x) g(x+mu)^dag for a site field g of SU(3) matrices."""
        out = self.xp.empty_like(self.links)
        for mu in range(4):
            out[mu] = g @ self.links[mu] @ su3.dagger(self.geom.shift(g, mu, +1))
        return GaugeField(self.geom, out)


def plaquette_field(u: GaugeField, mu: int, nu: int):
    """ReTr of the mu-nu plaquette U_mu(x) U_nu(x+mu) U_mu(x+nu)^dag U_nu(x)^dag at every site."""
    geom, l = u.geom, u.links
    p = l[mu] @ geom.shift(l[nu], mu, +1) @ su3.dagger(geom.shift(l[mu], nu, +1)) @ su3.dagger(l[nu])
    return su3.retrace(p)


def plaquette(u: GaugeField) -> tuple[float, float]:
    """MILC's (ss, st) plaquette: averages of ReTr P (maximum 3) over spatial and over temporal planes. On one GPU
    a kernel serves it (force.gauge_action registers ``gauge.plaquette`` there: ~0.3 s a call at 32^4 by the
    array operations below); the twin is :func:`plaquette_array`."""
    return lookup("gauge.plaquette", u.geom)(u)


@implements("gauge.plaquette", Placement.ARRAY)
def plaquette_array(u: GaugeField) -> tuple[float, float]:
    """:func:`plaquette` by array operations: each plane's ReTr P summed exactly (``Geometry.sum``)."""
    geom = u.geom
    ss = sum(geom.sum(plaquette_field(u, mu, nu)) for mu in range(3) for nu in range(mu + 1, 3))
    st = sum(geom.sum(plaquette_field(u, mu, 3)) for mu in range(3))
    return ss / (3 * geom.volume), st / (3 * geom.volume)


@implements("gauge.reunitarize", Placement.ARRAY)
def _reunitarize_array(u: GaugeField):
    return su3.reunitarize(u.links)


@implements("gauge.reunitarize", Placement.WHOLE, Placement.DISTRIBUTED)
def _reunitarize_kernel(u: GaugeField):
    from . import su3_cuda        # a site-local kernel (double2 links): any rank's local links

    if u.links.dtype != np.complex128:
        return su3.reunitarize(u.links)
    return su3_cuda.reunitarize(u.geom.backend, u.links)


def polyakov_loop(u: GaugeField) -> complex:
    """MILC's P_LOOP: the average over spatial sites of Tr prod_t U_t (not divided by 3). With t split over ranks
    the product continues from rank to rank in t order (ProcessGrid.chain): bitwise the single-process product."""
    geom, xp, be = u.geom, u.xp, u.geom.backend
    lt = u.links[3]

    def local_product(acc):
        p = lt[0] if acc is None else xp.asarray(acc) @ lt[0]
        for t in range(1, geom.shape[0]):
            p = p @ lt[t]
        return be.to_numpy(p)

    p = geom.grid.chain(3, local_product)
    tr = su3.trace(xp.asarray(p)) if p is not None else xp.zeros(geom.shape[1:], dtype=xp.complex128)
    total = geom.sum(tr)
    return total / (geom.volume // geom.dims[3])


def link_trace(u: GaugeField) -> float:
    """MILC's LINKTR: <ReTr U>/3 over all links."""
    return u.geom.sum(su3.retrace(u.links)) / (3.0 * 4 * u.geom.volume)


def random_gauge_transformation(geom: Geometry, rng, stream: str = "gauge_transform"):
    """A Haar-random SU(3) matrix at every site."""
    g = rng.gaussian(stream, geom.site_ids(), 18)
    return su3.reunitarize((g[..., 0::2] + 1j * g[..., 1::2]).reshape(geom.shape + (3, 3)))
